"""``dra-driver slices`` as a user runs it: a real subprocess, real output and exit codes."""

from __future__ import annotations

import dataclasses
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
    # One slice: the 8 GPUs, each with its set ranks; no counters.
    assert first.stdout.startswith("---\n") and len(docs) == 1
    (doc,) = docs
    assert kubernetes_validate.validate(doc, "1.37.0", strict=True)
    assert "sharedCounters" not in doc["spec"]
    gpus = doc["spec"]["devices"]
    assert [d["name"] for d in gpus] == [f"gpu-{i}" for i in range(8)]
    assert {d["attributes"]["type"]["string"] for d in gpus} == {"gpu"}
    assert {d["attributes"]["nvlinkIsland"]["string"] for d in gpus} == {"island-0"}
    assert all(d["attributes"]["setRanks"]["int"] // 1000 % 10 in (1, 2) for d in gpus)
    # The summary goes to stderr, so stdout stays what kubectl apply takes.
    assert first.stderr == (
        "node n1: 8 devices in 1 ResourceSlice (8 GPUs; set ranks for 1-7 GPUs)\n"
    )
    assert "node n1" not in first.stdout


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
    (obj,) = doc["items"]
    assert obj["spec"]["driver"] == "gpu.example.com"
    gpus = [d for d in obj["spec"]["devices"] if d["attributes"]["type"]["string"] == "gpu"]
    assert len({d["attributes"]["nvlinkIsland"]["string"] for d in gpus}) == 2
    # The bridged pairs are the ranked pairs.
    assert [d["attributes"]["setRanks"]["int"] // 10 % 10 for d in gpus] == [1, 1, 2, 2]
    assert proc.stderr.splitlines() == [
        "node n1: 4 devices in 1 ResourceSlice (4 GPUs; set ranks for 1-3 GPUs)"
    ]


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
    # 130 GPUs: 128 devices per slice, no counters; no set ranks beyond 16 GPUs.
    assert [len(d["spec"]["devices"]) for d in docs] == [128, 2]
    assert not any("sharedCounters" in d["spec"] for d in docs)
    assert "setRank" not in proc.stdout
    assert {d["spec"]["pool"]["resourceSliceCount"] for d in docs} == {2}
    assert proc.stderr == "node n1: 130 devices in 2 ResourceSlices (130 GPUs; no set ranks)\n"


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
        (doc,) = yaml.safe_load_all(proc.stdout)
        assert "sharedCounters" not in doc["spec"]
        assert kubernetes_validate.validate(doc, "1.37.0", strict=True)
        gpus = [d for d in doc["spec"]["devices"] if d["attributes"]["type"]["string"] == "gpu"]
        assert len(gpus) == 4 and all(d["allowMultipleAllocations"] for d in gpus)
        assert all("requestPolicy" in d["capacity"]["memory"] for d in gpus)
        assert not any("consumesCounters" in d for d in gpus)
        assert proc.stderr == (
            "node n1: 4 devices in 1 ResourceSlice (4 GPUs, 4 shareable; set ranks for 1-3 GPUs)\n"
        )
    plain = run("--node-name", "n1", "--fake", "pcie-l4")
    assert "allowMultipleAllocations" not in plain.stdout
    bad = run("--node-name", "n1", "--fake", "pcie-l4", "--shareable", "L4(")
    assert bad.returncode == 2
    assert "--shareable 'L4(': not none, all or a valid regular expression" in bad.stderr


def test_without_gpu_sets_one_device_per_gpu_and_no_ranks() -> None:
    """``--gpu-sets=false`` / ``GPU_SETS=false``: plain GPUs, no set ranks; a bad value is a
    usage error naming it."""
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
    assert "setRank" not in flag.stdout
    assert flag.stderr == "node n1: 8 devices in 1 ResourceSlice (8 GPUs; no set ranks)\n"
    with_ranks = run("--node-name", "n1", "--fake", "dgx-1-v100")
    (ranked,) = list(yaml.safe_load_all(with_ranks.stdout))
    # The same devices, each with setRanks (one digit per size 1..7); no set devices nor counters.
    assert [d["name"] for d in ranked["spec"]["devices"]] == [d["name"] for d in devices]
    for plain, full in zip(devices, ranked["spec"]["devices"], strict=True):
        extra = set(full["attributes"]) - set(plain["attributes"])
        assert extra == {"setRanks"}
    assert "gpu-set" not in with_ranks.stdout and "sharedCounters" not in with_ranks.stdout
    bad = run("--node-name", "n1", "--fake", "dgx-1-v100", "--gpu-sets=maybe")
    assert bad.returncode == 2 and "'maybe' is not true or false" in bad.stderr


def test_the_summary_names_mig_devices_placements_and_counter_sets() -> None:
    static = run("--node-name", "n1", "--fake", "a100-mig")
    assert static.returncode == 0, static.stderr
    assert static.stderr == "node n1: 5 devices in 1 ResourceSlice (5 MIG devices)\n"
    dynamic = run("--node-name", "n1", "--fake", "h100-mig", "--dynamic-mig", "all", "-o", "json")
    assert dynamic.returncode == 0, dynamic.stderr
    items = json.loads(dynamic.stdout)["items"]
    assert [bool(i["spec"].get("sharedCounters")) for i in items] == [True, False]
    assert dynamic.stderr == (
        "node n1: 52 devices in 2 ResourceSlices "
        "(2 GPUs, 50 dynamic MIG placements; no set ranks; 2 counter sets)\n"
    )


def test_summaries_group_slices_by_node() -> None:
    from dra_driver.cli import slices as slices_cli
    from dra_driver.devices import fake
    from dra_driver.slices import build

    node = fake.FakeBackend.from_name("pcie-l4").discover()
    both = [
        *build.build(node, node_name="a", gpu_sets=False).slices,
        *build.build(fake.FakeBackend.from_name("dgx-h100").discover(), node_name="b").slices,
    ]
    assert slices_cli.summaries(both) == [
        "node a: 4 devices in 1 ResourceSlice (4 GPUs; no set ranks)",
        "node b: 8 devices in 1 ResourceSlice (8 GPUs; set ranks for 1-7 GPUs)",
    ]
    empty = build.build(dataclasses.replace(node, gpus=()), node_name="c").slices
    assert slices_cli.summaries(empty) == ["node c: 0 devices in 1 ResourceSlice"]
    three = dataclasses.replace(node, gpus=node.gpus[:3])  # one size to rank: pairs
    assert slices_cli.summaries(build.build(three, node_name="d").slices) == [
        "node d: 3 devices in 1 ResourceSlice (3 GPUs; set ranks for 1-2 GPUs)"
    ]
