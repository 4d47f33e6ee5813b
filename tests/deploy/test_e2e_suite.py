"""The kind e2e suite without a cluster: it collects, skips every test with a clear reason, and
its manifests, chart values, kind config and scripts are valid (CI cannot run the real thing)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
E2E = REPO / "e2e"


def _pytest(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args, "e2e"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_suite_collects_and_skips_cleanly_without_a_cluster() -> None:
    collected = _pytest("--collect-only", "-q")
    assert collected.returncode == 0, collected.stdout + collected.stderr
    ids = [line for line in collected.stdout.splitlines() if "::" in line]
    assert len(ids) >= 15, collected.stdout
    ran = _pytest("-q", "-rs")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    summary = ran.stdout.strip().splitlines()[-1]
    assert re.fullmatch(rf"{len(ids)} skipped in [0-9.]+s", summary), summary
    assert "e2e needs a cluster: KUBECONFIG is not set" in ran.stdout


def test_unreachable_cluster_is_a_skip_with_the_reason(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
            }
        )
    )
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    ran = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "-rs",
            "e2e/test_e2e_slices.py",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "no cluster reachable through KUBECONFIG" in ran.stdout


SPECS = sorted((E2E / "specs").glob("*.yaml"))


@pytest.mark.parametrize("spec", SPECS, ids=[p.stem for p in SPECS])
def test_spec_is_valid_for_kubernetes_1_37(rc: ModuleType, spec: Path) -> None:
    docs = [d for d in yaml.safe_load_all(spec.read_text()) if d]
    assert docs, spec
    manifests = [rc.Manifest(source=spec.name, text="", obj=d) for d in docs]
    assert rc.validate(manifests) == []
    for d in docs:
        assert "namespace" not in d["metadata"], f"{spec.name}: the suite picks the namespace"


def test_every_spec_is_used_by_a_scenario() -> None:
    code = "".join(p.read_text() for p in E2E.glob("test_*.py"))
    unused = [p.stem for p in SPECS if f'"{p.stem}"' not in code]
    assert unused == []


def test_kind_values_render_and_match_the_kind_nodes(rc: ModuleType) -> None:
    values = rc.load_values([E2E / "values-kind.yaml"])
    manifests = rc.render(values)
    assert rc.validate(manifests) == [] and rc.lint(values) == []
    kind = yaml.safe_load((E2E / "kind-config.yaml").read_text())
    workers = [n.get("labels", {}) for n in kind["nodes"] if n["role"] == "worker"]
    label = values["fakeGPU"]["nodeLabel"]
    assert sorted(w[label] for w in workers) == sorted(values["fakeGPU"]["profiles"])
    dra = [w for w in workers if "gpu.nvidia.com/mode" not in w]
    legacy = [w for w in workers if w.get("gpu.nvidia.com/mode") == "device-plugin"]
    assert len(dra) >= 2 and len(legacy) == 1
    assert kind["featureGates"]["DRAExtendedResource"] is True


@pytest.mark.parametrize("script", ["kind-up.sh", "kind-down.sh", "run.sh"])
def test_scripts_are_executable_bash(script: str) -> None:
    path = E2E / script
    assert os.access(path, os.X_OK), f"{path} is not executable"
    result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
