"""Preferred allocation is optimal (checked against every combination) and spreads replicas."""

from __future__ import annotations

import itertools

import pytest

from dra_driver.deviceplugin import inventory, preferred
from dra_driver.devices import fake, gpusets, model, topology

MigStrategy = inventory.MigStrategy


def setup(
    name: str, replicas: int = 1
) -> tuple[model.NodeDevices, inventory.Resource, topology.Topology]:
    devs = fake.FakeBackend.from_name(name).discover()
    [res] = inventory.build(
        devs,
        resource_name="nvidia.com/gpu",
        mig_strategy=MigStrategy.NONE,
        mig_minors=None,
        replicas=replicas,
    )
    return devs, res, topology.build(devs)


def gpus_of(res: inventory.Resource, ids: list[str]) -> list[int]:
    return [res.device(i).unit.gpu_index for i in ids]


@pytest.mark.parametrize("name", ["dgx-1-v100", "h100-nvl-pairs", "dgx-h100", "pcie-l4"])
def test_every_size_scores_as_well_as_the_best_combination(name: str) -> None:
    _, res, topo = setup(name)
    ids = [d.id for d in res.devices]
    for size in range(1, len(ids) + 1):
        chosen = gpus_of(
            res, preferred.choose(res, topo, available=ids, must_include=[], size=size)
        )
        best = max(topo.score(c) for c in itertools.combinations(range(len(ids)), size))
        assert len(chosen) == size and topo.score(chosen) == best, (name, size, chosen)


def test_must_include_is_kept_and_the_rest_is_optimal_around_it() -> None:
    _, res, topo = setup("dgx-1-v100")
    ids = [d.id for d in res.devices]
    for must in ([5], [0, 7], [2, 4, 6]):
        chosen = gpus_of(
            res,
            preferred.choose(res, topo, available=ids, must_include=[ids[m] for m in must], size=4),
        )
        assert set(must) <= set(chosen)
        best = max(
            topo.score(c) for c in itertools.combinations(range(8), 4) if set(must) <= set(c)
        )
        assert topo.score(chosen) == best


def test_replicas_spread_over_distinct_gpus_before_doubling_up() -> None:
    _, res, topo = setup("h100-nvl-pairs", replicas=2)
    ids = [d.id for d in res.devices]
    two = gpus_of(res, preferred.choose(res, topo, available=ids, must_include=[], size=2))
    assert sorted(two) == [0, 1]  # two GPUs of one bridged pair, not one GPU twice
    three = gpus_of(res, preferred.choose(res, topo, available=ids, must_include=[], size=3))
    assert len(set(three)) == 3
    six = gpus_of(res, preferred.choose(res, topo, available=ids, must_include=[], size=6))
    assert sorted(six.count(g) for g in range(4)) == [1, 1, 2, 2]


def test_replicas_prefer_the_least_loaded_gpu_when_topology_ties() -> None:
    _, res, topo = setup("pcie-l4", replicas=4)
    # GPU 0 has one free replica left, GPU 1 all four: same switch, so pick GPU 1 first.
    offered = [d.id for d in res.devices if d.unit.gpu_index == 1 or d.replica == 3]
    got = gpus_of(res, preferred.choose(res, topo, available=offered, must_include=[], size=1))
    assert got == [1]


def test_replicas_with_must_include_fill_other_gpus_first() -> None:
    _, res, topo = setup("h100-nvl-pairs", replicas=2)
    ids = [d.id for d in res.devices]
    must = [ids[4]]  # a replica of GPU 2
    got = preferred.choose(res, topo, available=ids, must_include=must, size=2)
    assert ids[4] in got
    assert sorted(gpus_of(res, got)) == [2, 3]


def test_size_errors_are_request_errors() -> None:
    _, res, topo = setup("pcie-l4")
    ids = [d.id for d in res.devices]
    with pytest.raises(inventory.RequestError, match="at least 1"):
        preferred.choose(res, topo, available=ids, must_include=[], size=0)
    with pytest.raises(inventory.RequestError, match="larger than the 4 available"):
        preferred.choose(res, topo, available=ids, must_include=[], size=5)


def test_the_answer_is_in_the_resources_list_order_not_sorted_by_id() -> None:
    _, res, topo = setup("pcie-l4")
    ids = [d.id for d in res.devices]
    assert ids != sorted(ids)  # the fake UUIDs are not in index order
    assert preferred.choose(res, topo, available=ids[::-1], must_include=[], size=4) == ids


def _replica_counts(res: inventory.Resource, ids: list[str]) -> dict[int, int]:
    gpus = gpus_of(res, ids)
    return {g: gpus.count(g) for g in sorted(set(gpus))}


def test_replicas_on_two_gpus_are_filled_evenly() -> None:
    _, res, topo = setup("pcie-l4", replicas=4)
    two = [d.id for d in res.devices if d.unit.gpu_index in (0, 1)]
    got = preferred.choose(res, topo, available=two, must_include=[], size=4)
    assert _replica_counts(res, got) == {0: 2, 1: 2}


def test_must_include_replicas_count_as_taken_when_filling() -> None:
    _, res, topo = setup("pcie-l4", replicas=4)
    two = [d.id for d in res.devices if d.unit.gpu_index in (0, 1)]
    g0 = [d.id for d in res.devices if d.unit.gpu_index == 0]
    # One replica of GPU 0 is given: GPU 1 gets the next, then GPU 0 again (1:1 tie, first).
    got = preferred.choose(res, topo, available=two, must_include=g0[:1], size=3)
    assert _replica_counts(res, got) == {0: 2, 1: 1}
    # Two of GPU 0 are given: both others go to GPU 1.
    got = preferred.choose(res, topo, available=two, must_include=g0[:2], size=4)
    assert _replica_counts(res, got) == {0: 2, 1: 2}


def test_single_gpus_go_where_their_loss_keeps_the_best_sets_whole() -> None:
    """``nvidia.com/gpu: 1`` one pod after another on the 16-GPU mesh: the DRA side's
    ``setRank1`` order (gpusets.singles), which keeps one optimal 8-GPU set whole after eight
    pods; the first free IDs (gpu-0..7) would have broken both from the fifth pod on."""
    devs, res, topo = setup("hgx-16-mesh")
    every = [g.index for g in devs.gpus]
    best8 = max(gpusets.set_score(topo, c) for c in itertools.combinations(every, 8))
    offered = [d.id for d in res.devices]
    taken: list[int] = []
    for _ in range(8):
        [one] = preferred.choose(res, topo, available=offered, must_include=[], size=1)
        taken += gpus_of(res, [one])
        offered.remove(one)
    assert taken == gpusets.singles(topo, every, every, max_ranks=8)
    assert taken != list(range(8))
    free = [i for i in every if i not in taken]
    assert any(gpusets.set_score(topo, c) == best8 for c in itertools.combinations(free, 8))
    # With must_include the kubelet decides; time-sliced replicas still spread.
    [kept] = preferred.choose(res, topo, available=offered, must_include=[offered[-1]], size=1)
    assert kept == offered[-1]
