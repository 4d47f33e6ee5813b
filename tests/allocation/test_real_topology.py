"""What a real kube-scheduler (v1.36.2) picked on our slices, and what our claims get instead.

``../shared/reference/real-topology-allocations.json`` holds 40 cases: a fake profile, the GPUs
already taken, a claim (``count: N``, with or without ``matchAttribute`` on the NVLink island),
the devices the real scheduler allocated (``null``: unschedulable) and the best NVLink link count
any N free GPUs reach. For every case:

* ``dra-driver simulate`` on the slices the scheduler saw (``dra-driver slices`` of that time:
  one slice, one device per GPU) prints exactly the devices it picked, or exit 1;
* on the slices we publish now (set ranks on every GPU) the same claim gets the same devices:
  the ranks change nothing for claims that do not ask for them;
* the claim ``dra-driver claim --gpus N`` writes, on the slices the agent publishes once it has
  prepared the occupying 1-GPU claims, gets GPUs with the best possible link count.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import refdata
import yaml

from dra_driver import cli
from dra_driver.allocation import allocator, claimgen, simulator
from dra_driver.devices import fake, gpusets, model, topology
from dra_driver.slices import build

DRIVER = "gpu.nvidia.com"
NODE = "topo-node"
pytestmark = refdata.MARK

DATA = refdata.load_json("real-topology-allocations.json") if refdata.available() else None
CASES: list[dict[str, Any]] = DATA["cases"] if DATA else []
PARAMS = (
    [pytest.param(c, id=c["case"]) for c in CASES] if refdata.available() else refdata.placeholder()
)


@functools.cache
def _devices(profile: str) -> model.NodeDevices:
    return fake.FakeBackend.from_name(profile).discover()


@functools.cache
def _published(profile: str, taken: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    return build.build(_devices(profile), node_name=NODE, taken=taken).slices


def recorded_slices(devices: model.NodeDevices) -> list[dict[str, Any]]:
    """The slices the real scheduler allocated from: one slice, one device per GPU."""
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{NODE}-{DRIVER}-0"},
            "spec": {
                "driver": DRIVER,
                "nodeName": NODE,
                "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                "devices": build.device_entries(devices),
            },
        }
    ]


def _claim(case: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": case["case"], "namespace": "default"},
        "spec": case["claimSpec"],
    }


def _taken(case: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {(DRIVER, NODE, name) for name in case["alreadyAllocated"]}


def _write(path: Path, *docs: Any) -> str:
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return str(path)


def test_the_recorded_cases_are_there() -> None:
    data = refdata.load_json("real-topology-allocations.json")
    assert len(data["cases"]) >= 40
    assert any(c["schedulerAllocated"] is None for c in data["cases"])


@pytest.mark.parametrize("case", PARAMS)
def test_simulate_prints_the_recorded_pick(
    case: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        "simulate",
        _write(tmp_path / "claim.yaml", _claim(case)),
        "--slices",
        _write(tmp_path / "slices.yaml", *recorded_slices(_devices(case["profile"]))),
    ]
    if case["alreadyAllocated"]:
        taken = [
            {"driver": DRIVER, "pool": NODE, "device": name} for name in case["alreadyAllocated"]
        ]
        args += ["--allocated", _write(tmp_path / "taken.yaml", taken)]
    code = cli.main(args)
    out = capsys.readouterr().out
    if case["schedulerAllocated"] is None:
        assert code == 1, out
        assert out.startswith(f"ResourceClaim {case['case']} cannot be allocated on node {NODE}")
        return
    assert code == 0, out
    results = yaml.safe_load(out)["devices"]["results"]
    assert [r["device"] for r in results] == case["schedulerAllocated"]
    assert {r["request"] for r in results} == {"gpus"}


@pytest.mark.parametrize("case", PARAMS)
def test_the_same_pick_on_the_slices_we_publish_now(case: dict[str, Any]) -> None:
    devices = _devices(case["profile"])
    outcome = allocator.allocate(
        _claim(case),
        slices=_published(case["profile"]),
        classes=simulator.builtin_classes(),
        node_name=NODE,
        allocated=_taken(case),
        node_devices=devices,
    )
    if case["schedulerAllocated"] is None:
        assert not outcome.allocated
        return
    assert outcome.allocation is not None, outcome.explanation
    picked = [r["device"] for r in outcome.allocation["devices"]["results"]]
    assert picked == case["schedulerAllocated"]
    assert outcome.score is not None and outcome.score[0] == case["nvlinkLinksOfPick"]


@pytest.mark.parametrize("case", PARAMS)
def test_the_generated_claim_gets_the_best_links(case: dict[str, Any]) -> None:
    devices = _devices(case["profile"])
    count = case["claimSpec"]["devices"]["requests"][0]["exactly"]["count"]
    outcome = allocator.allocate(
        claimgen.claim(count),
        slices=_published(case["profile"], tuple(case["alreadyAllocated"])),
        classes=simulator.builtin_classes(),
        node_name=NODE,
        allocated=_taken(case),
        node_devices=devices,
    )
    assert outcome.allocation is not None, outcome.explanation
    assert len(outcome.gpus) == count
    taken = {g.uuid for g in devices.gpus if g.name in case["alreadyAllocated"]}
    assert not taken & set(outcome.gpus)
    assert outcome.score is not None
    assert outcome.score[0] == case["bestPossibleNvlinkLinks"]


@pytest.mark.parametrize("case", PARAMS)
def test_simulate_gives_the_generated_claim_the_best_links(
    case: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same through ``dra-driver simulate --fake``: the slices the agent publishes once it
    has prepared the occupying claims (``--allocated``), the scheduler's search replayed."""
    count = case["claimSpec"]["devices"]["requests"][0]["exactly"]["count"]
    args = ["simulate", _write(tmp_path / "claim.yaml", claimgen.claim(count))]
    args += ["--fake", case["profile"], "--node-name", NODE]
    if case["alreadyAllocated"]:
        taken = [
            {"driver": DRIVER, "pool": NODE, "device": name} for name in case["alreadyAllocated"]
        ]
        args += ["--allocated", _write(tmp_path / "taken.yaml", taken)]
    assert cli.main(args) == 0
    picked = [r["device"] for r in yaml.safe_load(capsys.readouterr().out)["devices"]["results"]]
    assert not set(picked) & set(case["alreadyAllocated"])
    devices = _devices(case["profile"])
    topo = topology.build(devices)
    indices = [g.index for g in devices.gpus if g.name in picked]
    assert len(indices) == count
    assert gpusets.set_score(topo, indices)[0] == case["bestPossibleNvlinkLinks"]
