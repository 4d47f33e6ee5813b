"""Reference answers for the placement search (test oracles, not production code)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from dra_driver.allocation import placement
from dra_driver.devices import topology


def brute_force(
    weights: placement.Weights,
    candidates: Sequence[int],
    k: int,
    *,
    must: Sequence[int] = (),
    feasible: placement.Feasible | None = None,
) -> placement.Placement | None:
    """Every combination tried (same tie-breaking as :func:`placement.best_subset`)."""
    cands = [c for c in dict.fromkeys(candidates) if c not in set(must)]
    best: tuple[int, ...] | None = None
    best_score = -1
    count = 0
    for combo in itertools.combinations(cands, k):
        count += 1
        if feasible is not None and not feasible(combo):
            continue
        s = weights.packed((*must, *combo))
        if s > best_score:
            best, best_score = combo, s
    if best is None:
        return None
    return placement.Placement(best, weights.unpack(best_score), True, count)


def choose(
    topo: topology.Topology, available: Sequence[int], size: int, *, must: Sequence[int] = ()
) -> list[int] | None:
    """The best ``size`` GPU indices (``must`` included) out of ``available``."""
    indices = sorted(set(available) | set(must))
    pos = {gpu: i for i, gpu in enumerate(indices)}
    weights = placement.Weights.from_topology(topo, indices)
    forced = sorted(pos[g] for g in set(must))
    if len(forced) > size:
        return None
    cands = [pos[g] for g in sorted(set(available)) if g not in set(must)]
    found = placement.best_subset(weights, cands, size - len(forced), must=forced)
    if found is None:
        return None
    return sorted(indices[i] for i in (*forced, *found.items))
