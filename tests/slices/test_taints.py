"""Taints of unhealthy GPUs in the built slices: on the right devices, valid against the API
limits (64 devices per slice once tainted), in a fixed order, absent when healthy."""

from __future__ import annotations

import json
from collections.abc import Callable

import kubernetes_validate
import refdata

from dra_driver.devices import health, model
from dra_driver.slices import build, gpusets, taints, validate

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
):  # type: ignore[no-untyped-def]
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
    # The GPU sets holding gpu-3 carry its taints too; every other device none.
    holding = {n for n, d in found.items() if sick.uuid in gpusets.gpu_uuids(d)}
    assert sick.name in holding and any(n.startswith("gpus-") for n in holding)
    assert all(found[n]["taints"] == found[sick.name]["taints"] for n in holding)
    assert all("taints" not in d for name, d in found.items() if name not in holding)
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


def test_gpu_sets_named_by_uuid0_uuid1_are_tainted_through_their_members() -> None:
    devices = devices_of("h100-nvl-pairs")
    result = built(devices, board_with({devices.gpu(1).uuid: [LOST]}))
    found = by_name(result.slices)
    lost = [{"key": "gpu.nvidia.com/gpu-lost", "value": "lost", "effect": "NoExecute"}]
    assert found["gpus-0-1"]["taints"] == found["gpus-0-1-2"]["taints"] == lost
    assert "taints" not in found["gpus-2-3"]


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
