"""Which devices a request may take: class and request selectors, taints, other claims' use,
shared counters that allocated devices used up (a MIG device of this GPU, say), and the
capacity other claims' shares left on a multi-allocatable device.

Why it exists: the exact search, the scheduler emulation and the explanations must agree on
every (request, device) verdict, including *why* a device is out. Selector results are cached
per request and device; evaluation follows the scheduler's order (class selectors first, then
the request's, stopping at the first false or error) so the same errors surface.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dra_driver import records
from dra_driver.allocation import capacity, cel, claim, gatherwork, pools, schedwork
from dra_driver.apimachinery import taints


class UnknownClassError(Exception):
    """A request names a DeviceClass that does not exist."""


@records.record
class Failure:
    """Why a device does not match a request's selectors."""

    class_name: str | None  # the DeviceClass whose selector failed; None = the request's own
    index: int
    expression: str
    error: str | None  # evaluation error; None = the selector evaluated to false

    @property
    def where(self) -> str:
        if self.class_name is None:
            return f"selectors[{self.index}]"
        return f"class {self.class_name} selectors[{self.index}]"


class Selection:
    """Selector, taint and in-use verdicts for one claim on one node's devices."""

    def __init__(
        self,
        *,
        devices: Sequence[pools.Device],
        classes: Mapping[str, claim.DeviceClass],
        in_use: set[pools.DeviceId],
        blocked: Iterable[int] = (),
        consumed: capacity.Ledger | None = None,
    ) -> None:
        """``blocked``: positions whose shared counters the allocated devices used up;
        ``consumed``: what allocated shares take of multi-allocatable devices."""
        self.devices = list(devices)
        self.classes = classes
        self.in_use = [d.id in in_use for d in self.devices]
        self.blocked = set(blocked)
        self.consumed = consumed if consumed is not None else capacity.Ledger()
        self.multi = [capacity.multi_allocatable(d) for d in self.devices]
        self._fits: dict[tuple[str, int], capacity.Fit] = {}
        self._cache: dict[tuple[str, int], Failure | None] = {}
        self._prepared: dict[int, cel.CelDevice | cel.CelEvalError] = {}
        self._compiled: dict[str, cel.CompiledSelector] = {}

    def compile_all(self, parsed: claim.Claim) -> None:
        """Compile every selector of the claim and its classes up front.

        Raises :class:`cel.CelCompileError` (wrapped in :class:`claim.ClaimError` naming the
        class or request) and :class:`UnknownClassError`.
        """
        for group in parsed.groups:
            for req in group.alternatives:
                cls = self.class_of(req)
                for i, expr in enumerate(cls.selectors):
                    self._compile(expr, f"DeviceClass {cls.name}: spec.selectors[{i}]")
                for i, expr in enumerate(req.selectors):
                    self._compile(
                        expr, f"ResourceClaim {parsed.name}: request {req.name}: selectors[{i}]"
                    )

    def _compile(self, expression: str, where: str) -> None:
        if expression in self._compiled:
            return
        try:
            self._compiled[expression] = cel.compile_selector(expression)
        except cel.CelCompileError as err:
            raise claim.ClaimError(f"{where}: {err}") from err

    def class_of(self, req: claim.Request) -> claim.DeviceClass:
        cls = self.classes.get(req.class_name)
        if cls is None:
            raise UnknownClassError(f"request {req.name}: device class {req.class_name} not found")
        return cls

    def _prepare(self, pos: int) -> cel.CelDevice | cel.CelEvalError:
        if pos not in self._prepared:
            dev = self.devices[pos]
            try:
                self._prepared[pos] = cel.prepare_device(dev.data, driver=dev.driver)
            except cel.CelEvalError as err:
                self._prepared[pos] = err
        return self._prepared[pos]

    def check(
        self, req: claim.Request, pos: int, work: schedwork.Work | None = None
    ) -> Failure | None:
        """``None`` when device ``pos`` passes the class and request selectors of ``req``.

        ``work`` counts the expressions evaluated (``cel_evaluations``); a cached verdict
        evaluates none, as the scheduler's ``deviceMatchesRequest`` cache.
        """
        key = (req.name, pos)
        if key in self._cache:
            return self._cache[key]
        cls = self.class_of(req)
        found = self._run(cls.name, cls.selectors, pos, work)
        if found is None:
            found = self._run(None, req.selectors, pos, work)
        self._cache[key] = found
        return found

    def _run(
        self,
        class_name: str | None,
        selectors: Sequence[str],
        pos: int,
        work: schedwork.Work | None = None,
    ) -> Failure | None:
        for i, expr in enumerate(selectors):
            prepared = self._prepare(pos)
            if isinstance(prepared, cel.CelEvalError):
                return Failure(class_name, i, expr, prepared.reason)
            compiled = self._compiled.get(expr) or cel.compile_selector(expr)
            if work is not None:
                work.cel_evaluations += 1
                work.cel_entries += gatherwork.entries_of(self.devices[pos].data)
            try:
                ok = compiled.evaluate(prepared)
            except cel.CelEvalError as err:
                return Failure(class_name, i, expr, err.reason)
            if not ok:
                return Failure(class_name, i, expr, None)
        return None

    def matches(self, req: claim.Request, pos: int) -> bool:
        return self.check(req, pos) is None

    def errors(self, req: claim.Request, pos: int) -> bool:
        found = self.check(req, pos)
        return found is not None and found.error is not None

    def taint_blocks(self, req: claim.Request, pos: int) -> Mapping[str, Any] | None:
        """The first NoSchedule/NoExecute taint of the device ``req`` does not tolerate."""
        return taints.first_untolerated(self.devices[pos].data.get("taints") or (), req.tolerations)

    def capacity_fit(self, req: claim.Request, pos: int) -> capacity.Fit:
        """Whether what allocated shares left of device ``pos`` covers ``req``'s capacity
        requests (checked on every device, as the scheduler does)."""
        key = (req.name, pos)
        if key not in self._fits:
            dev = self.devices[pos]
            self._fits[key] = capacity.fit(dev, req.capacity, self.consumed.of(dev.id))
        return self._fits[key]

    def usable(self, req: claim.Request, pos: int) -> bool:
        """Free (or admin access), counters left, untainted, matching its selectors, and with
        enough capacity left."""
        if self.in_use[pos] and not req.admin_access:
            return False
        if pos in self.blocked:
            return False
        if self.taint_blocks(req, pos) is not None:
            return False
        return self.matches(req, pos) and self.capacity_fit(req, pos).ok
