"""``e2e/kind-up.sh`` (the README's kind walkthrough) does what it says, run against fake
``docker``, ``kind`` and ``kubectl`` that record their calls: the cluster from
e2e/kind-config.yaml, the image through ``make image`` under the tag e2e/values-kind.yaml names,
loaded into kind, the chart rendered by Helm's engine (no helm binary) and applied, the agents
restarted and waited for. No cluster and no image are made: kind and an engine with network are
not here; the script's own logic and the real Makefile and chart are."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]

FAKE = """#!/bin/sh
echo "$(basename "$0") $*" >> "$CALLS"
case "$(basename "$0") $*" in
  "docker info"*) exit 0 ;;
  "kind get clusters"*) exit 0 ;;
  "kind get kubeconfig"*) echo "apiVersion: v1" ;;
  "kubectl create namespace"*) printf 'apiVersion: v1\\nkind: Namespace\\n' ;;
  "kubectl apply"*|"kubectl"*"apply"*) cat > "$CALLS.applied.$$" ;;
  "kubectl"*"get daemonset"*) echo daemonset.apps/dra-driver-kubelet-plugin ;;
esac
exit 0
"""


def _copy(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    for name in ("Makefile", "pyproject.toml"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, root / name)
    for name in ("e2e/kind-up.sh", "e2e/kind-config.yaml", "e2e/values-kind.yaml"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, root / name)
    (root / "scripts").mkdir()
    shutil.copy2(REPO / "scripts" / "render_chart.py", root / "scripts" / "render_chart.py")
    shutil.copytree(REPO / "deployments" / "helm", root / "deployments" / "helm")
    return root


def test_kind_up_builds_with_make_image_loads_renders_and_waits(tmp_path: Path) -> None:
    pytest.importorskip("helm_python", reason="Helm's engine (a dev dependency) renders the chart")
    if shutil.which("helm", path="/usr/bin:/bin"):
        pytest.skip("a helm binary on PATH: kind-up.sh would take the helm branch")
    root = _copy(tmp_path)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("docker", "kind", "kubectl"):
        (bindir / tool).write_text(FAKE, encoding="utf-8")
        (bindir / tool).chmod(0o755)
    calls = tmp_path / "calls"
    done = subprocess.run(
        ["bash", str(root / "e2e" / "kind-up.sh")],
        env={
            "PATH": f"{bindir}:/usr/bin:/bin",
            "CALLS": str(calls),
            "PYTHON": sys.executable,
            "HOME": str(tmp_path),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    log = calls.read_text().splitlines()
    names = [line.split()[0] + " " + line.split()[1] for line in log]
    create = next(line for line in log if line.startswith("kind create cluster"))
    assert "--config e2e/kind-config.yaml" in create and "--name dra-driver-e2e" in create
    build = next(line for line in log if line.startswith("docker build"))
    assert build.startswith("docker build -t dra-driver:e2e --build-arg VERSION=")
    assert "kind load docker-image dra-driver:e2e --name dra-driver-e2e" in log
    values = yaml.safe_load((root / "e2e" / "values-kind.yaml").read_text())
    assert f"{values['image']['repository']}:{values['image']['tag']}" == "dra-driver:e2e"
    # the order a user relies on: cluster, image, load, install, restart, wait
    order = [
        names.index("kind create"),
        names.index("docker build"),
        names.index("kind load"),
        max(i for i, line in enumerate(log) if "apply" in line),
        next(i for i, line in enumerate(log) if "rollout restart" in line),
        next(i for i, line in enumerate(log) if "rollout status" in line),
    ]
    assert order == sorted(order), log
    applied = [p.read_text() for p in tmp_path.glob("calls.applied.*")]
    kinds = {d["kind"] for text in applied for d in yaml.safe_load_all(text) if d}
    assert {"Namespace", "DaemonSet", "DeviceClass"} <= kinds
    daemonsets = [
        d for text in applied for d in yaml.safe_load_all(text) if d and d["kind"] == "DaemonSet"
    ]
    images = {c["image"] for d in daemonsets for c in d["spec"]["template"]["spec"]["containers"]}
    assert images == {"dra-driver:e2e"}
    assert (root / "e2e" / ".kubeconfig").read_text() == "apiVersion: v1\n"
    assert "kind-up: ready; export KUBECONFIG=" in done.stdout
