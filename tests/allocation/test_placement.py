"""The exact best-subset search: equal to brute force, the known optima, speed, tie-breaking."""

from __future__ import annotations

import random

import oracles
import pytest

from dra_driver.allocation import placement
from dra_driver.devices import fake, topology


def _topo(profile: str) -> topology.Topology:
    return topology.build(fake.FakeBackend.from_name(profile).discover())


def _random_weights(rng: random.Random, n: int) -> placement.Weights:
    rows: list[list[placement.Score]] = [[(0, 0, 0)] * n for _ in range(n)]
    numa = [rng.randrange(2) for _ in range(n)]
    root = [rng.randrange(4) for _ in range(n)]
    for a in range(n):
        for b in range(a + 1, n):
            links = rng.choice((0, 0, 0, 1, 2, 3, 12))
            pair = (links, int(numa[a] == numa[b]), int(root[a] == root[b]))
            rows[a][b] = rows[b][a] = pair
    return placement.Weights(rows)


@pytest.mark.parametrize("seed", range(40))
def test_equals_brute_force_on_random_cases(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(2, 12)
    weights = _random_weights(rng, n)
    items = list(range(n))
    rng.shuffle(items)  # preference order is not index order
    must = items[: rng.randint(0, 2)]
    cands = [i for i in items if i not in must and rng.random() < 0.85]
    for k in range(0, len(cands) + 1):
        got = placement.best_subset(weights, cands, k, must=must)
        want = oracles.brute_force(weights, cands, k, must=must)
        assert got is not None and want is not None
        assert got.score == want.score, (k, got, want)
        # Ties go to the lexicographically smallest positions in the preference order.
        assert [cands.index(i) for i in got.items] == sorted(cands.index(i) for i in want.items)
        assert got.optimal


def test_feasibility_predicate_is_respected() -> None:
    rng = random.Random(7)
    weights = _random_weights(rng, 10)
    allowed = {frozenset(c) for c in [(0, 9, 5), (1, 2, 3), (4, 6, 8)]}

    def feasible(items: tuple[int, ...]) -> bool:
        return frozenset(items) in allowed

    got = placement.best_subset(weights, range(10), 3, feasible=feasible)
    want = oracles.brute_force(weights, range(10), 3, feasible=feasible)
    assert got is not None and want is not None
    assert got.score == want.score and set(got.items) == set(want.items)
    assert placement.best_subset(weights, range(10), 3, feasible=lambda _: False) is None


def test_dgx1_four_gpus_take_a_fully_connected_quad_with_nine_links() -> None:
    topo = _topo("dgx-1-v100")
    best = oracles.choose(topo, list(topo.indices), 4)
    assert best == [0, 1, 2, 3]
    assert topo.score(best)[0] == 9
    # Every pair of the quad is linked, and no quad has more links.
    assert all(topo.links(a, b) for a in best for b in best if a != b)
    weights = placement.Weights.from_topology(topo, list(topo.indices))
    brute = oracles.brute_force(weights, list(topo.indices), 4)
    assert brute is not None and brute.score[0] == 9
    # With GPU 0 busy the other board's quad is the only nine-link one left.
    assert oracles.choose(topo, [1, 2, 3, 4, 5, 6, 7], 4) == [4, 5, 6, 7]


def test_h100_nvl_two_gpus_take_a_bridged_pair() -> None:
    topo = _topo("h100-nvl-pairs")
    assert oracles.choose(topo, [0, 1, 2, 3], 2) == [0, 1]
    assert oracles.choose(topo, [1, 2, 3], 2) == [2, 3]
    assert oracles.choose(topo, [0, 2], 2) == [0, 2]  # nothing better is free
    assert oracles.choose(topo, [0, 1, 2], 4) is None


def test_must_include_is_kept_and_scored() -> None:
    topo = _topo("dgx-1-v100")
    got = oracles.choose(topo, list(range(8)), 2, must=[5])
    # GPU 5's 2-link peers are 1 and 6; 6 also shares its NUMA node and PCIe root.
    assert got == [5, 6]
    assert topo.score(got) == (2, 1, 1)


def test_switched_system_prefers_numa_then_pcie_root() -> None:
    topo = _topo("dgx-h100")
    # All pairs have 18 links; 0-1 share a root, 0-2 only a NUMA node.
    assert oracles.choose(topo, [0, 2, 3, 4], 2) == [2, 3]
    assert oracles.choose(topo, [0, 2, 4, 5], 3) == [0, 4, 5]


def test_node_limit_returns_best_found_and_says_not_optimal() -> None:
    topo = _topo("hgx-16-mesh")
    weights = placement.Weights.from_topology(topo, list(topo.indices))
    got = placement.best_subset(weights, range(16), 8, node_limit=3)
    assert got is not None and not got.optimal and len(got.items) == 8


def test_greedy_is_not_enough_on_the_16_gpu_profile() -> None:
    """The profile exists to show that a greedy pick is not optimal; ours is."""
    topo = _topo("hgx-16-mesh")
    weights = placement.Weights.from_topology(topo, list(topo.indices))
    chosen: list[int] = []
    for _ in range(8):
        chosen.append(
            max(
                (g for g in range(16) if g not in chosen),
                key=lambda g: (sum(weights.matrix[g][x] for x in chosen), -g),
            )
        )
    brute = oracles.brute_force(weights, range(16), 8)
    ours = placement.best_subset(weights, range(16), 8)
    assert brute is not None and ours is not None
    assert weights.score(chosen) < brute.score == ours.score


def test_16_choose_8_visits_few_nodes() -> None:
    """Brute force tries C(16, 8) = 12870 sets; the search visits a few hundred nodes (counted,
    not timed, so a loaded machine cannot flake it; an exponential regression still fails)."""
    topo = _topo("hgx-16-mesh")
    weights = placement.Weights.from_topology(topo, list(topo.indices))
    found = placement.best_subset(weights, range(16), 8)
    assert found is not None and found.optimal and found.nodes <= 250
    every_size = [placement.best_subset(weights, range(16), k) for k in range(1, 16)]
    assert sum(p.nodes for p in every_size if p is not None) <= 5300  # 4.8k measured


def test_attribute_weights_without_topology() -> None:
    keys = [("island-0", 0, "a"), ("island-0", 0, "b"), ("island-2", 1, "c"), (None, None, None)]
    weights = placement.Weights.from_attributes(keys)
    assert weights.score([0, 1]) == (1, 1, 0)
    assert weights.score([0, 2]) == (0, 0, 0)
    assert weights.score([3, 3]) == (0, 0, 0)
    got = placement.best_subset(weights, [3, 2, 1, 0], 2)
    assert got is not None and got.items == (1, 0) and got.score == (1, 1, 0)


@pytest.mark.parametrize("seed", range(10))
def test_items_with_a_score_of_their_own_equal_brute_force(seed: int) -> None:
    """Devices standing for several GPUs score the pairs among their GPUs themselves."""
    rng = random.Random(100 + seed)
    n = rng.randint(3, 9)
    base = _random_weights(rng, n)
    rows = [[base.unpack(base.matrix[a][b]) for b in range(n)] for a in range(n)]
    own = [(rng.choice((0, 0, 2, 9)), rng.randrange(2), rng.randrange(2)) for _ in range(n)]
    weights = placement.Weights(rows, own=own, pairs=n * n)
    for k in range(0, n + 1):
        got = placement.best_subset(weights, range(n), k)
        want = oracles.brute_force(weights, range(n), k)
        assert got is not None and want is not None
        assert got.score == want.score and got.items == want.items
