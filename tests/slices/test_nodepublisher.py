"""The node agent's publishing as it is wired: the first build already carries the board's
taints, the options reach the builder and the health rebuilds, readiness follows the passes and
the watch, metrics hear every pass; and the node's publisher lock, its log lines and failures."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from dra_driver.devices import health, migprofiles
from dra_driver.slices import leader, nodepublisher, publisher, shares
from dra_driver.testing.fakeapi import memory

from .conftest import Obj, devices_of
from .test_publisher import DRIVER, Recorder, wait_for

NODE = "n1"


class Metrics:
    def __init__(self) -> None:
        self.publishes: list[tuple[bool, int | None]] = []

    def slice_publish(self, *, ok: bool, slices: int | None = None) -> None:
        self.publishes.append((ok, slices))


@pytest.fixture
def mem() -> memory.InMemoryApi:
    api = memory.InMemoryApi()
    api.put_node(NODE, uid="uid-n1")
    return api


def node_publisher(mem: memory.InMemoryApi, tmp_path: Path, **kw: Any) -> Any:
    kw.setdefault("grace_s", 60.0)
    kw.setdefault("watch_timeout_s", 30.0)
    return nodepublisher.NodePublisher(
        driver_name=DRIVER,
        node_name=NODE,
        api=mem,
        lock_file=tmp_path / "publisher.lock",
        log=Recorder(),  # type: ignore[arg-type]
        **kw,
    )


def devices(obj: list[Obj]) -> dict[str, Obj]:
    return {d["name"]: d for s in obj for d in s["spec"].get("devices") or ()}


def test_the_first_build_carries_the_taints_the_board_has_already(
    mem: memory.InMemoryApi, tmp_path: Path
) -> None:
    board = health.HealthBoard()
    gpus = devices_of("dgx-h100")
    condition = health.Condition(kind="xid", value="79", effect="NoSchedule", message="XID 79")
    board.set_conditions(gpus.gpu(2).uuid, [condition])
    node = node_publisher(mem, tmp_path, devices=gpus, board=board, gpu_sets=False)
    try:
        node.publisher.reconcile_once()  # not started: this pass is the first build's
        published = devices(mem.all_resource_slices())
        (taint,) = published["gpu-2"]["taints"]
        taint.pop("timeAdded")  # the server's
        assert taint == {"key": f"{DRIVER}/xid", "value": "79", "effect": "NoSchedule"}
        assert [n for n, d in published.items() if d.get("taints")] == ["gpu-2"]
        assert node.follower is not None
    finally:
        node.stop()


def test_without_a_board_there_is_no_follower_and_stop_stops_the_publisher(
    mem: memory.InMemoryApi, tmp_path: Path
) -> None:
    node = node_publisher(mem, tmp_path, devices=devices_of("pcie-l4"))
    assert node.follower is None
    node.start()
    wait_for(node.publisher.synced.is_set)
    assert node.lock.held
    node.stop()
    assert not node.lock.held
    assert all(not t.is_alive() for t in node.publisher._threads if t.name == "slice-publisher")


def test_options_reach_the_first_build_and_the_health_rebuilds(
    mem: memory.InMemoryApi, tmp_path: Path
) -> None:
    board = health.HealthBoard()
    gpus = devices_of("pcie-l4")
    node = node_publisher(
        mem,
        tmp_path,
        devices=gpus,
        board=board,
        shareable=shares.Shareable.parse("all"),
        gpu_sets=False,
        watch_timeout_s=12.0,
    )
    try:
        assert node.publisher._watch_timeout_s == 12.0
        node.publisher.reconcile_once()
        first = devices(mem.all_resource_slices())
        assert all(d.get("allowMultipleAllocations") for d in first.values())
        assert not any(d.get("consumesCounters") for d in first.values())
        board.mark_unhealthy(gpus.gpu(0).uuid, "test")
        wait_for(lambda: node.publisher.reconcile_once().writes > 0)
        rebuilt = devices(mem.all_resource_slices())
        assert all(d.get("allowMultipleAllocations") for d in rebuilt.values())
        assert not any(d.get("consumesCounters") for d in rebuilt.values())
        assert [n for n, d in rebuilt.items() if d.get("taints")] == [gpus.gpu(0).name]
    finally:
        node.stop()


def test_dynamic_mig_reaches_the_first_build_and_the_health_rebuilds(
    mem: memory.InMemoryApi, tmp_path: Path
) -> None:
    board = health.HealthBoard()
    gpus = devices_of("h100-mig")
    node = node_publisher(
        mem, tmp_path, devices=gpus, board=board, dynamic_mig=migprofiles.DynamicMig.parse("all")
    )
    try:
        node.publisher.reconcile_once()
        assert any("-mig-" in n for n in devices(mem.all_resource_slices()))
        board.mark_unhealthy(gpus.gpu(0).uuid, "test")
        wait_for(lambda: node.publisher.reconcile_once().writes > 0)
        assert any("-mig-" in n for n in devices(mem.all_resource_slices()))
    finally:
        node.stop()


def test_readiness_follows_passes_and_the_watch_and_metrics_hear_each_pass(
    mem: memory.InMemoryApi, tmp_path: Path
) -> None:
    metrics = Metrics()
    node = node_publisher(
        mem, tmp_path, devices=devices_of("pcie-l4"), metrics=metrics, grace_s=0.0
    )
    assert not node.published()  # nothing published yet
    outcome = publisher.Outcome(slices=3)
    node._passed(outcome)
    assert node.published()  # the watch counts as open until it fails
    node._passed(None)
    assert not node.published()  # no grace: failing at once
    assert metrics.publishes == [(True, 3), (False, None)]
    node._passed(outcome)
    assert node.published()
    node.publisher._on_watch(False)
    assert not node.published()
    node.publisher._on_watch(True)
    assert node.published()
    node.publisher._on_pass(None)
    assert not node.published() and metrics.publishes[-1] == (False, None)


def test_a_standing_by_instance_is_ready(mem: memory.InMemoryApi, tmp_path: Path) -> None:
    holder = leader.PublisherLock(tmp_path / "publisher.lock", log=Recorder())
    holder.start(on_acquired=lambda: None)
    assert holder.wait_held(10)
    node = node_publisher(mem, tmp_path, devices=devices_of("pcie-l4"))
    try:
        node.start()
        wait_for(lambda: node.lock.standby)
        assert node.published()  # the other instance publishes
        assert not mem.calls  # and we do not
    finally:
        node.stop()
        holder.release()


# --- the node's publisher lock ------------------------------------------------------------------

STANDING_BY = (
    "another agent instance on this node publishes the ResourceSlices; standing by to take over"
)


def test_the_lock_says_who_publishes(tmp_path: Path) -> None:
    path = tmp_path / "run" / "publisher.lock"
    first_log, second_log = Recorder(), Recorder()
    taken: list[str] = []
    first = leader.PublisherLock(path, log=first_log)
    first.start(on_acquired=lambda: taken.append("first"))
    assert first.wait_held(10) and first.held
    assert oct(path.stat().st_mode & 0o777) == oct(0o600)
    second = leader.PublisherLock(path, log=second_log)
    second.start(on_acquired=lambda: taken.append("second"))
    wait_for(lambda: second.standby)
    assert first_log.lines == [
        ("info", "publishing this node's ResourceSlices", {"lock": str(path)})
    ]
    assert second_log.lines == [("info", STANDING_BY, {"lock": str(path)})]
    first.release()
    assert second.wait_held(10)
    assert second_log.lines[1:] == [
        ("info", "publishing this node's ResourceSlices", {"lock": str(path)})
    ]
    assert taken == ["first", "second"]
    second.release()
    second.release()  # twice is fine
    assert not second.held and not second.standby


def test_a_lock_released_while_standing_by_never_publishes(tmp_path: Path) -> None:
    path = tmp_path / "publisher.lock"
    first = leader.PublisherLock(path, log=Recorder())
    first.start(on_acquired=lambda: None)
    assert first.wait_held(10)
    log = Recorder()
    taken = threading.Event()
    second = leader.PublisherLock(path, log=log)
    second.start(on_acquired=taken.set)
    wait_for(lambda: second.standby)
    second.release()
    assert not second.standby  # stopped: no longer standing by
    first.release()
    assert second._thread is not None
    second._thread.join(10)
    assert not second._thread.is_alive()
    assert not taken.is_set() and not second.held
    assert [event for _, event, _ in log.lines] == [STANDING_BY]  # no error, no "publishing"
    third = leader.PublisherLock(path, log=Recorder())  # and the lock is free
    third.start(on_acquired=lambda: None)
    assert third.wait_held(10)
    third.release()


def test_a_lock_that_cannot_be_taken_is_an_error_unless_released(tmp_path: Path) -> None:
    path = tmp_path / "publisher.lock"
    log = Recorder()
    lock = leader.PublisherLock(path, log=log)
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    os.close(fd)
    called: list[bool] = []
    lock._take(fd, lambda: called.append(True))  # a closed descriptor: flock fails
    assert log.lines == [
        (
            "error",
            "cannot take the publisher lock",
            {"lock": str(path), "error": "[Errno 9] Bad file descriptor"},
        )
    ]
    assert not called and not lock.held
    log.lines.clear()
    lock.release()
    lock._take(fd, lambda: called.append(True))
    assert log.lines == [] and not called


def test_a_lock_file_that_cannot_be_opened(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    path = tmp_path / "file" / "publisher.lock"
    lock = leader.PublisherLock(path, log=Recorder())
    with pytest.raises(leader.LockError) as info:
        lock.start(on_acquired=lambda: None)
    assert str(info.value) == f"cannot open lock file {path}: File exists"
    directory = tmp_path / "dir"
    directory.mkdir()
    with pytest.raises(leader.LockError) as info:
        leader.PublisherLock(directory, log=Recorder()).start(on_acquired=lambda: None)
    assert str(info.value) == f"cannot open lock file {directory}: Is a directory"
    assert leader.LOCK_FILE == "publisher.lock"
