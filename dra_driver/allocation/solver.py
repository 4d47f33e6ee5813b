"""Exact allocation search: is there any way to satisfy the claim, and which way is best?

Why it exists: the scheduler stops at the first devices that fit. We want the same yes/no
answer but the best topology among *all* fitting choices, so the search is reorganised around
what makes claims hard:

* ``firstAvailable`` alternatives are taken in order: the first combination of alternatives
  (lexicographically, request by request) that can be satisfied is the one used;
* each ``matchAttribute`` constraint is fixed to one value at a time, which turns the claim into
  requests with plain candidate sets;
* whether distinct devices can cover all requests is a bipartite matching question;
* which devices to take is :func:`placement.best_subset` over the union of candidates, scored
  over the whole claim (pairs across requests count too), ties going to the earliest devices.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator, Sequence

from dra_driver import records
from dra_driver.allocation import claim, placement, pools, selection

MAX_VECTORS = 10_000  # combinations of firstAvailable alternatives tried before giving up


@records.record
class Plan:
    """Devices (positions, ascending) per request group, in the claim's request order."""

    picks: tuple[tuple[claim.Request, tuple[int, ...]], ...]
    score: placement.Score
    optimal: bool

    @property
    def positions(self) -> tuple[int, ...]:
        return tuple(sorted(p for _, chosen in self.picks for p in chosen))


@dataclasses.dataclass(slots=True)
class _Instance:
    """One alternative per group, constraints fixed: plain candidate lists and counts."""

    alts: list[claim.Request]
    fixed: list[list[int] | None]  # allocationMode All: exactly these devices
    cands: list[list[int]]  # ExactCount: candidates (ascending), fixed devices removed


def assign(
    counts: Sequence[int], cands: Sequence[Sequence[int]], items: Sequence[int] | None = None
) -> list[list[int]] | None:
    """Distinct devices for every slot: ``counts[j]`` of ``cands[j]`` (limited to ``items``).

    Simple augmenting paths; slots are filled in request order with the lowest devices first.
    Returns the devices per request (ascending) or ``None`` when impossible.
    """
    allowed = None if items is None else set(items)
    cand_lists = [[c for c in cs if allowed is None or c in allowed] for cs in cands]
    owner: dict[int, int] = {}  # device -> slot
    slots = [j for j, n in enumerate(counts) for _ in range(n)]

    def augment(slot: int, seen: set[int]) -> bool:
        for dev in cand_lists[slots[slot]]:
            if dev not in owner:  # a free device first: keeps earlier slots on lower devices
                owner[dev] = slot
                return True
        for dev in cand_lists[slots[slot]]:
            if dev in seen:
                continue
            seen.add(dev)
            if dev not in owner or augment(owner[dev], seen):
                owner[dev] = slot
                return True
        return False

    for slot in range(len(slots)):
        if not augment(slot, set()):
            return None
    out: list[list[int]] = [[] for _ in counts]
    for dev, slot in owner.items():
        out[slots[slot]].append(dev)
    return [sorted(x) for x in out]


