"""Exact best-subset search for topology-aware placement, shared by the allocator and the device
plugin's ``GetPreferredAllocation``.

Why it exists: the scheduler takes the first devices that fit, and a greedy "add the best next
GPU" choice misses cube-mesh quads and cross-linked halves. Both callers need the *optimal* set
of ``k`` GPUs: most NVLink links inside the set, then most pairs on one NUMA node, then most
pairs under one PCIe root (:meth:`dra_driver.devices.topology.Topology.score` semantics), with
ties broken towards the lowest candidate positions so the answer is deterministic.

The search is a branch and bound over candidates in preference order (include before exclude,
so complete sets are met in lexicographic order). The bound adds, for every remaining
candidate, its gain towards the chosen set plus half of its best possible links to the other
items still to come. Interchangeable candidates (same weight to every other item) are only taken
in order, which collapses the symmetric NVSwitch systems. The three score components are packed
into one integer so that comparing sums is comparing score tuples.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TypeVar

from dra_driver import records
from dra_driver.devices import topology as topo_mod

Score = tuple[int, int, int]  # (NVLink links, same-NUMA pairs, same-PCIe-root pairs)
Feasible = Callable[[tuple[int, ...]], bool]

DEFAULT_NODE_LIMIT = 200_000
_T = TypeVar("_T")


@records.record
class Placement:
    """The chosen items (sorted, ``must`` items excluded) and the score of all of them."""

    items: tuple[int, ...]
    score: Score
    optimal: bool  # False only when the node limit stopped the search early
    nodes: int  # search nodes visited (a measure of the work done)


class Weights:
    """Pairwise placement weights over items ``0..n-1``, packed into integers.

    A pair's ``(links, numa, root)`` becomes ``links * B * B + numa * B + root`` with ``B``
    larger than the number of pairs of ``n`` items, so sums never carry between components.
    An item may have a score of its own (``own``: a device standing for several GPUs scores the
    pairs among them); ``pairs`` then bounds the GPU pairs any choice can hold.
    """

    def __init__(
        self,
        pair_scores: Sequence[Sequence[Score]],
        *,
        own: Sequence[Score] | None = None,
        pairs: int | None = None,
    ) -> None:
        n = len(pair_scores)
        self.base = (n * (n - 1) // 2 if pairs is None else pairs) + 1
        b = self.base
        self.matrix: list[list[int]] = [
            [0 if i == j else self._pack(pair_scores[i][j], b) for j in range(n)] for i in range(n)
        ]
        self.own: list[int] = [self._pack(s, b) for s in own] if own else [0] * n

    @staticmethod
    def _pack(score: Score, base: int) -> int:
        links, numa, root = score
        return (links * base + numa) * base + root

    def unpack(self, packed: int) -> Score:
        b = self.base
        return packed // (b * b), (packed // b) % b, packed % b

    def packed(self, items: Iterable[int]) -> int:
        chosen = list(items)
        m = self.matrix
        return sum(m[a][c] for a, c in itertools.combinations(chosen, 2)) + sum(
            self.own[a] for a in chosen
        )

    def score(self, items: Iterable[int]) -> Score:
        return self.unpack(self.packed(items))

    @classmethod
    def from_topology(cls, topo: topo_mod.Topology, gpu_indices: Sequence[int | None]) -> Weights:
        """Weights over items that are GPUs (by index); ``None`` = an item with no known GPU."""
        return cls(_symmetric(gpu_indices, lambda a, b: _pair(topo, a, b)))

    @classmethod
    def from_attributes(cls, keys: Sequence[tuple[Hashable, Hashable, Hashable]]) -> Weights:
        """Weights when only published attributes are known: one item's ``(island, numa, root)``.

        Two items on the same NVLink island count as one link; ``None`` never matches.
        """

        def same(a: tuple[Hashable, ...], b: tuple[Hashable, ...]) -> Score:
            return (
                int(a[0] is not None and a[0] == b[0]),
                int(a[1] is not None and a[1] == b[1]),
                int(a[2] is not None and a[2] == b[2]),
            )

        return cls(_symmetric(keys, same))


def _symmetric(items: Sequence[_T | None], pair: Callable[[_T, _T], Score]) -> list[list[Score]]:
    """The full pair-score matrix from the upper triangle (``None`` items score nothing)."""
    n = len(items)
    rows: list[list[Score]] = [[(0, 0, 0)] * n for _ in range(n)]
    for i, j in itertools.combinations(range(n), 2):
        a, b = items[i], items[j]
        if a is not None and b is not None:
            rows[i][j] = rows[j][i] = pair(a, b)
    return rows


def _pair(topo: topo_mod.Topology, a: int, b: int) -> Score:
    """Pair score; two items on the same GPU (MIG devices) share its NUMA node and root."""
    links = topo.links(a, b)
    na, nb = topo.numa_of.get(a), topo.numa_of.get(b)
    ra, rb = topo.pcie_root_of.get(a), topo.pcie_root_of.get(b)
    return (
        links,
        int(na is not None and na == nb),
        int(ra is not None and ra == rb),
    )


def best_subset(
    weights: Weights,
    candidates: Sequence[int],
    k: int,
    *,
    must: Sequence[int] = (),
    feasible: Feasible | None = None,
    node_limit: int = DEFAULT_NODE_LIMIT,
) -> Placement | None:
    """The best ``k`` candidates to add to ``must`` (``None`` when no feasible set exists).

    ``candidates`` are item ids in preference order; among equally scored sets the one whose
    positions in that order are lexicographically smallest wins. ``feasible`` (optional) is
    checked on complete sets (candidate ids, sorted by position).
    """
    cands = [c for c in dict.fromkeys(candidates) if c not in set(must)]
    m = len(cands)
    if k < 0 or k > m:
        return None
    mat = weights.matrix
    base_score = weights.packed(must)
    if k == 0:
        if feasible is not None and not feasible(()):
            return None
        return Placement((), weights.unpack(base_score), True, 1)
    w = [[mat[a][b] for b in cands] for a in cands]
    gain0 = [sum(mat[a][x] for x in must) + weights.own[a] for a in cands]
    if feasible is None and all(g == 0 for g in gain0) and all(v == 0 for row in w for v in row):
        return Placement(tuple(cands[:k]), weights.unpack(base_score), True, 1)
    search = _Search(w, gain0, k, feasible=feasible, cands=cands, node_limit=node_limit)
    search.run()
    if search.best_set is None:
        return None
    items = tuple(cands[p] for p in search.best_set)
    return Placement(
        items, weights.unpack(base_score + search.best_score), not search.aborted, search.nodes
    )


class _Search:
    """One branch-and-bound run over candidate positions ``0..m-1``."""

    def __init__(
        self,
        w: list[list[int]],
        gain0: list[int],
        k: int,
        *,
        feasible: Feasible | None,
        cands: list[int],
        node_limit: int,
    ) -> None:
        self.w = w
        self.m = len(w)
        self.k = k
        self.gain = list(gain0)
        self.feasible = feasible
        self.cands = cands
        self.node_limit = node_limit
        self.nodes = 0
        self.aborted = False
        self.chosen: list[int] = []
        self.is_chosen = [False] * self.m
        self.suffix_pairs = self._suffix_pairs()
        self.best_set: tuple[int, ...] | None = None
        self.best_score = -1
        self.prev_twin = self._twins() if feasible is None else [-1] * self.m
        self.top = self._top_tables()

    def _twins(self) -> list[int]:
        """For each position, the previous interchangeable position (or -1)."""
        w, m, gain = self.w, self.m, self.gain
        prev = [-1] * m
        last_of_class: list[int] = []
        for q in range(m):
            rq = w[q]
            for idx, p in enumerate(last_of_class):
                rp = w[p]  # p < q: equal rows apart from the p and q columns
                if (
                    gain[p] == gain[q]
                    and rp[:p] == rq[:p]
                    and rp[p + 1 : q] == rq[p + 1 : q]
                    and rp[q + 1 :] == rq[q + 1 :]
                ):
                    prev[q] = p
                    last_of_class[idx] = q
                    break
            else:
                last_of_class.append(q)
        return prev

    def _suffix_pairs(self) -> list[int]:
        """``suffix_pairs[pos]``: total weight of the pairs among positions ``pos..m-1``."""
        w, m = self.w, self.m
        out = [0] * (m + 1)
        for pos in range(m - 1, -1, -1):
            out[pos] = out[pos + 1] + sum(w[pos][pos + 1 :])
        return out

    def _top_tables(self) -> list[list[list[int]]]:
        """``top[pos][x - pos][j]``: sum of the ``j`` largest ``w[x][z]`` (``z >= pos``, not x)."""
        w, m, width = self.w, self.m, self.k - 1
        top: list[list[list[int]]] = []
        for pos in range(m):
            rows: list[list[int]] = []  # rows[x - pos]
            for x in range(pos, m):
                row = w[x]
                vals = sorted(row[pos:x] + row[x + 1 :], reverse=True)[:width]
                # Read at index r - 1 only while more than r positions remain (so r - 1 is
                # below both k - 1 and the m - pos - 1 other entries): no padding needed.
                rows.append(list(itertools.accumulate(vals, initial=0)))
            top.append(rows)
        return top

    def run(self) -> None:
        # The heuristic's set may be infeasible: with a predicate the search starts empty.
        start = self._greedy() if self.feasible is None else None
        if start is not None:
            # Demand strict improvement over (score - 1): the lexicographically first set that
            # scores at least as well as the heuristic is still met and recorded by the search.
            self.best_set, self.best_score = start[0], start[1] - 1
        self._dfs(0, 0, list(self.gain), self.k)
        if start is not None and self.best_score == start[1] - 1:
            self.best_score = start[1]  # only when the node limit stopped the search

    def _greedy(self) -> tuple[tuple[int, ...], int]:
        """Greedy pick plus one-swap improvement: a good starting incumbent."""
        w, m, k = self.w, self.m, self.k
        gain = list(self.gain)
        chosen: list[int] = []
        for _ in range(k):
            best = max((x for x in range(m) if x not in chosen), key=lambda x: (gain[x], -x))
            chosen.append(best)
            for x in range(m):
                gain[x] += w[best][x]
        in_set = set(chosen)
        improved = True
        while improved:
            improved = False
            for out in sorted(in_set):
                rest = in_set - {out}
                cur = self.gain[out] + sum(w[out][y] for y in rest)
                for inn in range(m):
                    if inn in in_set:
                        continue
                    new = self.gain[inn] + sum(w[inn][y] for y in rest)
                    if new > cur:
                        in_set = rest | {inn}
                        improved = True
                        break
                if improved:
                    break
        chosen_t = tuple(sorted(in_set))
        total = sum(self.gain[x] for x in chosen_t) + sum(
            w[a][b] for a, b in itertools.combinations(chosen_t, 2)
        )
        return chosen_t, total

    def _leaf(self, items: list[int], score: int) -> None:
        if score > self.best_score:
            found = tuple(items)
            if self.feasible is None or self.feasible(tuple(self.cands[p] for p in found)):
                self.best_set, self.best_score = found, score

    def _dfs(self, pos: int, cur: int, gain: list[int], r: int) -> None:
        """Visit sets extending ``chosen`` with ``r`` positions from ``pos`` on.

        ``gain[x]`` is what position ``x`` adds to the chosen set (and ``must``); ``cur`` is
        the chosen set's own score.
        """
        self.nodes += 1
        if self.nodes > self.node_limit:
            self.aborted = True
            return
        if r == 0:
            self._leaf(self.chosen, cur)
            return
        m = self.m
        left = m - pos
        if left <= r:
            if left == r:  # everything that remains
                self._leaf(
                    [*self.chosen, *range(pos, m)], cur + sum(gain[pos:]) + self.suffix_pairs[pos]
                )
            return
        r1 = r - 1
        vals = [2 * g + t[r1] for g, t in zip(gain[pos:], self.top[pos], strict=False)]
        vals.sort(reverse=True)
        if 2 * cur + sum(vals[:r]) <= 2 * self.best_score:
            return
        twin = self.prev_twin[pos]
        if twin < 0 or self.is_chosen[twin]:
            self.chosen.append(pos)
            self.is_chosen[pos] = True
            w_pos = self.w[pos]
            self._dfs(
                pos + 1, cur + gain[pos], [a + b for a, b in zip(gain, w_pos, strict=False)], r1
            )
            self.is_chosen[pos] = False
            self.chosen.pop()
            if self.aborted:
                return
        self._dfs(pos + 1, cur, gain, r)
