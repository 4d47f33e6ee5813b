"""The kube-scheduler's own search, step by step: first complete solution wins, errors abort.

Why it exists: the exact search in :mod:`.solver` knows *whether* devices can satisfy a claim,
but two verdicts depend on the order in which the scheduler happens to look at devices:

* a selector that fails to evaluate on a device (a missing attribute) aborts allocation, but
  only if the scheduler reaches that device before it has found a solution;
* a ``matchAttribute`` constraint that an ``allocationMode: All`` request cannot meet is an
  error, not a reason to try the next ``firstAvailable`` alternative.

So when errors are possible the allocator replays the scheduler's depth-first search
(requests in order, subrequests in order, each device slot trying devices in order, backtracking
on failure, at most 32 results) to get its verdict. Its picks also serve tests as "what the
scheduler would have chosen".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from dra_driver.allocation import claim, pools, selection

DEFAULT_BUDGET = 200_000


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """``allocated`` | ``unsatisfiable`` | ``error`` | ``undecided`` (budget exhausted)."""

    status: str
    picks: tuple[tuple[str, int], ...] = ()  # (result request name, device position)
    message: str = ""


class _Abort(Exception):
    pass


class _Exceeded(Exception):
    pass


class _Budget(Exception):
    pass


class _Search:
    def __init__(self, parsed: claim.Claim, sel: selection.Selection, *, budget: int) -> None:
        self.claim = parsed
        self.sel = sel
        self.budget = budget
        self.steps = 0
        self.allocating: set[int] = set()
        self.results: list[tuple[str, int]] = []
        self.con_value: list[tuple[str, object] | None] = [None] * len(parsed.constraints)
        self.con_count = [0] * len(parsed.constraints)
        self.all_devices: dict[str, list[int]] = {}

    def _check(self, req: claim.Request, pos: int) -> bool:
        found = self.sel.check(req, pos)
        if found is not None and found.error is not None:
            dev = self.sel.devices[pos].name
            raise _Abort(f"request {req.name}: {found.where} on {dev}: {found.error}")
        return found is None

    def validate(self, bad_pools: Sequence[pools.Pool]) -> None:
        minimum = 0
        for group in self.claim.groups:
            counts = []
            for req in group.alternatives:
                try:
                    self.sel.class_of(req)
                except selection.UnknownClassError as err:
                    raise _Abort(str(err)) from err
                if req.mode == claim.ALL:
                    if bad_pools:
                        pool = bad_pools[0]
                        state = "currently being updated" if pool.incomplete else "invalid"
                        raise _Abort(
                            f"request {req.name}: asks for all devices, but resource "
                            f"pool {pool.driver}/{pool.name} is {state}"
                        )
                    found = [p for p in range(len(self.sel.devices)) if self._check(req, p)]
                    self.all_devices[req.name] = found
                    counts.append(len(found))
                else:
                    counts.append(req.count)
            minimum += min(counts)
        if minimum > claim.MAX_RESULTS:
            raise _Abort(
                f"number of requested devices {minimum} exceeds the claim limit of "
                f"{claim.MAX_RESULTS}"
            )

    def one(self, gi: int, ai: int, slot: int, in_sub: bool) -> bool:
        self.steps += 1
        if self.steps > self.budget:
            raise _Budget
        groups = self.claim.groups
        if gi >= len(groups):
            return True
        group = groups[gi]
        if not in_sub and group.first_available:
            all_exceeded = True
            for alt in range(len(group.alternatives)):
                try:
                    ok = self.one(gi, alt, 0, True)
                except _Exceeded:
                    continue
                all_exceeded = False
                if ok:
                    return True
            if all_exceeded:
                raise _Exceeded
            return False
        req = group.alternatives[ai]
        everything = self.all_devices.get(req.name) if req.mode == claim.ALL else None
        if everything is not None and not everything:
            return False
        needed = len(everything) if everything is not None else req.count
        if slot >= needed:
            return self.one(gi + 1, 0, 0, False)
        if len(self.results) + needed - slot > claim.MAX_RESULTS:
            raise _Exceeded
        if everything is not None:
            return self._try(req, everything[slot], gi, ai, slot, in_sub, must=True)
        for pos in range(len(self.sel.devices)):
            if pos in self.allocating or (self.sel.in_use[pos] and not req.admin_access):
                continue
            if not self._check(req, pos):
                continue
            if self._try(req, pos, gi, ai, slot, in_sub, must=False):
                return True
        return False

    def _try(
        self, req: claim.Request, pos: int, gi: int, ai: int, slot: int, in_sub: bool, *, must: bool
    ) -> bool:
        if not self._add(req, pos, must=must):
            return False
        try:
            if self.one(gi, ai, slot + 1, in_sub):
                return True
        except (_Exceeded, _Budget, _Abort):
            self._remove(req, pos)
            raise
        self._remove(req, pos)
        return False

    def _add(self, req: claim.Request, pos: int, *, must: bool) -> bool:
        if pos in self.allocating or (self.sel.in_use[pos] and not req.admin_access):
            return False
        if self.sel.taint_blocks(req, pos) is not None:
            return False
        device = self.sel.devices[pos]
        added: list[int] = []
        for i, con in enumerate(self.claim.constraints):
            if not con.applies(req):
                continue
            key = pools.attribute_key(pools.lookup_attribute(device, con.attribute))
            ok = key is not None and (self.con_count[i] == 0 or key == self.con_value[i])
            if not ok:
                for j in added:
                    self.con_count[j] -= 1
                if must:
                    raise _Abort(
                        f"request {req.name}: cannot add device {device.name} because "
                        f"constraint matchAttribute {con.attribute} would not be "
                        "satisfied"
                    )
                return False
            if self.con_count[i] == 0:
                self.con_value[i] = key
            self.con_count[i] += 1
            added.append(i)
        self.allocating.add(pos)
        self.results.append((req.name, pos))
        return True

    def _remove(self, req: claim.Request, pos: int) -> None:
        for i, con in enumerate(self.claim.constraints):
            if con.applies(req):
                self.con_count[i] -= 1
        self.allocating.discard(pos)
        self.results.pop()


def emulate(
    parsed: claim.Claim,
    sel: selection.Selection,
    *,
    bad_pools: Sequence[pools.Pool],
    budget: int = DEFAULT_BUDGET,
) -> Verdict:
    """Replay the scheduler's search for one claim on the devices ``sel`` knows."""
    search = _Search(parsed, sel, budget=budget)
    try:
        search.validate(bad_pools)
        ok = search.one(0, 0, 0, False)
    except _Abort as err:
        return Verdict("error", message=str(err))
    except _Exceeded:
        ok = False
    except _Budget:
        return Verdict("undecided", message=f"gave up after {budget} search steps")
    if not ok:
        return Verdict("unsatisfiable")
    return Verdict("allocated", picks=tuple(search.results))
