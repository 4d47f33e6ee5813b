"""The set ranks follow the GPUs prepared claims hold, through the real publisher over the
in-memory API: a change of holdings is one write with one generation bump and one log line, the
first build already carries the holdings, a burst of changes is a few rebuilds, a change that
alters no slice writes nothing, and a rebuild that raises keeps the last good set published and
the follower following. Plus the held-GPUs board itself (counts per GPU, subscribers)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver import logs
from dra_driver import metrics as metrics_mod
from dra_driver.devices import health, holdings
from dra_driver.slices import build, nodepublisher, publisher, republish
from dra_driver.testing.fakeapi import memory

from .conftest import Obj, devices_of
from .test_publisher import Recorder, wait_for

DRIVER, NODE = "gpu.nvidia.com", "n1"
QUAD = ("gpu-0", "gpu-1", "gpu-2", "gpu-3")
HELD_EVENT = "GPUs held by prepared claims changed; re-publishing ResourceSlices"


def published(api: memory.InMemoryApi) -> list[Obj]:
    return api.list_resource_slices(driver=DRIVER, node_name=NODE)[0]


def ranks(slices: list[Obj], size: int) -> dict[str, int]:
    """GPU name → its rank for ``size`` (digit ``size`` of ``setRanks``) in ``slices``."""
    return {
        d["name"]: d["attributes"]["setRanks"]["int"] // 10 ** (size - 1) % 10
        for s in slices
        for d in s["spec"].get("devices") or ()
        if "setRanks" in d["attributes"]
    }


def expected(profile: str, size: int, taken: tuple[str, ...] = ()) -> dict[str, int]:
    return ranks(build.build(devices_of(profile), node_name=NODE, taken=taken).slices, size)


def generation(api: memory.InMemoryApi) -> int:
    (gen,) = {s["spec"]["pool"]["generation"] for s in published(api)}
    return int(gen)


@pytest.fixture
def mem() -> memory.InMemoryApi:
    api = memory.InMemoryApi()
    api.put_node(NODE, uid="uid-n1")
    return api


@pytest.fixture
def start(mem: memory.InMemoryApi, tmp_path: Path) -> Iterator[Any]:
    made: list[nodepublisher.NodePublisher] = []

    def make(held: holdings.HeldGpus, profile: str = "dgx-h100", **kw: Any) -> Any:
        kw.setdefault("log", logs.get("test"))
        node = nodepublisher.NodePublisher(
            driver_name=DRIVER,
            node_name=NODE,
            devices=devices_of(profile),
            api=mem,
            lock_file=tmp_path / f"publisher-{len(made)}.lock",
            grace_s=60.0,
            watch_timeout_s=30.0,
            board=health.HealthBoard(),
            held=held,
            **kw,
        )
        made.append(node)
        node.start()
        wait_for(node.publisher.synced.is_set)
        return node

    yield make
    for node in made:
        node.stop()


def test_rank_one_moves_to_the_free_quad_while_a_claim_holds_four_gpus_and_comes_back(
    mem: memory.InMemoryApi, start: Any
) -> None:
    held, log, metrics = holdings.HeldGpus(), Recorder(), metrics_mod.new()
    start(held, log=log, metrics=metrics)
    free = expected("dgx-h100", 4)
    assert ranks(published(mem), 4) == free
    assert [g for g, r in free.items() if r == 1] == list(QUAD)  # the claim takes rank 1
    gen, writes = generation(mem), mem.writes

    held.hold("claim-a", QUAD)
    wait_for(lambda: ranks(published(mem), 4) != free, timeout=2.0)
    assert ranks(published(mem), 4) == {
        **{g: 0 for g in QUAD},
        **{f"gpu-{i}": 1 for i in range(4, 8)},
    }
    assert ranks(published(mem), 2) == expected("dgx-h100", 2, QUAD)
    assert (generation(mem), mem.writes) == (gen + 1, writes + 1)  # one slice, one write
    lines = [kw for level, event, kw in log.lines if event == HELD_EVENT]
    assert lines == [{"held_version": 1, "held": list(QUAD)}]
    sample = metrics.registry.get_sample_value
    assert sample("dra_driver_resourceslice_rebuilds_total", {"cause": "claims"}) == 1
    assert sample("dra_driver_resourceslice_rebuilds_total", {"cause": "health"}) == 0
    assert sample("dra_driver_held_gpus") == 4

    held.release("claim-a")
    wait_for(lambda: ranks(published(mem), 4) == free, timeout=2.0)
    assert (generation(mem), mem.writes) == (gen + 2, writes + 2)
    assert [kw for _, event, kw in log.lines if event == HELD_EVENT][1:] == [
        {"held_version": 2, "held": []}
    ]
    assert sample("dra_driver_held_gpus") == 0


def test_the_first_build_already_leaves_out_what_claims_hold(
    mem: memory.InMemoryApi, tmp_path: Path
) -> None:
    held = holdings.HeldGpus()
    held.hold("claim-a", QUAD)  # recovered from the checkpoint before publishing starts
    node = nodepublisher.NodePublisher(
        driver_name=DRIVER,
        node_name=NODE,
        devices=devices_of("dgx-h100"),
        api=mem,
        lock_file=tmp_path / "publisher.lock",
        grace_s=60.0,
        watch_timeout_s=30.0,
        log=logs.get("test"),
        held=held,
    )
    try:
        node.publisher.reconcile_once()  # not started: this pass is the first build's
        assert mem.writes == 1
        assert ranks(published(mem), 4) == expected("dgx-h100", 4, QUAD)
        assert ranks(published(mem), 4)["gpu-0"] == 0
        assert node.follower is not None  # holdings alone are followed too
    finally:
        node.stop()


@pytest.mark.parametrize("pause_s", [0.0, 0.002])
def test_a_burst_of_changes_is_a_few_rebuilds_and_writes(
    mem: memory.InMemoryApi, start: Any, pause_s: float
) -> None:
    """32 changes at once, or spread as prepares finishing one after the other are: each
    rebuild waits for the rest of its burst, so a few rebuilds (and writes) serve them all."""
    held = holdings.HeldGpus()
    node = start(held)
    writes, began = mem.writes, time.monotonic()
    for i in range(32):  # every call moves the claim to another GPU: 32 changes
        held.hold("claim-a", [f"gpu-{i % 8}"])
        time.sleep(pause_s)
    spread_s = time.monotonic() - began
    assert held.snapshot().version == 32
    last = expected("dgx-h100", 2, ("gpu-7",))
    wait_for(lambda: ranks(published(mem), 2) == last and node.publisher.synced.is_set())
    assert ranks(published(mem), 3) == expected("dgx-h100", 3, ("gpu-7",))
    most = min(5, 2 + int(spread_s / republish.SETTLE_S))  # one per settle window, and a last
    assert 1 <= node.follower.rebuilds <= most, spread_s
    assert 1 <= mem.writes - writes <= node.follower.rebuilds


def test_a_change_of_holdings_that_changes_no_slice_writes_nothing_and_logs_nothing(
    mem: memory.InMemoryApi, start: Any
) -> None:
    held, log = holdings.HeldGpus(), Recorder()
    node = start(held, log=log, gpu_sets=False)  # no set ranks: holdings change nothing
    before, writes, passes = published(mem), mem.writes, node.publisher.passes
    held.hold("claim-a", QUAD)
    wait_for(lambda: node.follower.rebuilds == 1)
    wait_for(lambda: node.publisher.passes > passes and node.publisher.synced.is_set())
    assert (published(mem), mem.writes) == (before, writes)
    assert [event for _, event, _ in log.lines if event == HELD_EVENT] == []


def test_a_rebuild_that_raises_keeps_the_last_good_set_and_the_follower_following(
    mem: memory.InMemoryApi,
) -> None:
    devices = devices_of("dgx-h100")
    held, log = holdings.HeldGpus(), Recorder()
    pub = publisher.start_node_publisher(
        api=mem, devices=devices, driver_name=DRIVER, node_name=NODE
    )
    good = republish.rebuilder(devices, node_name=NODE, driver_name=DRIVER, tainted=False)
    broken = [False]

    def rebuild(inputs: republish.Inputs) -> list[Obj]:
        if broken[0]:
            raise build.BuildError("cannot build today")
        return good(inputs)

    follower = republish.Republisher(
        publisher=pub,
        rebuild=rebuild,
        held=held,
        log=log,  # type: ignore[arg-type]
        built_from=republish.current(None, held),
    )
    follower.start()
    try:
        wait_for(pub.synced.is_set)
        free, writes = ranks(published(mem), 4), mem.writes
        broken[0] = True
        held.hold("claim-a", QUAD)
        wait_for(lambda: any(level == "error" for level, _, _ in log.lines))
        assert log.lines == [
            (
                "error",
                "cannot rebuild ResourceSlices after the GPUs held by claims changed",
                {"error": "BuildError('cannot build today')"},
            )
        ]
        assert (ranks(published(mem), 4), mem.writes) == (free, writes)  # the last good set
        broken[0] = False
        held.hold("claim-b", ["gpu-4"])
        both = expected("dgx-h100", 4, (*QUAD, "gpu-4"))
        wait_for(lambda: ranks(published(mem), 4) == both, timeout=2.0)
        assert [kw["held"] for _, event, kw in log.lines if event == HELD_EVENT] == [
            [*QUAD, "gpu-4"]
        ]
    finally:
        follower.stop()
    assert not follower._thread.is_alive()


def test_held_gpus_count_claims_per_gpu_and_tell_subscribers_only_of_changes() -> None:
    held = holdings.HeldGpus()
    seen: list[holdings.Snapshot] = []

    def broken(snap: holdings.Snapshot) -> None:
        raise RuntimeError("subscriber bug")

    held.subscribe(broken)  # logged (a catalogued event); the others still hear
    unsubscribe = held.subscribe(seen.append)
    assert held.hold("share-1", ["gpu-0"]) is True
    assert held.hold("share-2", ["gpu-0"]) is False  # a second share of a held GPU
    assert held.hold("share-2", ["gpu-0"]) is False  # the same again
    assert held.release("share-1") is False  # share-2 still holds gpu-0
    assert held.release("unknown") is False
    assert held.hold("set", ["gpu-1", "gpu-2"]) is True
    assert held.release("share-2") is True
    assert held.snapshot() == holdings.Snapshot(version=3, held=frozenset({"gpu-1", "gpu-2"}))
    assert [s.held for s in seen] == [
        frozenset({"gpu-0"}),
        frozenset({"gpu-0", "gpu-1", "gpu-2"}),
        frozenset({"gpu-1", "gpu-2"}),
    ]
    assert held.reset({"a": ["gpu-1", "gpu-2"], "b": []}) is False  # same set
    assert held.reset({"a": ["gpu-5"]}) is True
    assert held.release("set") is False  # reset forgot it
    assert held.snapshot() == holdings.Snapshot(version=4, held=frozenset({"gpu-5"}))
    unsubscribe()
    held.release("a")
    assert len(seen) == 4 and held.snapshot().held == frozenset()


def test_preparing_a_claim_already_allocated_here_rebuilds_nothing(
    mem: memory.InMemoryApi, start: Any
) -> None:
    """The ranks depend on the GPUs taken (held or allocated): a claim the allocation watch
    already counts, prepared and unprepared while its pod stays, changes none of them."""
    held, allocated = holdings.HeldGpus(), holdings.HeldGpus()
    node = start(held, allocated=allocated)
    allocated.hold("claim-a", QUAD)  # the pod is bound: the watch read its claim
    wait_for(lambda: ranks(published(mem), 4) == expected("dgx-h100", 4, QUAD), timeout=2.0)
    rebuilds, writes = node.follower.rebuilds, mem.writes
    held.hold("claim-a", QUAD)  # the kubelet prepares it
    held.release("claim-a")  # ... and unprepares it, the pod still there
    wait_for(lambda: node.follower._built.held.version == 2, timeout=2.0)
    assert (node.follower.rebuilds, mem.writes) == (rebuilds, writes)
    allocated.release("claim-a")  # the pod goes: its GPUs are free again
    wait_for(lambda: ranks(published(mem), 4) == expected("dgx-h100", 4), timeout=2.0)
    assert node.follower.rebuilds == rebuilds + 1
