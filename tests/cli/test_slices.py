"""``dra-driver slices`` as a user runs it: a real subprocess, real output and exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import yaml


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dra_driver", "--log-format", "json", "slices", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def test_dgx_h100_prints_valid_multi_document_yaml_identically_every_time() -> None:
    first = run("--node-name", "n1", "--fake", "dgx-h100")
    second = run("--node-name", "n1", "--fake", "dgx-h100")
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout  # byte-identical across runs
    docs = list(yaml.safe_load_all(first.stdout))
    # The per-GPU counters, then 64 devices (the limit once they consume counters), then 27.
    assert first.stdout.startswith("---\n") and len(docs) == 3
    for doc in docs:
        assert kubernetes_validate.validate(doc, "1.37.0", strict=True)
    assert "sharedCounters" in docs[0]["spec"]
    devices = [d for doc in docs[1:] for d in doc["spec"]["devices"]]
    gpus = [d for d in devices if d["attributes"]["type"]["string"] == "gpu"]
    islands = {d["attributes"]["nvlinkIsland"]["string"] for d in gpus}
    assert islands == {"island-0"} and len(gpus) == 8 and len(devices) == 8 + 83


def test_nvl_pairs_two_islands_json_output_and_driver_name() -> None:
    proc = run(
        "--node-name",
        "n1",
        "--fake",
        "h100-nvl-pairs",
        "--driver-name",
        "gpu.example.com",
        "-o",
        "json",
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    counters, obj = doc["items"]
    assert counters["spec"]["driver"] == obj["spec"]["driver"] == "gpu.example.com"
    gpus = [d for d in obj["spec"]["devices"] if d["attributes"]["type"]["string"] == "gpu"]
    assert len({d["attributes"]["nvlinkIsland"]["string"] for d in gpus}) == 2


def test_large_profile_file_splits(tmp_path: Path) -> None:
    gpus = "\n".join(f'  - {{pciBusId: "0000:{i:02x}:00.0"}}' for i in range(130))
    profile = tmp_path / "big.yaml"
    profile.write_text(
        'name: big\ndriverVersion: "580.95.05"\ncudaDriverVersion: "13.0"\n'
        "defaults: {productName: X, brand: Nvidia, architecture: Hopper, "
        'cudaComputeCapability: "9.0", memory: 80Gi}\ngpus:\n' + gpus + "\n"
    )
    proc = run("--node-name", "n1", "--fake-file", str(profile))
    assert proc.returncode == 0, proc.stderr
    docs = list(yaml.safe_load_all(proc.stdout))
    # 130 GPUs: counter sets of 32 in the first slice, then 64 devices per slice (they consume
    # counters); no GPU sets beyond 16 GPUs.
    assert [len(d["spec"].get("devices", [])) for d in docs] == [0, 64, 64, 2]
    assert len(docs[0]["spec"]["sharedCounters"]) == 5
    assert {d["spec"]["pool"]["resourceSliceCount"] for d in docs} == {4}


def test_usage_errors_are_one_clear_line() -> None:
    missing = run("--fake", "dgx-h100", env={"PATH": "/usr/bin:/bin"})
    assert missing.returncode == 2 and "--node-name" in missing.stderr
    bad_node = run("--node-name", "N1", "--fake", "dgx-h100")
    assert bad_node.returncode == 2 and "'N1'" in bad_node.stderr
    unknown = run("--node-name", "n1", "--fake", "no-such-profile")
    assert unknown.returncode == 2 and "no-such-profile" in unknown.stderr


def test_shareable_flag_and_its_environment_twin() -> None:
    import os

    by_flag = run("--node-name", "n1", "--fake", "pcie-l4", "--shareable", "L4")
    by_env = run("--node-name", "n1", "--fake", "pcie-l4", env={**os.environ, "SHAREABLE": "all"})
    for proc in (by_flag, by_env):
        assert proc.returncode == 0, proc.stderr
        counters, doc = yaml.safe_load_all(proc.stdout)
        assert counters["spec"]["sharedCounters"][0]["name"] == "gpus"
        assert kubernetes_validate.validate(doc, "1.37.0", strict=True)
        gpus = [d for d in doc["spec"]["devices"] if d["attributes"]["type"]["string"] == "gpu"]
        assert len(gpus) == 4 and all(d["allowMultipleAllocations"] for d in gpus)
        assert all("requestPolicy" in d["capacity"]["memory"] for d in gpus)
        assert all(d["consumesCounters"] for d in gpus)
    plain = run("--node-name", "n1", "--fake", "pcie-l4")
    assert "allowMultipleAllocations" not in plain.stdout
    bad = run("--node-name", "n1", "--fake", "pcie-l4", "--shareable", "L4(")
    assert bad.returncode == 2
    assert "--shareable 'L4(': not none, all or a valid regular expression" in bad.stderr


def test_without_gpu_sets_one_device_per_gpu_and_no_counters() -> None:
    """``--gpu-sets=false`` / ``GPU_SETS=false``: what an API server without partitionable
    devices can allocate safely; a bad value is a usage error naming it."""
    import os

    flag = run("--node-name", "n1", "--fake", "dgx-1-v100", "--gpu-sets=false")
    env = run("--node-name", "n1", "--fake", "dgx-1-v100", env={**os.environ, "GPU_SETS": "false"})
    assert flag.returncode == env.returncode == 0, flag.stderr + env.stderr
    assert flag.stdout == env.stdout
    (doc,) = list(yaml.safe_load_all(flag.stdout))
    assert kubernetes_validate.validate(doc, "1.37.0", strict=True)
    assert "sharedCounters" not in doc["spec"]
    devices = doc["spec"]["devices"]
    assert len(devices) == 8 and not any("consumesCounters" in d for d in devices)
    assert {d["attributes"]["type"]["string"] for d in devices} == {"gpu"}
    with_sets = run("--node-name", "n1", "--fake", "dgx-1-v100")
    assert "gpu-set" in with_sets.stdout and "sharedCounters" in with_sets.stdout
    bad = run("--node-name", "n1", "--fake", "dgx-1-v100", "--gpu-sets=maybe")
    assert bad.returncode == 2 and "'maybe' is not true or false" in bad.stderr
