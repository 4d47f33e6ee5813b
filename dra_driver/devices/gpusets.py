"""The best free sets of N GPUs, ranked: what the node agent marks so that kube-scheduler's
first fit is the best fit.

Why it exists: kube-scheduler takes the first free devices that satisfy a claim, in slice order;
it never scores. The agent knows which of its GPUs are free (not held by a claim it prepared,
not unhealthy) and can tell the scheduler which N of them are best, by marking them: every GPU
gets, per set size N, its *rank* — 1 for the members of the best free N-set, 2 for the best
N-set once rank 1 is taken, and so on (0: in none). A claim asking first for "N GPUs of rank 1",
then "of rank 2", ..., then "any N" gets the best free set, and a burst of claims for N GPUs on
one node gets the sets a one-by-one allocation would give, before the agent has seen any of them
(docs/topology.md). The ranks are attributes of the GPU devices themselves: nothing else is
published, so the scheduler's cost stays that of one device per GPU, and a GPU is only ever
allocated as itself (two claims can never share one, whatever the ranks say).

Ranking: a set's score is (NVLink links between its members, pairs on one NUMA node, pairs under
one PCIe root), compared in that order; equal scores go to the set with the lowest minors
(lexicographically). The best-ranked N-subset of the free GPUs F is the optimum of F. Every
subset's rank key is computed once per topology by dynamic programming over bit masks, and the
subsets of each size sorted by it; the optimum of F for N is then the first N-subset inside F.

Until wave 3 the node published a device per useful set (``gpus-0-1-4-5``, type ``gpu-set``);
allocations of such devices made by earlier versions are still prepared (:func:`parse_name`).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from array import array
from collections.abc import Collection, Sequence

from dra_driver.devices import model, topology

MAX_GPUS = 16  # 2**16 subsets: the rank-key table stays small and quick to build
MAX_RANKS = 7  # ranked sets per size (a claim's firstAvailable holds 8 alternatives)

Score = tuple[int, int, int]  # (NVLink links, same-NUMA pairs, same-PCIe-root pairs)


@dataclasses.dataclass(frozen=True, slots=True)
class GpuSet:
    """N GPUs, ``gpus`` sorted by minor, with their score."""

    gpus: tuple[model.Gpu, ...]
    score: Score

    @property
    def size(self) -> int:
        return len(self.gpus)

    @property
    def minors(self) -> tuple[int, ...]:
        return tuple(g.minor for g in self.gpus)


def device_name(minors: Sequence[int]) -> str:
    """``gpus-0-1-4-5``: the name a set device of earlier versions had (minors sorted)."""
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


def ranked(
    devices: model.NodeDevices, *, taken: Collection[str] = (), max_ranks: int = MAX_RANKS
) -> dict[int, tuple[GpuSet, ...]]:
    """Per size N (2 up to the number of eligible GPUs minus one), the ranked N-sets of the
    free GPUs: the optimum of the free GPUs, then the optimum of what is left, and so on while
    N GPUs are left (at most ``max_ranks``). ``taken``: names of GPUs that are not free.

    Nodes with fewer than 3 or more than :data:`MAX_GPUS` eligible GPUs get no ranks.
    """
    gpus = eligible(devices)
    n = len(gpus)
    if not 3 <= n <= MAX_GPUS:
        return {}
    topo = topology.build(devices)
    pairs = tuple(
        tuple(_pair(topo, a.index, b.index) if a is not b else (0, 0, 0) for b in gpus)
        for a in gpus
    )
    order = _ordered(pairs)
    free = sum(1 << i for i, g in enumerate(gpus) if g.name not in taken)
    out: dict[int, tuple[GpuSet, ...]] = {}
    for size in range(2, n):
        chain: list[GpuSet] = []
        left = free
        while len(chain) < max_ranks and left.bit_count() >= size:
            mask = _best_fit(order[size], left)
            members = tuple(gpus[i] for i in range(n) if mask >> i & 1)
            chain.append(GpuSet(members, set_score(topo, [g.index for g in members])))
            left &= ~mask
        out[size] = tuple(chain)
    return out


def _pair(topo: topology.Topology, a: int, b: int) -> Score:
    na, nb = topo.numa_of.get(a), topo.numa_of.get(b)
    ra, rb = topo.pcie_root_of.get(a), topo.pcie_root_of.get(b)
    return (
        topo.links(a, b),
        int(na is not None and na == nb),
        int(ra is not None and ra == rb),
    )


@functools.lru_cache(maxsize=16)
def _keys(pairs: tuple[tuple[Score, ...], ...]) -> array[int]:
    """Every subset's rank key, indexed by bit mask: ``packed score << n | reversed mask`` (the
    reversed mask is larger for the subset holding the lower minors), so among subsets of one
    size a larger key is a better set."""
    n = len(pairs)
    base = n * (n - 1) // 2 + 1
    w = [[(p[0] * base + p[1]) * base + p[2] for p in row] for row in pairs]
    full = 1 << n
    score = [0] * full
    keys = array("Q", bytes(8 * full))
    rev = [0] * full
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
        keys[m] = (s << n) | rev[m]
    return keys


@functools.lru_cache(maxsize=16)
def _ordered(pairs: tuple[tuple[Score, ...], ...]) -> dict[int, array[int]]:
    """Per size, every subset's mask, best first (by :func:`_keys`): built once per topology
    (~0.1 s for 16 GPUs), so a re-rank is a scan for the first set inside the free GPUs."""
    keys = _keys(pairs)
    by_size: dict[int, list[int]] = {}
    for mask in range(1, 1 << len(pairs)):
        by_size.setdefault(mask.bit_count(), []).append(mask)
    return {
        size: array("Q", sorted(masks, key=keys.__getitem__, reverse=True))
        for size, masks in by_size.items()
    }


def _best_fit(ordered: array[int], left: int) -> int:
    """The first (best) mask of ``ordered`` inside ``left`` (one exists: ``left`` has enough
    GPUs)."""
    outside = ~left
    for mask in ordered:
        if not mask & outside:
            return mask
    raise AssertionError("no subset of the free GPUs has that size")  # pragma: no cover


def set_score(topo: topology.Topology, indices: Sequence[int]) -> Score:
    """The score of GPUs (by index) as this module ranks sets."""
    total = [0, 0, 0]
    for a, b in itertools.combinations(indices, 2):
        for i, v in enumerate(_pair(topo, a, b)):
            total[i] += v
    return total[0], total[1], total[2]
