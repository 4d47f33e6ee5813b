"""Which multi-GPU sets a node publishes so that kube-scheduler's first fit is the best fit.

Why it exists: kube-scheduler takes the first free devices that satisfy a claim, in slice order;
it never scores. A claim asking for *one* device standing for N GPUs therefore gets the first
free such device we publish. If those "GPU set" devices are published best first, and for every
way the node can be occupied some optimal free N-set is among them, the scheduler's first fit
is an optimal N-set. This module decides which sets those are.

Ranking: a set's score is (NVLink links between its members, pairs on one NUMA node, pairs under
one PCIe root), compared in that order; equal scores go to the set with the lowest minors
(lexicographically). Call the best-ranked N-subset of the free GPUs F the optimum of F.

Which sets suffice: a set G is the optimum of some F larger than G exactly when it is the
optimum of G plus one more GPU (any optimum of F is also the optimum of every smaller F' between
it and F). So the sets needed are the optima of all free sets with more than N GPUs; a free set
of exactly N GPUs needs nothing (a plain ``count: N`` fallback takes all of them). We compute the
optimum of every free set by dynamic programming over bit masks (the optimum of F is the best of
the optima of F minus one GPU), which also gives each set a weight: the probability that it is
the optimum when a uniformly random number of GPUs (0 to G-N) is taken, uniformly at random.

Budget: on 8-GPU machines all needed sets number ~100 (DGX-1 97, DGX H100 83); on an irregular
16-GPU mesh they number ~28 000, far too many devices to publish. Up to :data:`MAX_SETS` sets
are published; beyond that the heaviest sets are kept, so the common occupancies stay optimal
and the rest fall back to the best published set that is free. Nodes with more than
:data:`MAX_GPUS` full GPUs publish no sets.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Sequence

from dra_driver.devices import model, topology

MAX_GPUS = 16  # 2**16 free sets per size: the dynamic program stays at a few seconds
MAX_SETS = 1024  # set devices per node (16 slices of 64 devices)

Score = tuple[int, int, int]  # (NVLink links, same-NUMA pairs, same-PCIe-root pairs)


@dataclasses.dataclass(frozen=True, slots=True)
class GpuSet:
    """N GPUs published as one device; ``gpus`` sorted by minor."""

    gpus: tuple[model.Gpu, ...]
    score: Score
    weight: float  # probability of being the optimum of a random occupancy (see module doc)

    @property
    def size(self) -> int:
        return len(self.gpus)

    @property
    def minors(self) -> tuple[int, ...]:
        return tuple(g.minor for g in self.gpus)


def device_name(minors: Sequence[int]) -> str:
    """``gpus-0-1-4-5``: a set device's name, made of its members' minors (sorted)."""
    return "gpus-" + "-".join(str(m) for m in sorted(minors))


def parse_name(name: str) -> tuple[int, ...] | None:
    """The minors of a set device name; ``None`` when ``name`` is not one."""
    if not name.startswith("gpus-"):
        return None
    parts = name[len("gpus-") :].split("-")
    if len(parts) < 2 or not all(p.isdigit() and (p == "0" or p[0] != "0") for p in parts):
        return None
    minors = tuple(int(p) for p in parts)
    if list(minors) != sorted(set(minors)):
        return None
    return minors


def eligible(devices: model.NodeDevices) -> list[model.Gpu]:
    """Full GPUs (not in MIG mode), sorted by minor: the members sets are made of."""
    return sorted((g for g in devices.gpus if not g.mig_enabled), key=lambda g: (g.minor, g.index))


def choose(devices: model.NodeDevices, *, budget: int = MAX_SETS) -> list[GpuSet]:
    """The sets to publish, by size, each size best first."""
    gpus = eligible(devices)
    if not 3 <= len(gpus) <= MAX_GPUS or budget <= 0:
        return []
    topo = topology.build(devices)
    n = len(gpus)
    pairs = tuple(
        tuple(_pair(topo, a.index, b.index) if a is not b else (0, 0, 0) for b in gpus)
        for a in gpus
    )
    found = _needed(pairs)
    if sum(len(v) for v in found.values()) > budget:
        ranked = sorted(
            ((w, size, key) for size, sets in found.items() for key, w in sets.items()),
            key=lambda t: (-t[0], t[1], -t[2]),
        )
        kept: dict[int, dict[int, float]] = {}
        for w, size, key in ranked[:budget]:
            kept.setdefault(size, {})[key] = w
        found = kept
    out: list[GpuSet] = []
    base = n * (n - 1) // 2 + 1
    for size in sorted(found):
        for key in sorted(found[size], reverse=True):
            mask = _unrev(key & ((1 << n) - 1), n)
            members = tuple(gpus[i] for i in range(n) if mask >> i & 1)
            packed = key >> n
            score = (packed // (base * base), (packed // base) % base, packed % base)
            out.append(GpuSet(members, score, found[size][key]))
    return out


def _pair(topo: topology.Topology, a: int, b: int) -> Score:
    na, nb = topo.numa_of.get(a), topo.numa_of.get(b)
    ra, rb = topo.pcie_root_of.get(a), topo.pcie_root_of.get(b)
    return (
        topo.links(a, b),
        int(na is not None and na == nb),
        int(ra is not None and ra == rb),
    )


def _unrev(rev: int, n: int) -> int:
    return sum(1 << (n - 1 - i) for i in range(n) if rev >> i & 1)


@functools.lru_cache(maxsize=16)
def _needed(pairs: tuple[tuple[Score, ...], ...]) -> dict[int, dict[int, float]]:
    """Size -> {set key: weight} for every set that is the optimum of a larger free set.

    A set's key orders sets by rank: ``packed score << n | reversed mask`` (the reversed mask
    is larger for the set holding the lower minors), so a larger key is a better set.
    """
    n = len(pairs)
    base = n * (n - 1) // 2 + 1
    w = [[(p[0] * base + p[1]) * base + p[2] for p in row] for row in pairs]
    full = 1 << n
    score = [0] * full
    rev = [0] * full
    levels: list[list[int]] = [[] for _ in range(n + 1)]
    levels[0].append(0)
    for m in range(1, full):
        low = m & -m
        rest = m ^ low
        row = w[low.bit_length() - 1]
        s = score[rest]
        x = rest
        while x:
            b = x & -x
            s += row[b.bit_length() - 1]
            x ^= b
        score[m] = s
        rev[m] = (rev[m >> 1] >> 1) | ((m & 1) << (n - 1))
        levels[m.bit_count()].append(m)
    out: dict[int, dict[int, float]] = {}
    for size in range(2, n):
        best = [0] * full
        for m in levels[size]:
            best[m] = (score[m] << n) | rev[m]
        weights: dict[int, float] = {}
        for k in range(size + 1, n + 1):
            p = 1.0 / ((n - size + 1) * math.comb(n, k))
            for m in levels[k]:
                # Some GPU among any size+1 members of m is not in its optimum, so the optimum
                # of m is the best optimum of m minus one of its size+1 lowest members.
                x, top, left = m, 0, size + 1
                while left:
                    low = x & -x
                    v = best[m ^ low]
                    if v > top:
                        top = v
                    x ^= low
                    left -= 1
                best[m] = top
                weights[top] = weights.get(top, 0.0) + p
        out[size] = weights
    return out


def set_score(topo: topology.Topology, indices: Sequence[int]) -> Score:
    """The score of GPUs (by index) as this module ranks sets."""
    total = [0, 0, 0]
    for a, b in itertools.combinations(indices, 2):
        for i, v in enumerate(_pair(topo, a, b)):
            total[i] += v
    return total[0], total[1], total[2]
