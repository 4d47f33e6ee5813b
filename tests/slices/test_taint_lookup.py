"""What the kubelet plugin asks about taints at prepare time (device name → its taints now, with
the reason), which UUIDs each published device stands for, the order of taints, and the health
follower's own thread and log lines; plus the shareable selector's edges."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest

from dra_driver.devices import health, migprofiles
from dra_driver.slices import build, republish, shares, taints

from .conftest import devices_of
from .test_publisher import Recorder, wait_for

DRIVER = "gpu.nvidia.com"
XID = health.Condition(kind="xid", value="79", effect="NoExecute", message="GPU fell off the bus")
PAGES = health.Condition(kind="retired-pages", value="", effect="NoSchedule", message="pending")
ODD = health.Condition(kind="odd", value="1", effect="None", message="just so")


def test_lookup_gives_each_devices_taints_now_with_the_reason() -> None:
    devices = devices_of("dgx-h100")
    uuids = taints.published_uuids(devices, node_name="n1", driver_name=DRIVER)
    board = health.HealthBoard()
    taints_of = taints.lookup(board, uuids, DRIVER)
    assert taints_of("gpu-1") == []
    board.set_conditions(devices.gpu(1).uuid, [XID, PAGES])  # after lookup was made
    assert taints_of("gpu-1") == [
        {
            "key": f"{DRIVER}/xid",
            "value": "79",
            "effect": "NoExecute",
            "message": "GPU fell off the bus",
        },
        {"key": f"{DRIVER}/retired-pages", "effect": "NoSchedule", "message": "pending"},
    ]
    assert taints_of("gpu-0") == [] and taints_of("no-such-device") == []
    # One device per GPU: only gpu-1 stands for gpu-1, so no other device is tainted by it.
    assert [n for n in uuids if devices.gpu(1).uuid in uuids[n]] == ["gpu-1"]
    assert all(taints_of(n) == [] for n in uuids if n != "gpu-1")


def test_published_uuids_name_every_device_and_its_gpus() -> None:
    devices = devices_of("dgx-h100")
    uuids = taints.published_uuids(devices, node_name="n1", driver_name=DRIVER)
    built = build.build(devices, node_name="n1", driver_name=DRIVER)
    names = [d["name"] for s in built.slices for d in s["spec"].get("devices") or ()]
    assert list(uuids) == names
    assert uuids["gpu-3"] == (devices.gpu(3).uuid,)
    assert uuids == {g.name: (g.uuid,) for g in devices.gpus}  # each device is one GPU
    dynamic = migprofiles.DynamicMig.parse("all")
    with_mig = taints.published_uuids(
        devices, node_name="n1", driver_name=DRIVER, dynamic_mig=dynamic
    )
    placement = next(n for n in with_mig if "-mig-" in n)
    assert with_mig[placement] == (devices.gpu(int(placement.split("-")[1])).uuid,)


def test_published_uuids_of_a_node_that_cannot_publish_are_what_would_be_prepared() -> None:
    devices = devices_of("dgx-h100")
    dynamic = migprofiles.DynamicMig.parse("all")
    uuids = taints.published_uuids(
        devices, node_name="Not_A_Node", driver_name=DRIVER, dynamic_mig=dynamic
    )
    entries = build.device_entries(devices, dynamic_mig=dynamic)
    assert list(uuids) == [e["name"] for e in entries]
    assert any("-mig-" in n for n in uuids)  # dynamic MIG placements, as prepare knows them


def test_uuids_in_the_drivers_domain_count_too() -> None:
    device = {
        "name": "x",
        "attributes": {
            f"{DRIVER}/uuid": {"string": "GPU-a"},
            "other.com/uuid": {"string": "GPU-z"},
            "uuids": {"strings": ["GPU-b", "GPU-a"]},
            "parentUUID": {"string": " GPU-c , GPU-d,"},
        },
    }
    assert taints.device_uuids(device, DRIVER) == ("GPU-a", "GPU-c", "GPU-d", "GPU-b")


def test_taints_order_strongest_effect_first_any_other_effect_last() -> None:
    found = taints.taints_for([ODD, PAGES, XID, ODD], DRIVER)
    assert [t["effect"] for t in found] == ["NoExecute", "NoSchedule", "None"]
    assert found[2] == {"key": f"{DRIVER}/odd", "value": "1", "effect": "None"}


def test_the_health_follower_runs_in_a_named_daemon_thread_and_logs_failed_rebuilds() -> None:
    board = health.HealthBoard()
    log = Recorder()
    handed: list[Any] = []
    stopped = threading.Event()
    failing = [True]

    class Publisher:
        def set_desired(self, slices: Any) -> None:
            handed.append(list(slices))

        def stop(self) -> None:
            stopped.set()

    def rebuild(inputs: republish.Inputs) -> list[dict[str, Any]]:
        if failing[0]:
            raise ValueError("no devices")
        return [{"version": inputs.health.version}]

    follower = republish.Republisher(
        publisher=Publisher(),
        rebuild=rebuild,
        board=board,
        log=log,  # type: ignore[arg-type]
        built_from=republish.current(board, None),
    )
    follower.start()
    try:
        assert follower._thread.name == "slice-republish" and follower._thread.daemon
        board.mark_unhealthy("GPU-a", "test")
        wait_for(lambda: bool(log.lines))
        assert log.lines == [
            (
                "error",
                "cannot rebuild ResourceSlices after a health change",
                {"error": "ValueError('no devices')"},
            )
        ]
        failing[0] = False
        board.mark_unhealthy("GPU-b", "test")
        wait_for(lambda: bool(handed))
        version = board.snapshot().version
        assert handed == [[{"version": version}]]
        assert log.lines[1:] == [
            (
                "info",
                "GPU health changed; re-publishing ResourceSlices",
                {"health_version": version, "unhealthy": ["GPU-a", "GPU-b"]},
            )
        ]
    finally:
        follower.stop()
    assert stopped.is_set() and not follower._thread.is_alive()


def test_shareable_selector_edges() -> None:
    for blank in (None, "", "   ", "none", " none "):
        assert str(shares.Shareable.parse(blank)) == "none" == shares.Shareable.parse(blank).spec
    assert shares.Shareable.parse(" all ").spec == "all"
    gpu = devices_of("pcie-l4").gpus[0]
    assert not shares.Shareable.parse("   ").matches(gpu)
    assert shares.Shareable.parse("all").matches(gpu)
    assert shares.Shareable.parse("L4").matches(gpu)
    assert not shares.Shareable.parse("H100").matches(gpu)
    mig = dataclasses.replace(gpu, mig_enabled=True)
    assert not shares.Shareable.parse("all").matches(mig)
    with pytest.raises(shares.ShareableError) as info:
        shares.Shareable.parse("H100(")
    assert str(info.value) == (
        "--shareable 'H100(': not none, all or a valid regular expression "
        "(missing ), unterminated subpattern at position 4)"
    )


def test_the_smallest_shareable_gpu_has_two_gib() -> None:
    assert shares.capacity((2 << 30) - 1, memory_text="x") is None
    two = shares.capacity(2 << 30, memory_text="2Gi")
    assert two is not None
    assert two[shares.MEMORY] == {
        "value": "2Gi",
        "requestPolicy": {
            "default": "2Gi",
            "validRange": {"min": "1Gi", "max": "2Gi", "step": "1Gi"},
        },
    }
    assert two[shares.COMPUTE] == {
        "value": "100",
        "requestPolicy": {"default": "0", "validRange": {"min": "0", "max": "100", "step": "1"}},
    }
    assert shares.max_share_bytes((5 << 30) + 7) == 5 << 30
