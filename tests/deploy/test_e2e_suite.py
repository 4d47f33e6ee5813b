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


# What the suite must cover (issue 30), each by a test whose id contains the text; e2e/run.sh
# -k <key> selects at least those.
SCENARIOS = {
    "sharing": "test_e2e_sharing.py::test_share_pair_on_one_gpu_each_sees_its_mps_limits",
    "mig": "test_e2e_mig.py::test_two_mig_profiles_on_one_gpu_are_made_and_released",
    "topology": "test_e2e_topology.py::test_best_four_gpus_next_to_a_held_gpu_as_simulate_explains",
    "health": "test_e2e_health.py::test_xid_79_taint_is_avoided_until_recovery",
    "labels": "test_e2e_labels.py::test_every_fake_node_carries_its_profiles_labels",
    "rolling": "test_e2e_lifecycle.py::test_rolling_update_keeps_claims_and_serves_new_pods",
    "restart": "test_e2e_lifecycle.py::test_agent_restart_keeps_prepared_claims",
}


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
    assert len(ids) >= 27, collected.stdout
    for scenario in SCENARIOS.values():
        assert f"e2e/{scenario}" in ids, f"{scenario} is not collected"
    ran = _pytest("-q", "-rs")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    summary = ran.stdout.strip().splitlines()[-1]
    assert re.fullmatch(rf"{len(ids)} skipped in [0-9.]+s", summary), summary
    assert "e2e needs a cluster: KUBECONFIG is not set" in ran.stdout


@pytest.mark.parametrize("key", sorted(SCENARIOS))
def test_k_selects_the_scenario(key: str) -> None:
    collected = _pytest("--collect-only", "-q", "-k", key)
    assert collected.returncode == 0, collected.stdout + collected.stderr
    assert f"e2e/{SCENARIOS[key]}" in collected.stdout.splitlines(), collected.stdout


def _unreachable_kubeconfig(tmp_path: Path) -> Path:
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
    return kubeconfig


def test_unreachable_cluster_is_a_skip_with_the_reason(tmp_path: Path) -> None:
    kubeconfig = _unreachable_kubeconfig(tmp_path)
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


def test_run_sh_against_an_existing_cluster_passes_pytest_arguments(tmp_path: Path) -> None:
    """E2E_KUBECONFIG: no kind; `-k sharing` selects the sharing scenario only."""
    env = {
        **{k: v for k, v in os.environ.items() if k != "KUBECONFIG"},
        "E2E_KUBECONFIG": str(_unreachable_kubeconfig(tmp_path)),
        "PYTHON": sys.executable,
        "PATH": "/usr/bin:/bin",  # no kind, no docker: must not be needed
    }
    ran = subprocess.run(
        ["bash", str(E2E / "run.sh"), "-k", "sharing", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "test_share_pair_on_one_gpu_each_sees_its_mps_limits SKIPPED" in ran.stdout, ran.stdout
    assert "no cluster reachable through KUBECONFIG" in ran.stdout
    summary = ran.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"=* ?1 skipped, \d+ deselected in [0-9.]+s ?=*", summary), summary


SPECS = sorted((E2E / "specs").glob("*.yaml"))


@pytest.mark.parametrize("spec", SPECS, ids=[p.stem for p in SPECS])
def test_spec_is_valid_for_kubernetes_1_37(rc: ModuleType, spec: Path) -> None:
    docs = [d for d in yaml.safe_load_all(spec.read_text()) if d]
    assert docs, spec
    manifests = [rc.Manifest(source=spec.name, text="", obj=d) for d in docs]
    assert rc.validate(manifests) == []
    for d in docs:
        assert "namespace" not in d["metadata"], f"{spec.name}: the suite picks the namespace"


@pytest.mark.parametrize("spec", SPECS, ids=[p.stem for p in SPECS])
def test_spec_pods_report_ready_and_stop_fast(spec: Path) -> None:
    """wait_running waits for the ready mark in every container's log; a one-second grace
    keeps the namespaces the suite deletes from holding GPUs (the time budget)."""
    pods = [d for d in yaml.safe_load_all(spec.read_text()) if d and d["kind"] == "Pod"]
    assert pods, f"{spec.name} has no Pod"
    for pod in pods:
        name = f"{spec.name}: {pod['metadata']['name']}"
        assert pod["spec"]["restartPolicy"] == "Never", name
        assert pod["spec"]["terminationGracePeriodSeconds"] == 1, name
        for container in pod["spec"]["containers"]:
            assert "echo E2E-READY" in " ".join(container["command"]), name


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


def _published(profile: str, shareable: str, dynamic_mig: str) -> list[dict[str, object]]:
    """The devices a kind worker's agent publishes (``dra-driver slices``, the agent's code)."""
    ran = subprocess.run(
        [
            sys.executable,
            "-m",
            "dra_driver",
            "slices",
            "--node-name",
            "n1",
            "--fake",
            profile,
            "--shareable",
            shareable,
            "--dynamic-mig",
            dynamic_mig,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    return [d for s in yaml.safe_load_all(ran.stdout) if s for d in s["spec"].get("devices") or []]


def test_kind_values_give_the_sharing_and_mig_scenarios_a_node(rc: ModuleType) -> None:
    """The kind values share the H100 NVL cards and make the DGX H100's GPUs dynamic MIG, and
    nothing else: the sharing and MIG tests run there, the others see the GPUs they expect."""
    values = rc.load_values([E2E / "values-kind.yaml"])
    plugin = values["kubeletPlugin"]
    shared, mig = {}, {}
    for profile in values["fakeGPU"]["profiles"]:
        devices = _published(profile, plugin["shareable"], plugin["dynamicMig"])
        gpus = [d for d in devices if d["attributes"]["type"]["string"] == "gpu"]
        shared[profile] = sum(bool(d.get("allowMultipleAllocations")) for d in gpus)
        mig[profile] = {
            d["attributes"]["profile"]["string"]
            for d in devices
            if d["attributes"]["type"]["string"] == "mig" and "uuid" not in d["attributes"]
        }
    assert shared == {"dgx-h100": 0, "h100-nvl-pairs": 4, "pcie-l4": 0}
    assert {"3g.40gb", "2g.20gb"} <= mig["dgx-h100"]
    assert mig["h100-nvl-pairs"] == mig["pcie-l4"] == set()
    assert plugin["shareable"].startswith("auto:") and plugin["dynamicMig"].startswith("auto:")


@pytest.mark.parametrize("script", ["kind-up.sh", "kind-down.sh", "run.sh"])
def test_scripts_are_executable_bash(script: str) -> None:
    path = E2E / script
    assert os.access(path, os.X_OK), f"{path} is not executable"
    result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_e2e_helpers_read_devices_only_from_a_complete_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``Cluster.devices()`` waits for one generation across ``resourceSliceCount`` slices
    (a half-written pool failed 6 of 18 e2e tests with GPUs read as missing)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("e2e_cluster", E2E / "cluster.py")
    assert spec is not None and spec.loader is not None
    cluster = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "e2e_cluster", cluster)  # its dataclasses look it up
    spec.loader.exec_module(cluster)

    def sl(generation: int, count: int) -> dict[str, object]:
        return {"spec": {"pool": {"generation": generation, "resourceSliceCount": count}}}

    assert cluster.complete_pool([sl(3, 2), sl(3, 2)])
    assert not cluster.complete_pool([sl(3, 2), sl(4, 2)])  # mid-rewrite
    assert not cluster.complete_pool([sl(4, 2)])  # the second slice of generation 4 not yet there
    assert not cluster.complete_pool([sl(4, 1), sl(4, 1)])  # a stale slice left over