class Solver:
    """Exact search for one claim over the devices of a :class:`selection.Selection`."""

    def __init__(
        self,
        parsed: claim.Claim,
        sel: selection.Selection,
        *,
        weights: placement.Weights,
        pools_ok: bool,
        conflict: Callable[[Sequence[int]], bool] | None = None,
    ) -> None:
        """``conflict``: whether chosen devices cannot be allocated together (they share a
        GPU's counter); ``None`` when no two candidates can conflict."""
        self.claim = parsed
        self.sel = sel
        self.weights = weights
        self.pools_ok = pools_ok  # no incomplete or invalid pool on the node
        self.conflict = conflict
        self.n = len(sel.devices)

    def vectors(self) -> Iterator[list[claim.Request]]:
        ranges = [g.alternatives for g in self.claim.groups]
        for combo in itertools.islice(itertools.product(*ranges), MAX_VECTORS):
            yield list(combo)

    def solve(self) -> Plan | None:
        for alts in self.vectors():
            instances = list(self.instances(alts))
            if instances:
                return self._best(instances)
        return None

    def _base(self, alts: list[claim.Request]) -> _Instance | None:
        fixed: list[list[int] | None] = []
        cands: list[list[int]] = []
        taken: set[int] = set()
        for req in alts:
            if req.mode == claim.ALL:
                if not self.pools_ok:
                    return None
                everything = [p for p in range(self.n) if self.sel.matches(req, p)]
                if not everything or any(not self.sel.usable(req, p) for p in everything):
                    return None
                if taken & set(everything):
                    return None
                taken |= set(everything)
                fixed.append(everything)
                cands.append([])
            else:
                fixed.append(None)
                cands.append([p for p in range(self.n) if self.sel.usable(req, p)])
        total = sum(len(f) if f is not None else r.count for f, r in zip(fixed, alts, strict=True))
        if total > claim.MAX_RESULTS:
            return None
        cands = [[p for p in cs if p not in taken] for cs in cands]
        return _Instance(alts, fixed, cands)

    def instances(self, alts: list[claim.Request]) -> Iterator[_Instance]:
        """Every feasible way to fix the constraint values for this choice of alternatives."""
        base = self._base(alts)
        if base is None:
            return
        active = [c for c in self.claim.constraints if any(c.applies(a) for a in alts)]
        yield from self._fix(base, active)

    def _key(self, pos: int, attribute: str) -> tuple[str, object] | None:
        return pools.attribute_key(pools.lookup_attribute(self.sel.devices[pos], attribute))

    def _fix(self, inst: _Instance, todo: list[claim.Constraint]) -> Iterator[_Instance]:
        counts = [r.count if f is None else 0 for r, f in zip(inst.alts, inst.fixed, strict=True)]
        if any(len(c) < n for c, n in zip(inst.cands, counts, strict=True)):
            return
        if not todo:
            if assign(counts, inst.cands) is not None:
                yield inst
            return
        con, rest = todo[0], todo[1:]
        covered = [j for j, a in enumerate(inst.alts) if con.applies(a)]
        fixed_keys = {self._key(p, con.attribute) for j in covered for p in inst.fixed[j] or ()}
        if fixed_keys:
            if len(fixed_keys) != 1 or None in fixed_keys:
                return
            values = list(fixed_keys)
        else:
            values = list(
                dict.fromkeys(
                    k
                    for j in covered
                    for p in inst.cands[j]
                    if (k := self._key(p, con.attribute)) is not None
                )
            )
        for value in values:
            cands = [
                [p for p in cs if self._key(p, con.attribute) == value] if j in covered else cs
                for j, cs in enumerate(inst.cands)
            ]
            yield from self._fix(_Instance(inst.alts, inst.fixed, cands), rest)

    def _best(self, instances: list[_Instance]) -> Plan:
        best: tuple[int, tuple[int, ...], list[list[int]], bool] | None = None
        for inst in instances:
            found = self._optimise(inst)
            packed = self.weights.packed(found[0])
            if best is None or packed > best[0] or (packed == best[0] and found[0] < best[1]):
                best = (packed, found[0], found[1], found[2])
        if best is None:
            raise RuntimeError("no instance was optimised")
        _, _, per_request, optimal = best
        picks = tuple(
            (alt, tuple(chosen)) for alt, chosen in zip(instances[0].alts, per_request, strict=True)
        )
        return Plan(picks, self.weights.unpack(best[0]), optimal)

    def _optimise(self, inst: _Instance) -> tuple[tuple[int, ...], list[list[int]], bool]:
        """(all positions sorted, positions per request, proven optimal)."""
        must = sorted(p for f in inst.fixed for p in f or ())
        counts = [r.count if f is None else 0 for r, f in zip(inst.alts, inst.fixed, strict=True)]
        exact = [j for j, n in enumerate(counts) if n]
        union = sorted({p for j in exact for p in inst.cands[j]})
        k = sum(counts)
        simple = len(exact) <= 1 or all(inst.cands[j] == inst.cands[exact[0]] for j in exact)
        conflict = self.conflict
        if simple and conflict is None:
            found = placement.best_subset(self.weights, union, k, must=must)
        else:

            def feasible(items: tuple[int, ...]) -> bool:
                if conflict is not None and conflict((*must, *items)):
                    return False
                return simple or assign(counts, inst.cands, items) is not None

            found = placement.best_subset(self.weights, union, k, must=must, feasible=feasible)
        if found is not None:
            chosen, optimal = found.items, found.optimal
        else:  # node limit hit before any feasible set: fall back to the plain matching
            fallback = assign(counts, inst.cands)
            if fallback is None:
                raise RuntimeError("the plain matching found no set the search had found")
            chosen, optimal = tuple(p for x in fallback for p in x), False
        per = assign(counts, inst.cands, chosen)
        if per is None:
            raise RuntimeError("the chosen devices do not match the requests")
        per_request = [sorted(f) if f is not None else per[j] for j, f in enumerate(inst.fixed)]
        return tuple(sorted((*must, *chosen))), per_request, optimal
