"""Taints of unhealthy GPUs in the built slices: on the right devices, valid against the API
limits (64 devices per slice once tainted), in a fixed order, absent when healthy."""

from __future__ import annotations

import json
from collections.abc import Callable

import kubernetes_validate
import refdata

from dra_driver.devices import health, model
from dra_driver.slices import build, taints, validate

from . import openapi
from .conftest import Obj, devices_of

XID79 = health.Condition(kind="xid", value="79", effect="NoExecute", message="XID 79")
LOST = health.Condition(kind="gpu-lost", value="lost", effect="NoExecute", message="lost")
PAGES = health.Condition(kind="retired-pages", value="pending", effect="NoSchedule", message="p")


def board_with(conditions: dict[str, list[health.Condition]]) -> health.HealthBoard:
    board = health.HealthBoard()
    for uuid, conds in conditions.items():
        board.set_conditions(uuid, conds)
    return board


def built(
    devices: model.NodeDevices,
    board: health.HealthBoard,
    driver: str = "gpu.nvidia.com",
    *,
    gpu_sets: bool = True,
) -> build.Build:
    return build.build(
        devices,
        node_name="n1",
        driver_name=driver,
        decorate=taints.decorator(board.snapshot(), driver),
        gpu_sets=gpu_sets,
    )


def by_name(slices: list[Obj]) -> dict[str, Obj]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}


