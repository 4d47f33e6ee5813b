"""The node's set capacity (devices/setcapacity.py) against brute force, its gauges, and the
republisher keeping them current: set at the start, on every change of holdings or health,
a size losing its last free set losing its ``best_set_links`` series, and a failing update
logged without stopping the re-publishing."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from dra_driver import metrics as metrics_mod
from dra_driver.devices import health, holdings, setcapacity, topology
from dra_driver.slices import republish

from .conftest import devices_of
from .test_publisher import Recorder, wait_for


def gauge(m: metrics_mod.DriverMetrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(f"dra_driver_{name}", labels)


@pytest.mark.parametrize("profile", ["dgx-1-v100", "dgx-h100", "h100-nvl-pairs", "pcie-l4"])
@pytest.mark.parametrize("held", [(), ("gpu-0",), ("gpu-1", "gpu-2", "gpu-5")])
def test_best_links_are_the_brute_force_best_of_the_free_gpus(
    profile: str, held: tuple[str, ...]
) -> None:
    devices = devices_of(profile)
    topo = topology.build(devices)
    gpus = {g.name: g for g in devices.gpus}
    held = tuple(h for h in held if h in gpus)
    sick = next(g for g in gpus.values() if g.name not in held)  # one unhealthy GPU too
    cap = setcapacity.of(devices, held=held, unhealthy_uuids={sick.uuid})
    free = [g.index for g in devices.gpus if g.name not in held and g is not sick]
    assert (cap.free, cap.held, cap.unhealthy) == (len(free), len(held), 1)
    for size in range(1, len(gpus) + 1):
        assert cap.placeable[size] == len(free) // size
        every = [topo.score(c)[0] for c in itertools.combinations(free, size)]
        # the ladder ranks by (links, NUMA, PCIe): its best set has the most links
        assert cap.best_links.get(size) == (max(every) if every else None), size
        whole = [topo.score(c)[0] for c in itertools.combinations(sorted(topo.indices), size)]
        assert cap.best_links_max[size] == max(whole)


def test_the_gauges_drop_a_size_that_has_no_free_set_left() -> None:
    m = metrics_mod.new()
    devices = devices_of("dgx-1-v100")
    m.set_capacity(setcapacity.of(devices))
    assert gauge(m, "best_set_links", size="8") == 24
    m.set_capacity(setcapacity.of(devices, held={"gpu-0"}))
    assert gauge(m, "best_set_links", size="8") is None
    assert gauge(m, "best_set_links_max", size="8") == 24
    assert gauge(m, "placeable_sets", size="8") == 0
    assert gauge(m, "gpus", state="held") == 1 and gauge(m, "gpus", state="free") == 7


class Sink:
    def __init__(self) -> None:
        self.sets = 0

    def set_desired(self, slices: Any) -> None:
        self.sets += 1

    def stop(self) -> None:
        pass


def test_the_republisher_keeps_the_gauges_current() -> None:
    m = metrics_mod.new()
    devices = devices_of("dgx-h100")
    board, held = health.HealthBoard(), holdings.HeldGpus()
    held.hold("c1", ["gpu-0"])
    log = Recorder()
    follower = republish.follow(
        Sink(),
        built_from=republish.Inputs(),
        devices=devices,
        node_name="n1",
        driver_name="gpu.nvidia.com",
        log=log,  # type: ignore[arg-type]
        board=board,
        held=held,
        settle_s=0.0,
        metrics=m,
    )
    try:
        assert gauge(m, "gpus", state="held") == 1  # set at the start, before any change
        held.hold("c2", ["gpu-1", "gpu-2", "gpu-3"])
        assert gauge(m, "placeable_sets", size="2") == 3
        wait_for(lambda: gauge(m, "placeable_sets", size="2") == 2)
        assert gauge(m, "gpus", state="free") == 4 and gauge(m, "placeable_sets", size="4") == 1
        board.mark_unhealthy(devices.gpus[7].uuid, "xid 79")
        wait_for(lambda: gauge(m, "gpus", state="unhealthy") == 1)
        assert gauge(m, "placeable_sets", size="4") == 0 and gauge(m, "gpus", state="free") == 3
    finally:
        follower.stop()


def test_a_failing_gauge_update_is_logged_and_the_slices_still_follow() -> None:
    def boom(inputs: republish.Inputs) -> None:
        raise RuntimeError("boom")

    held, log, sink = holdings.HeldGpus(), Recorder(), Sink()
    follower = republish.Republisher(
        publisher=sink,
        rebuild=lambda inputs: [],
        log=log,  # type: ignore[arg-type]
        built_from=republish.Inputs(),
        held=held,
        settle_s=0.0,
        observe=boom,
    )
    follower.start()
    try:
        held.hold("c1", ["gpu-0"])
        wait_for(lambda: sink.sets == 1)
        errors = [(e, kw["error"]) for lvl, e, kw in log.lines if lvl == "error"]
        assert errors == [("cannot update the set-capacity metrics", "RuntimeError('boom')")] * 2
    finally:
        follower.stop()
