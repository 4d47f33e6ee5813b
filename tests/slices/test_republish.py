"""Health changes re-published through the real publisher over the in-memory API: a taint change
is one update with one generation bump; a change that alters no taint writes nothing."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest

from dra_driver import logs
from dra_driver.devices import health
from dra_driver.slices import build, publisher, republish, taints
from dra_driver.testing.fakeapi import memory

from .conftest import Obj, devices_of

DRIVER, NODE = "gpu.nvidia.com", "n1"


def xid(value: str, message: str = "XID") -> health.Condition:
    return health.Condition(kind="xid", value=value, effect="NoSchedule", message=message)


def wait_for(condition: Callable[[], Any], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


@pytest.fixture
def running() -> Iterator[tuple[memory.InMemoryApi, health.HealthBoard, Any]]:
    api = memory.InMemoryApi()
    api.put_node(NODE, uid="uid-n1")
    board = health.HealthBoard()
    devices = devices_of("dgx-h100")
    snap = board.snapshot()
    pub = publisher.start_node_publisher(
        api=api,
        devices=devices,
        driver_name=DRIVER,
        node_name=NODE,
        decorate=taints.decorator(snap, DRIVER),
    )
    follower = republish.follow(
        pub,
        board=board,
        built_from=republish.Inputs(health=snap),
        devices=devices,
        node_name=NODE,
        driver_name=DRIVER,
        log=logs.get("test"),
    )
    wait_for(pub.synced.is_set)
    yield api, board, pub
    follower.stop()


def slices(api: memory.InMemoryApi) -> list[Obj]:
    return api.list_resource_slices(driver=DRIVER, node_name=NODE)[0]


def test_a_taint_change_is_one_update_and_one_generation(running: Any) -> None:
    api, board, pub = running
    gpu = devices_of("dgx-h100").gpu(2)
    writes = api.writes
    board.set_conditions(gpu.uuid, [xid("79")])
    wait_for(
        lambda: any(d.get("taints") for s in slices(api) for d in s["spec"].get("devices", []))
    )
    wait_for(pub.synced.is_set)
    # One pass: every slice of the pool rewritten once with the next generation (a DGX H100's
    # eight GPUs fit one slice).
    assert api.writes == writes + len(slices(api)) == writes + 1
    assert {s["spec"]["pool"]["generation"] for s in slices(api)} == {2}


def test_a_change_that_alters_no_taint_writes_nothing(running: Any) -> None:
    api, board, pub = running
    gpu = devices_of("dgx-h100").gpu(2)
    board.set_conditions(gpu.uuid, [xid("79", "first words")])
    wait_for(
        lambda: any(d.get("taints") for s in slices(api) for d in s["spec"].get("devices", []))
    )
    wait_for(pub.synced.is_set)
    before, writes, passes = slices(api), api.writes, pub.passes
    board.set_conditions(gpu.uuid, [xid("79", "other words, same taint")])
    wait_for(lambda: pub.passes > passes and pub.synced.is_set())
    assert (slices(api), api.writes) == (before, writes)


class Recording:
    def __init__(self) -> None:
        self.handed: list[list[Obj]] = []
        self.stopped = threading.Event()

    def set_desired(self, slices: Iterable[Obj]) -> None:
        self.handed.append(list(slices))

    def stop(self) -> None:
        self.stopped.set()


def test_a_change_before_start_is_not_missed_and_stop_stops_the_publisher() -> None:
    board = health.HealthBoard()
    board.mark_unhealthy("GPU-x")  # after the publisher's first build (version 0)
    recording = Recording()
    follower = republish.Republisher(
        publisher=recording,
        rebuild=lambda inputs: [{"version": inputs.health.version}],
        board=board,
        log=logs.get("test"),
        built_from=republish.Inputs(),  # version 0
    )
    follower.start()
    wait_for(lambda: recording.handed)
    assert recording.handed == [[{"version": 1}]]
    follower.stop()
    assert recording.stopped.is_set()


def test_a_failing_rebuild_keeps_following() -> None:
    board = health.HealthBoard()
    recording = Recording()
    calls: list[int] = []

    def rebuild(inputs: republish.Inputs) -> list[Obj]:
        calls.append(inputs.health.version)
        if len(calls) == 1:
            raise build.BuildError("broken once")
        return [{"version": inputs.health.version}]

    follower = republish.Republisher(
        publisher=recording,
        rebuild=rebuild,
        board=board,
        log=logs.get("test"),
        built_from=republish.Inputs(),
    )
    follower.start()
    board.mark_unhealthy("GPU-x")
    wait_for(lambda: calls)
    board.mark_healthy("GPU-x")
    wait_for(lambda: recording.handed)
    assert recording.handed[-1] == [{"version": 2}]
    follower.stop()


def test_shareable_gpus_stay_shareable_when_a_taint_is_republished() -> None:
    from dra_driver.slices import shares

    api = memory.InMemoryApi()
    api.put_node(NODE, uid="uid-n1")
    board = health.HealthBoard()
    devices = devices_of("dgx-h100")
    snap = board.snapshot()
    sharing = shares.Shareable.parse("H100")
    pub = publisher.start_node_publisher(
        api=api,
        devices=devices,
        driver_name=DRIVER,
        node_name=NODE,
        decorate=taints.decorator(snap, DRIVER),
        shareable=sharing,
    )
    follower = republish.follow(
        pub,
        board=board,
        built_from=republish.Inputs(health=snap),
        devices=devices,
        node_name=NODE,
        driver_name=DRIVER,
        log=logs.get("test"),
        shareable=sharing,
    )
    try:
        wait_for(pub.synced.is_set)
        board.set_conditions(devices.gpu(1).uuid, [xid("79")])
        wait_for(
            lambda: any(d.get("taints") for s in slices(api) for d in s["spec"].get("devices", []))
        )
        published = [d for s in slices(api) for d in s["spec"].get("devices", [])]
        gpus = [d for d in published if d["attributes"]["type"] == {"string": "gpu"}]
        assert len(gpus) == 8 and all(d.get("allowMultipleAllocations") for d in gpus)
        assert all(d["capacity"]["memory"].get("requestPolicy") for d in gpus)
        assert [d["name"] for d in published if d.get("taints")] == ["gpu-1"]
        assert gpus[1]["attributes"]["setRanks"] == {"int": 0}  # a tainted GPU is in no set
    finally:
        follower.stop()


def test_without_gpu_sets_the_node_publisher_and_its_health_rebuilds_publish_single_gpus(
    tmp_path: Any,
) -> None:
    """``--gpu-sets=false`` (clusters without partitionable devices): no counters and no sets in
    the first build, and none come back when a health change rebuilds the slices."""
    from dra_driver.slices import nodepublisher

    api = memory.InMemoryApi()
    api.put_node(NODE, uid="uid-n1")
    board = health.HealthBoard()
    node = nodepublisher.NodePublisher(
        driver_name=DRIVER,
        node_name=NODE,
        devices=devices_of("dgx-h100"),
        api=api,
        lock_file=tmp_path / "publisher.lock",
        grace_s=60.0,
        watch_timeout_s=30.0,
        log=logs.get("test"),
        board=board,
        gpu_sets=False,
    )
    node.start()
    try:
        wait_for(node.publisher.synced.is_set)

        def shape() -> tuple[int, set[str], bool]:
            got = slices(api)
            devices = [d for s in got for d in s["spec"].get("devices", [])]
            kinds = {d["attributes"]["type"]["string"] for d in devices}
            counters = any(
                "sharedCounters" in s["spec"] or d.get("consumesCounters")
                for s in got
                for d in s["spec"].get("devices", [s["spec"]])
            )
            return len(devices), kinds, counters

        assert shape() == (8, {"gpu"}, False)
        board.set_conditions(devices_of("dgx-h100").gpu(2).uuid, [xid("79")])
        wait_for(lambda: any(d.get("taints") for s in slices(api) for d in s["spec"]["devices"]))
        assert shape() == (8, {"gpu"}, False)
    finally:
        node.stop()