def test_unhealthy_gpu_is_tainted_and_the_slices_stay_valid() -> None:
    devices = devices_of("dgx-h100")
    sick = devices.gpu(3)
    result = built(devices, board_with({sick.uuid: [XID79, PAGES]}))
    assert result.problems == []
    found = by_name(result.slices)
    assert found[sick.name]["taints"] == [
        {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoExecute"},
        {"key": "gpu.nvidia.com/retired-pages", "value": "pending", "effect": "NoSchedule"},
    ]
    # Every other device is untainted; the tainted one lowers the slice limit to 64.
    assert [n for n, d in found.items() if "taints" in d] == [sick.name]
    (only,) = result.slices
    assert len(only["spec"]["devices"]) == 8
    for s in result.slices:
        assert validate.validate(s) == []
        assert kubernetes_validate.validate(s, "1.36.0", strict=True)


@refdata.MARK
def test_tainted_slices_pass_the_reference_openapi_document() -> None:
    devices = devices_of("dgx-h100")
    result = built(devices, board_with({devices.gpu(3).uuid: [XID79, PAGES]}))
    for s in result.slices:
        assert openapi.errors(s) == []


def test_mig_devices_inherit_their_gpus_taints_and_keep_their_own() -> None:
    devices = devices_of("a100-mig")
    gpu0, gpu1 = devices.gpus
    own = gpu1.mig_devices[0]
    result = built(devices, board_with({gpu0.uuid: [LOST], own.uuid: [XID79]}))
    found = by_name(result.slices)
    for mig in gpu0.mig_devices:
        assert found[model.mig_device_name(gpu0, mig)]["taints"] == [
            {"key": "gpu.nvidia.com/gpu-lost", "value": "lost", "effect": "NoExecute"}
        ]
    assert found[model.mig_device_name(gpu1, own)]["taints"][0]["value"] == "79"


def test_group_devices_naming_their_gpus_are_tainted_when_any_is_unhealthy() -> None:
    snap = board_with({"GPU-b": [XID79]}).snapshot()
    group = {
        "name": "gpus-0-1",
        "attributes": {"gpu.nvidia.com/uuids": {"strings": ["GPU-a", "GPU-b"]}},
    }
    comma = {"name": "gpus-2-3", "attributes": {"uuids": {"string": "GPU-c, GPU-b"}}}
    healthy = {"name": "gpus-4-5", "attributes": {"uuids": {"strings": ["GPU-d", "GPU-e"]}}}
    devices = [group, comma, healthy]
    taints.decorator(snap, "gpu.nvidia.com")(devices)
    assert (
        group["taints"]
        == comma["taints"]
        == [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoExecute"}]
    )
    assert "taints" not in healthy


def rank_of(found: dict[str, Obj], name: str, size: int) -> int:
    """Digit ``size`` of the GPU's ``setRanks`` (a KeyError if it carries none)."""
    return int(found[name]["attributes"]["setRanks"]["int"]) // 10 ** (size - 1) % 10


def test_a_tainted_gpu_loses_its_set_ranks_and_the_others_are_re_ranked() -> None:
    devices = devices_of("dgx-1-v100")
    healthy = by_name(built(devices, health.HealthBoard()).slices)
    assert [rank_of(healthy, f"gpu-{i}", 4) for i in range(8)] == [1, 1, 1, 1, 2, 2, 2, 2]
    for condition in (XID79, PAGES):  # NoExecute and NoSchedule both keep plain claims off
        found = by_name(built(devices, board_with({devices.gpu(0).uuid: [condition]})).slices)
        assert all(rank_of(found, "gpu-0", n) == 0 for n in range(2, 8))
        # gpu-0 out: the best free quad is gpu-4..gpu-7, and gpu-1..gpu-3 are in no quad.
        assert [rank_of(found, f"gpu-{i}", 4) for i in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
        assert rank_of(found, "gpu-1", 7) == 1 and rank_of(found, "gpu-4", 7) == 1
        assert [n for n, d in found.items() if "taints" in d] == ["gpu-0"]


def test_a_taint_that_keeps_no_pod_off_leaves_the_ranks_alone() -> None:
    devices = devices_of("dgx-1-v100")
    harmless = health.Condition(kind="odd", value="1", effect="None", message="just so")
    found = by_name(built(devices, board_with({devices.gpu(0).uuid: [harmless]})).slices)
    healthy = by_name(built(devices, health.HealthBoard()).slices)
    assert found["gpu-0"]["taints"] == [
        {"key": "gpu.nvidia.com/odd", "value": "1", "effect": "None"}
    ]
    assert all(
        rank_of(found, f"gpu-{i}", n) == rank_of(healthy, f"gpu-{i}", n)
        for i in range(8)
        for n in range(2, 8)
    )


def test_ranks_skip_tainted_gpus_of_nvl_pairs_and_sets_turned_off_have_none() -> None:
    devices = devices_of("h100-nvl-pairs")
    found = by_name(built(devices, board_with({devices.gpu(1).uuid: [LOST]})).slices)
    lost = [{"key": "gpu.nvidia.com/gpu-lost", "value": "lost", "effect": "NoExecute"}]
    assert found["gpu-1"]["taints"] == lost
    assert [rank_of(found, f"gpu-{i}", 2) for i in range(4)] == [0, 0, 1, 1]
    assert [rank_of(found, f"gpu-{i}", 3) for i in range(4)] == [1, 0, 1, 1]
    plain = by_name(
        built(devices, board_with({devices.gpu(1).uuid: [LOST]}), gpu_sets=False).slices
    )
    assert plain["gpu-1"]["taints"] == lost
    assert not any(k.startswith("setRank") for d in plain.values() for k in d["attributes"])


def test_custom_driver_name_is_the_taint_domain() -> None:
    devices = devices_of("pcie-l4")
    result = built(devices, board_with({devices.gpu(0).uuid: [XID79]}), driver="gpu.example.com")
    assert by_name(result.slices)["gpu-0"]["taints"][0]["key"] == "gpu.example.com/xid"


def test_tainted_pools_split_at_64_and_stay_valid(
    make_devices: Callable[..., model.NodeDevices],
) -> None:
    devices = make_devices(100)
    board = board_with({devices.gpu(i).uuid: [XID79] for i in (5, 80)})
    slices = built(devices, board, gpu_sets=False).slices
    assert [len(s["spec"]["devices"]) for s in slices] == [64, 36]
    for s in slices:
        assert validate.validate(s) == []
    untainted = built(devices, health.HealthBoard(), gpu_sets=False).slices
    assert [len(s["spec"]["devices"]) for s in untainted] == [100]


def test_at_most_sixteen_taints_per_device_strongest_first() -> None:
    conditions = [
        health.Condition(kind=f"k{i}", value=str(i), effect="NoSchedule", message="")
        for i in range(20)
    ] + [XID79]
    found = taints.taints_for(conditions, "gpu.nvidia.com")
    assert len(found) == 16
    assert found[0] == {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoExecute"}


def test_byte_identical_for_the_same_health_and_taints_gone_when_healthy() -> None:
    devices = devices_of("dgx-h100")
    board = board_with({devices.gpu(1).uuid: [PAGES, XID79], devices.gpu(2).uuid: [LOST]})
    first, second = built(devices, board), built(devices, board)
    assert json.dumps(first.slices) == json.dumps(second.slices)
    board.mark_healthy(devices.gpu(1).uuid)
    board.mark_healthy(devices.gpu(2).uuid)
    assert json.dumps(built(devices, board).slices) == json.dumps(
        build.build(devices, node_name="n1").slices
    )


def test_withdrawal_removes_only_what_a_taint_would_keep_claims_off() -> None:
    """On a server that drops taints: a NoExecute/NoSchedule GPU goes, an informational (None)
    condition leaves its GPU published."""
    devices = devices_of("dgx-h100")
    info = health.Condition(kind="note", value="x", effect="None", message="informational")
    board = board_with({devices.gpus[0].uuid: [XID79], devices.gpus[1].uuid: [info]})
    decorate = taints.decorator(board.snapshot(), "gpu.nvidia.com", withdraw=True)
    slices = build.build(devices, node_name="n1", decorate=decorate).slices
    found = by_name(slices)
    assert "gpu-0" not in found and "gpu-1" in found and len(found) == 7
    assert all("taints" not in d for d in found.values())
