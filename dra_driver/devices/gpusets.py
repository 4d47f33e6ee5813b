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

Single GPUs (:func:`singles`): a claim for one GPU breaks the fewest good sets when it takes
the GPU whose loss leaves the best sets of the sizes jobs ask for. The agent orders the free
GPUs greedily: the first is the GPU whose removal leaves the best remaining sets, compared
lexicographically over set sizes, powers of two first and largest first (8, 4, 2 on a 16-GPU
node; then the other sizes, largest first), ties to the lowest minor; the second is that GPU of
what the first leaves, and so on. Published as rank ``k`` of size 1 for the ``k``-th GPU, a
burst of single-GPU claims takes them in that order.

Until wave 3 the node published a device per useful set (``gpus-0-1-4-5``, type ``gpu-set``);
allocations of such devices made by earlier versions are still prepared (:func:`parse_name`).
"""

from __future__ import annotations

import functools
import itertools
from array import array
from collections.abc import Collection, Sequence

from dra_driver import records
from dra_driver.devices import model, topology

MAX_GPUS = 16  # 2**16 subsets: the rank-key table stays small and quick to build
MAX_RANKS = 7  # ranked sets per size (a claim's firstAvailable holds 8 alternatives)

Score = tuple[int, int, int]  # (NVLink links, same-NUMA pairs, same-PCIe-root pairs)


@records.record
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
    Size 1 holds the free GPUs in the order single-GPU claims should take them
    (:func:`singles`), at most ``max_ranks`` of them.

    Nodes with fewer than 3 or more than :data:`MAX_GPUS` eligible GPUs get no ranks.
    """
    gpus = eligible(devices)
    n = len(gpus)
    if not 3 <= n <= MAX_GPUS:
        return {}
    topo = topology.build(devices)
    pairs = _pairs(topo, [g.index for g in gpus])
    order = _ordered(pairs)
    free = sum(1 << i for i, g in enumerate(gpus) if g.name not in taken)
    out: dict[int, tuple[GpuSet, ...]] = {
        1: tuple(GpuSet((gpus[i],), (0, 0, 0)) for i in _order(pairs, free, max_ranks))
    }
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


def singles(
    topo: topology.Topology,
    indices: Sequence[int],
    free: Collection[int],
    *,
    max_ranks: int = MAX_RANKS,
) -> list[int]:
    """The free GPUs (by index) in the order single-GPU claims should take them (at most
    ``max_ranks``): each the GPU whose loss leaves the best sets of what is still free (see the
    module docstring). ``indices``: the node's full GPUs, in minor order (ties go to the first);
    ``free``: those not held. Empty for more than :data:`MAX_GPUS` GPUs."""
    if len(indices) > MAX_GPUS:
        return []
    held = set(indices) - set(free)
    mask = sum(1 << i for i, g in enumerate(indices) if g not in held)
    return [indices[i] for i in _order(_pairs(topo, indices), mask, max_ranks)]


def _pairs(topo: topology.Topology, indices: Sequence[int]) -> tuple[tuple[Score, ...], ...]:
    return tuple(
        tuple(_pair(topo, a, b) if a != b else (0, 0, 0) for b in indices) for a in indices
    )


def _order(pairs: tuple[tuple[Score, ...], ...], free: int, max_ranks: int) -> list[int]:
    out: list[int] = []
    while free and len(out) < max_ranks:
        i = _next_single(pairs, free)
        out.append(i)
        free &= ~(1 << i)
    return out


def key_sizes(remaining: int) -> list[int]:
    """The set sizes a single GPU's loss is judged by, in order, when ``remaining`` GPUs stay
    free: powers of two largest first (the sizes jobs ask for), then the others largest first."""
    sizes = range(remaining, 1, -1)
    return [s for s in sizes if s & (s - 1) == 0] + [s for s in sizes if s & (s - 1)]


@functools.lru_cache(maxsize=4096)
def _next_single(pairs: tuple[tuple[Score, ...], ...], left: int) -> int:
    """The GPU (bit) of ``left`` whose removal leaves the best sets (lowest bit on ties).

    Candidates are compared lazily, size by size in :func:`key_sizes` order, each size's best
    set found by scanning that size's subsets best first (:func:`_ordered`) for the first one
    the remaining GPUs hold: most candidates are decided by the first size or two."""
    n = len(pairs)
    keys = _keys(pairs)
    ordered = _ordered(pairs)
    sizes = key_sizes(left.bit_count() - 1)

    def best(free: int, size: int) -> int:  # the best size-subset of ``free`` (a mask)
        return next(m for m in ordered[size] if not m & ~free)

    vectors: dict[int, list[int]] = {}

    def component(i: int, j: int) -> int:  # candidate i's score for sizes[j], lazily
        got = vectors.setdefault(i, [])
        while len(got) <= j:
            got.append(keys[best(left & ~(1 << i), sizes[len(got)])] >> n)
        return got[j]

    def beats(a: int, b: int) -> bool:
        for j in range(len(sizes)):
            x, y = component(a, j), component(b, j)
            if x != y:
                return x > y
        return False

    # No GPU's loss leaves better sets than ``left`` has; a GPU in none of its best sets leaves
    # all of them: the first such GPU wins unless an earlier one does as well.
    members = 0
    for size in sizes:
        members |= best(left, size)
    champion = -1
    bit = left
    while bit:
        low = bit & -bit
        bit ^= low
        i = low.bit_length() - 1
        if champion < 0:
            champion = i
        elif not members & low:
            return i if beats(i, champion) else champion
        elif beats(i, champion):
            champion = i
    return champion


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


def _best_by_size(keys: array[int], left: int) -> dict[int, int]:
    """Size -> the mask of the best subset of ``left`` of that size (one pass over subsets)."""
    best: dict[int, int] = {}
    top: dict[int, int] = {}
    sub = left
    while sub:
        size = sub.bit_count()
        key = keys[sub]
        if key > top.get(size, -1):
            top[size] = key
            best[size] = sub
        sub = (sub - 1) & left
    return best


def set_score(topo: topology.Topology, indices: Sequence[int]) -> Score:
    """The score of GPUs (by index) as this module ranks sets."""
    total = [0, 0, 0]
    for a, b in itertools.combinations(indices, 2):
        for i, v in enumerate(_pair(topo, a, b)):
            total[i] += v
    return total[0], total[1], total[2]


def subset_keys(pairs: tuple[tuple[Score, ...], ...]) -> array[int]:
    """Every subset's rank key for the pair scores ``pairs`` (row ``i``: GPU ``i``'s score with
    each other GPU), indexed by bit mask, as :func:`ranked` compares sets: among subsets of one
    size a larger key is a better set, and ``key >> len(pairs)`` is the set's packed score
    (equal for equally good sets). For :mod:`dra_driver.allocation.setfit`, which ranks
    the sets of nodes known only by their slices."""
    return _keys(pairs)


def best_subsets(keys: array[int], left: int) -> dict[int, int]:
    """Size -> the bit mask of the best subset of ``left`` of that size (:func:`subset_keys`'
    keys), as the ranks pick it."""
    return _best_by_size(keys, left)
