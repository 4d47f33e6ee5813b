"""kube-scheduler's own device search, step for step: the allocation it would write.

Why it exists: ``simulate`` must predict what the real scheduler (v1.36, default feature gates:
the "incubating" structured allocator with prioritized lists, partitionable devices, device
taints, admin access and consumable capacity on) allocates, not what would be best. That
allocator is a depth-first search whose first complete solution wins:

* claims in order (a pod's claims are allocated together), requests in order, each
  ``firstAvailable`` subrequest in order until one works;
* each device slot of a request tries the devices after the one the previous slot took
  (pools by name, slices by name, devices in slice order), so a request's devices are tried as
  combinations in that order; the next request starts again from the first device;
* a device is skipped when allocated (unless the request has admin access, which only skips
  devices this claim already takes), when its selectors do not match, when what is left of its
  capacity does not cover the request's ``capacity.requests`` (:mod:`.capacity`), when its
  counters do not fit (:mod:`.counters`), when it carries a NoSchedule/NoExecute taint the
  request does not tolerate, or when a ``matchAttribute`` constraint would break (backtracking,
  not an error);
* a multi-allocatable device (``allowMultipleAllocations``) is never "in use": other claims and
  other requests of the same claim may take it again while capacity is left (a request's own
  devices are still distinct: each slot starts after the previous one). Each allocation is a
  share with its own ``shareID`` and ``consumedCapacity``. Its counters are charged only when
  the device has no capacity in use yet (no allocated share, none in this search): the first
  share books them, later shares skip the counter check; an allocated device with shares
  counts as allocated when the pool's counters are totted up, once;
* ``allocationMode: All`` takes exactly the matching devices; one that cannot be added stops
  that branch, and a constraint it breaks is an error;
* a selector that fails to evaluate on a device the search reaches is an error that aborts
  allocation on the node; more than 32 results per claim make that branch fail (a
  ``firstAvailable`` request then tries its next subrequest).

With a :class:`schedwork.Work` the search counts what the scheduler's would do: every device
its loop visits (in-use ones too; ``devices_visited``), every selector expression evaluated on a
miss of the per-(request, device) cache (``cel_evaluations``) and every counter check of a
device that consumes counters (``counter_checks``).

Known difference: 1.36 releases without the fix kubernetes/kubernetes#140431 (backported to
release-1.36 in July 2026 as #140663) do not give back the counters they booked for a candidate
that a taint or a constraint then rejects, nor those of a multi-allocatable device's first share
when they backtrack; such a scheduler can leave a pod pending that fits. Here every rejection
and backtrack gives back what it booked, as the fixed scheduler does.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from dra_driver import records
from dra_driver.allocation import capacity, claim, counters, pools, schedwork, selection

DEFAULT_BUDGET = 200_000  # search steps before giving up ("undecided")

Pick = tuple[str, int]  # (result request name, device position)


@records.record
class Verdict:
    """``allocated`` | ``unsatisfiable`` | ``error`` | ``undecided`` (budget exhausted)."""

    status: str
    picks: tuple[Pick, ...] = ()  # of the first claim, in result order
    message: str = ""
    steps: int = 0
    per_claim: tuple[tuple[Pick, ...], ...] = ()  # every claim's results


class _Abort(Exception):
    pass


class _Exceeded(Exception):
    pass


class _Budget(Exception):
    pass


def ledger_for(
    pool_list: Sequence[pools.Pool], allocated: Iterable[pools.DeviceId]
) -> counters.Ledger:
    """Counters left in each usable pool once the allocated devices took theirs."""
    used = set(allocated)
    books: dict[counters.PoolKey, tuple[counters.CounterSets, list[counters.Consumption]]] = {}
    for pool in pool_list:
        if pool.incomplete or pool.invalid:
            continue
        taken = [d.consumes for d in (*pool.devices, *pool.elsewhere) if d.id in used]
        books[(pool.driver, pool.name)] = (pool.counter_sets, taken)
    return counters.Ledger(books)


class _Search:
    def __init__(
        self,
        claims: Sequence[tuple[claim.Claim, selection.Selection]],
        ledger: counters.Ledger,
        *,
        budget: int,
        work: schedwork.Work | None = None,
    ) -> None:
        self.claims = claims
        self.work = work
        self.sel = claims[0][1]
        self.devices = self.sel.devices
        self.ledger = ledger
        self.budget = budget
        self.steps = 0
        self.allocating: dict[int, set[int]] = {}  # device position -> claims taking it
        self.results: list[list[Pick]] = [[] for _ in claims]
        self.con_value: list[list[tuple[str, object] | None]] = [
            [None] * len(c.constraints) for c, _ in claims
        ]
        self.con_count: list[list[int]] = [[0] * len(c.constraints) for c, _ in claims]
        self.all_devices: dict[tuple[int, str], list[int]] = {}
        # Shares of multi-allocatable devices taken in this search: position -> consumptions;
        # and, per result, whether it booked its device's counters.
        self.taking: dict[int, list[dict[str, capacity.Q]]] = {}
        self.booked: list[list[bool]] = [[] for _ in claims]

    # ---- checks ------------------------------------------------------------------------------

    def _selectable(self, ci: int, req: claim.Request, pos: int) -> bool:
        found = self.claims[ci][1].check(req, pos, self.work)
        if found is not None and found.error is not None:
            dev = self.devices[pos].name
            raise _Abort(f"request {req.name}: {found.where} on {dev}: {found.error}")
        return found is None

    def _fits(self, ci: int, req: claim.Request, pos: int) -> capacity.Fit:
        """What is left of the device's capacity (allocated shares and those taken in this
        search) covers the request."""
        taken = self.taking.get(pos)
        if not taken:
            return self.claims[ci][1].capacity_fit(req, pos)
        device = self.devices[pos]
        used = capacity.combined(self.sel.consumed.of(device.id), *taken)
        return capacity.fit(device, req.capacity, used)

    def _capacity_in_use(self, pos: int) -> bool:
        return self.sel.consumed.has(self.devices[pos].id) or bool(self.taking.get(pos))

    def _busy(self, ci: int, req: claim.Request, pos: int) -> bool:
        takers = self.allocating.get(pos, set())
        if req.admin_access:
            return ci in takers
        return self.sel.in_use[pos] or bool(takers)

    def validate(self, bad_pools: Sequence[pools.Pool]) -> None:
        for ci, (parsed, sel) in enumerate(self.claims):
            minimum = 0
            for group in parsed.groups:
                counts = []
                for req in group.alternatives:
                    try:
                        sel.class_of(req)
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
                        found = [
                            p
                            for p in range(len(self.devices))
                            if self._selectable(ci, req, p) and sel.capacity_fit(req, p).ok
                        ]
                        self.all_devices[(ci, req.name)] = found
                        counts.append(len(found))
                    else:
                        counts.append(req.count)
                minimum += min(counts)
            if minimum > claim.MAX_RESULTS:
                raise _Abort(
                    f"number of requested devices {minimum} exceeds the claim limit of "
                    f"{claim.MAX_RESULTS}"
                )

    # ---- the search --------------------------------------------------------------------------

    def one(self, ci: int, gi: int, ai: int, slot: int, in_sub: bool, start: int) -> bool:
        self.steps += 1
        if self.steps > self.budget:
            raise _Budget
        if ci >= len(self.claims):
            return True
        parsed = self.claims[ci][0]
        if gi >= len(parsed.groups):
            try:
                return self.one(ci + 1, 0, 0, 0, False, 0)
            except _Exceeded:
                return False
        group = parsed.groups[gi]
        if not in_sub and group.first_available:
            all_exceeded = True
            for alt in range(len(group.alternatives)):
                try:
                    ok = self.one(ci, gi, alt, 0, True, 0)
                except _Exceeded:
                    continue
                all_exceeded = False
                if ok:
                    return True
            if all_exceeded:
                raise _Exceeded
            return False
        req = group.alternatives[ai]
        everything = self.all_devices.get((ci, req.name)) if req.mode == claim.ALL else None
        if everything is not None and not everything:
            return False
        needed = len(everything) if everything is not None else req.count
        if slot >= needed:
            return self.one(ci, gi + 1, 0, 0, False, 0)
        if len(self.results[ci]) + needed - slot > claim.MAX_RESULTS:
            raise _Exceeded
        if everything is not None:
            pos = everything[slot]
            if not self._add(ci, req, pos, must=True):
                return False
            return self._descend(ci, req, pos, (gi, ai, slot + 1, in_sub, 0))
        for pos in range(start, len(self.devices)):
            if self.work is not None:
                self.work.devices_visited += 1  # allocateOne's device loop
            if self._busy(ci, req, pos) or not self._selectable(ci, req, pos):
                continue
            if not self._fits(ci, req, pos).ok:
                continue
            if not self._add(ci, req, pos, must=False):
                continue
            if self._descend(ci, req, pos, (gi, ai, slot + 1, in_sub, pos + 1)):
                return True
        return False

    def _descend(
        self, ci: int, req: claim.Request, pos: int, nxt: tuple[int, int, int, bool, int]
    ) -> bool:
        try:
            done = self.one(ci, *nxt)
        except (_Exceeded, _Budget, _Abort):
            self._remove(ci, req, pos)
            raise
        if not done:
            self._remove(ci, req, pos)
        return done

    def _add(self, ci: int, req: claim.Request, pos: int, *, must: bool) -> bool:
        if self._busy(ci, req, pos):
            return False
        device = self.devices[pos]
        pool_key = (device.driver, device.pool)
        multi = self.sel.multi[pos]
        charge = not (multi and self._capacity_in_use(pos))  # shares after the first skip
        if charge and device.consumes and self.work is not None:
            self.work.counter_checks += 1  # checkAvailableCounters
        if charge and not self.ledger.fits(pool_key, device.consumes):
            return False
        if self.claims[ci][1].taint_blocks(req, pos) is not None:
            return False
        parsed = self.claims[ci][0]
        values, count = self.con_value[ci], self.con_count[ci]
        added: list[int] = []
        for i, con in enumerate(parsed.constraints):
            if not con.applies(req):
                continue
            key = pools.attribute_key(pools.lookup_attribute(device, con.attribute))
            if key is None or (count[i] and key != values[i]):
                for j in added:
                    count[j] -= 1
                if must:
                    raise _Abort(
                        f"request {req.name}: cannot add device {device.name} because "
                        f"constraint matchAttribute {con.attribute} would not be satisfied"
                    )
                return False
            if count[i] == 0:
                values[i] = key
            count[i] += 1
            added.append(i)
        if multi:
            fit = self._fits(ci, req, pos)
            if not fit.ok:  # checked before; only `All` requests reach here unchecked
                for j in added:
                    count[j] -= 1
                return False
            self.taking.setdefault(pos, []).append(capacity.consumption(device, req.capacity))
        else:
            self.allocating.setdefault(pos, set()).add(ci)
        if charge:
            self.ledger.take(pool_key, device.consumes)
        self.booked[ci].append(charge)
        self.results[ci].append((req.name, pos))
        return True

    def _remove(self, ci: int, req: claim.Request, pos: int) -> None:
        for i, con in enumerate(self.claims[ci][0].constraints):
            if con.applies(req):
                self.con_count[ci][i] -= 1
        device = self.devices[pos]
        if self.booked[ci].pop():
            self.ledger.give_back((device.driver, device.pool), device.consumes)
        if self.sel.multi[pos]:
            self.taking[pos].pop()
        else:
            self.allocating[pos].discard(ci)
        self.results[ci].pop()


def emulate_all(
    claims: Sequence[tuple[claim.Claim, selection.Selection]],
    *,
    ledger: counters.Ledger,
    bad_pools: Sequence[pools.Pool],
    budget: int = DEFAULT_BUDGET,
    work: schedwork.Work | None = None,
) -> Verdict:
    """Replay the scheduler's search for claims allocated together (one pod's claims).

    Every :class:`selection.Selection` must be over the same devices (one per claim, since
    selector verdicts are cached per request name). ``work`` counts the search's work.
    """
    search = _Search(claims, ledger, budget=budget, work=work)
    try:
        search.validate(bad_pools)
        ok = search.one(0, 0, 0, 0, False, 0)
    except _Abort as err:
        return Verdict("error", message=str(err), steps=search.steps)
    except _Exceeded:
        ok = False
    except _Budget:
        return Verdict(
            "undecided", message=f"gave up after {budget} search steps", steps=search.steps
        )
    if not ok:
        return Verdict("unsatisfiable", steps=search.steps)
    per_claim = tuple(tuple(r) for r in search.results)
    return Verdict("allocated", picks=per_claim[0], steps=search.steps, per_claim=per_claim)


def emulate(
    parsed: claim.Claim,
    sel: selection.Selection,
    *,
    bad_pools: Sequence[pools.Pool],
    ledger: counters.Ledger | None = None,
    budget: int = DEFAULT_BUDGET,
    work: schedwork.Work | None = None,
) -> Verdict:
    """Replay the scheduler's search for one claim on the devices ``sel`` knows."""
    return emulate_all(
        [(parsed, sel)],
        ledger=ledger if ledger is not None else counters.Ledger({}),
        bad_pools=bad_pools,
        budget=budget,
        work=work,
    )
