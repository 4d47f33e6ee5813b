"""Re-ranks that never leave the pool incomplete: on a pool of several slices (dgx-h100 with
dynamic MIG: 5 slices), a change confined to one slice (the set ranks, which sit on the GPUs,
all in one slice) is one update at the pool's current generation; anything else still gets a new
generation on every slice. A pool of one slice keeps bumping (one write either way)."""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator

import pytest

from dra_driver.devices import migprofiles
from dra_driver.slices import build, compare, publisher
from dra_driver.slices import gpusets as slice_ranks
from dra_driver.testing.fakeapi import memory

from .conftest import Obj, devices_of

DRIVER = "gpu.nvidia.com"
ALL = migprofiles.DynamicMig.parse("all")


def pool(taken: tuple[str, ...] = (), *, dynamic: migprofiles.DynamicMig = ALL) -> list[Obj]:
    return build.build(
        devices_of("dgx-h100"),
        node_name="n1",
        driver_name=DRIVER,
        dynamic_mig=dynamic,
        taken=taken,
    ).slices


@pytest.fixture
def mem() -> memory.InMemoryApi:
    api_ = memory.InMemoryApi()
    api_.put_node("n1", uid="uid-of-n1")
    return api_


@pytest.fixture
def pub(mem: memory.InMemoryApi) -> Iterator[publisher.Publisher]:
    made = publisher.Publisher(
        kube=mem,
        driver_name=DRIVER,
        node_name="n1",
        backoff=publisher.Backoff(rng=random.Random(7)),
        watch_timeout_s=0.5,
    )
    yield made
    made.stop()


def generations(mem: memory.InMemoryApi) -> set[int]:
    return {s["spec"]["pool"]["generation"] for s in mem.all_resource_slices()}


def test_the_ranked_gpus_share_one_slice(mem: memory.InMemoryApi) -> None:
    slices = pool()
    assert len(slices) == 5
    holding = {
        s["metadata"]["name"]
        for s in slices
        for d in s["spec"].get("devices") or ()
        if "setRanks" in d["attributes"]
    }
    assert holding == {"n1-gpu.nvidia.com-1"}


def test_a_re_rank_is_one_write_at_the_same_generation(
    mem: memory.InMemoryApi, pub: publisher.Publisher
) -> None:
    pub.set_desired(pool())
    assert pub.reconcile_once().created and generations(mem) == {1}
    mem.reset_calls()
    pub.set_desired(pool(taken=("gpu-0", "gpu-1", "gpu-2", "gpu-3")))
    outcome = pub.reconcile_once()
    assert outcome.updated == ["n1-gpu.nvidia.com-1"] and outcome.generation == 1
    assert mem.writes == 1 and generations(mem) == {1}
    ranks = {
        d["name"]: slice_ranks.rank_of(d["attributes"], 4)
        for s in mem.all_resource_slices()
        for d in s["spec"].get("devices") or ()
        if "setRanks" in d["attributes"]
    }
    assert ranks == {**{f"gpu-{i}": 0 for i in range(4)}, **{f"gpu-{i}": 1 for i in range(4, 8)}}


def test_a_change_of_several_slices_still_bumps_every_slice(
    mem: memory.InMemoryApi, pub: publisher.Publisher
) -> None:
    pub.set_desired(pool())
    pub.reconcile_once()
    mem.reset_calls()
    changed = pool(taken=("gpu-0",))
    for s in changed[2:4]:  # a label on a MIG device in two more slices: three slices differ
        s["spec"]["devices"][0]["attributes"]["note"] = {"string": "x"}
    pub.set_desired(changed)
    assert pub.reconcile_once().generation == 2
    assert mem.writes == 5 and generations(mem) == {2}


def test_a_single_slice_pool_keeps_bumping_its_generation(
    mem: memory.InMemoryApi, pub: publisher.Publisher
) -> None:
    pub.set_desired(pool(dynamic=migprofiles.STATIC))
    pub.reconcile_once()
    pub.set_desired(pool(taken=("gpu-0",), dynamic=migprofiles.STATIC))
    assert pub.reconcile_once().generation == 2 and generations(mem) == {2}


def test_in_place_refuses_moved_devices_new_counters_and_mixed_generations() -> None:
    base = {s["metadata"]["name"]: s for s in pool()}
    wanted = {n: copy.deepcopy(s) for n, s in base.items()}
    target = "n1-gpu.nvidia.com-1"
    wanted[target]["spec"]["devices"][0]["attributes"]["setRanks"] = {"int": 7}
    assert compare.in_place(wanted, base) == target
    moved = copy.deepcopy(wanted)
    moved[target]["spec"]["devices"].pop()
    assert compare.in_place(moved, base) is None  # a device left the slice
    counters = {n: copy.deepcopy(s) for n, s in base.items()}
    counters["n1-gpu.nvidia.com-0"]["spec"]["sharedCounters"].pop()
    assert compare.in_place(counters, base) is None
    mixed = {n: copy.deepcopy(s) for n, s in base.items()}
    mixed["n1-gpu.nvidia.com-4"]["spec"]["pool"]["generation"] = 9
    assert compare.in_place(wanted, mixed) is None  # the server's pool is mid-rewrite
    fewer = {n: s for n, s in wanted.items() if n != "n1-gpu.nvidia.com-4"}
    assert compare.in_place(fewer, base) is None
