"""Re-hand the node's desired ResourceSlices to the publisher whenever GPU health or the GPUs held
by prepared claims change.

Why it exists: an unhealthy GPU must show up as a device taint in the published slices within
seconds, and a recovered one must lose it; and every full GPU's set ranks (``setRanks``,
docs/topology.md) are ranks among the *free* GPUs, so they must follow the claims this agent
prepares and unprepares (:mod:`dra_driver.devices.holdings`). The publisher is declarative
(``set_desired``: the complete desired set; it writes only what differs and bumps the pool
generation once per change), so all this does is rebuild the desired set from the current health
and holdings and hand it over — in its own thread: the sources' subscribers must return at once,
and a prepare must never wait for a rebuild or an API write (it only marks the change).

The ranks also follow the claims the scheduler has *allocated* on this node but the kubelet has
not prepared yet (``allocated``, fed by :mod:`dra_driver.slices.allocwatch`): a GPU is free for
the ranks when neither a prepared claim holds it nor a live allocation names it. Prepare and the
checkpoint stay the truth for what is held; allocations only steer the ranks.

Bursts coalesce: a change of holdings waits for the end of its burst — until the holdings have
not changed for ``settle_s`` (32 claims prepared at once, then their unprepares), at most
``max_defer_s`` after the change (issue 46: on a node whose claims keep coming, a rebuild per
burst ran in the middle of the next one and took the interpreter from its prepares; the ranks
then lag by at most that) — a change of allocations only ``settle_alloc_s`` (the scheduler binds
one pod at a time and the next claim should see the new ranks soon; one during a burst's wait
ends it), then one rebuild takes the newest state, and the publisher writes the newest desired
set it has when its pass runs. Health changes are rebuilt at once (a failing GPU's taint is
urgent). A change that alters no slice rebuilds byte-identical slices: the publisher writes
nothing. A rebuild that raises is logged and skipped; the last good set stays published and the
next change is rebuilt as usual. A change of holdings that leaves the same GPUs taken (an
allocated claim prepared, or unprepared while its pod stays) rebuilds nothing: the ranks depend
on the taken GPUs only (issue 46: on 256 GPUs a rebuild per prepare was most of the agent's CPU).

With metrics, every change (and the start) also updates the node's set-capacity gauges
(:mod:`dra_driver.devices.setcapacity`: placeable N-GPU sets, links of the best free set) before
the rebuild, from the same holdings, allocations and health (an allocated GPU counts as
held): a fraction of a millisecond on 8 GPUs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from types import MappingProxyType
from typing import Any, Protocol

import structlog

from dra_driver import metrics as metrics_mod
from dra_driver import records
from dra_driver.devices import health, holdings, migprofiles, model, setcapacity
from dra_driver.slices import build, serverfeatures, shares, taints

Obj = dict[str, Any]
SETTLE_S = 0.1  # how long a change of holdings waits for the rest of its burst
SETTLE_ALLOC_S = 0.01  # how long a change of allocations waits (p99 bound: docs/topology.md)
MAX_DEFER_S = 2.0  # how long holdings that keep changing may hold back their rebuild
NO_HEALTH = health.Snapshot(version=0, unhealthy=MappingProxyType({}))
NO_HOLDINGS = holdings.Snapshot(version=0, held=frozenset())


class Desired(Protocol):
    def set_desired(self, slices: Iterable[Obj]) -> None: ...

    def stop(self) -> None: ...


@records.record
class Inputs:
    """What the desired slices are built from besides the hardware."""

    health: health.Snapshot = NO_HEALTH
    held: holdings.Snapshot = NO_HOLDINGS
    allocated: holdings.Snapshot = NO_HOLDINGS  # GPUs of claims allocated here, not prepared

    @property
    def versions(self) -> tuple[int, int, int]:
        return self.health.version, self.held.version, self.allocated.version

    @property
    def taken(self) -> frozenset[str]:
        """The full GPUs left out of the set ranks: held by a prepared claim or allocated."""
        return self.held.held | self.allocated.held


def current(
    board: health.HealthBoard | None,
    held: holdings.HeldGpus | None,
    allocated: holdings.HeldGpus | None = None,
) -> Inputs:
    """The sources' state now (a missing source: nothing unhealthy, nothing held)."""
    return Inputs(
        health=board.snapshot() if board is not None else NO_HEALTH,
        held=held.snapshot() if held is not None else NO_HOLDINGS,
        allocated=allocated.snapshot() if allocated is not None else NO_HOLDINGS,
    )


class Republisher:
    """Follows ``board``, ``held`` and ``allocated``; on each change hands ``rebuild(inputs)``
    to ``publisher``. :meth:`stop` stops following, then the publisher."""

    def __init__(
        self,
        *,
        publisher: Desired,
        rebuild: Callable[[Inputs], list[Obj]],
        log: structlog.typing.FilteringBoundLogger,
        built_from: Inputs,
        board: health.HealthBoard | None = None,
        held: holdings.HeldGpus | None = None,
        allocated: holdings.HeldGpus | None = None,
        settle_s: float = SETTLE_S,
        settle_alloc_s: float = SETTLE_ALLOC_S,
        max_defer_s: float = MAX_DEFER_S,
        metrics: metrics_mod.DriverMetrics | None = None,
        observe: Callable[[Inputs], None] | None = None,
    ) -> None:
        """``built_from``: the inputs the publisher's current desired set was built from (a
        change between that build and :meth:`start` is not missed); ``observe`` sees the
        inputs at the start and on every change (the capacity gauges, :func:`gauges`)."""
        self._publisher = publisher
        self._rebuild = rebuild
        self._board = board
        self._held = held
        self._allocated = allocated
        self._log = log
        self._built = built_from
        self._last: list[Obj] | None = None  # the set last handed over, once known
        self._settle_s = settle_s
        self._settle_alloc_s = settle_alloc_s
        self._max_defer_s = max_defer_s
        self._metrics = metrics
        self._observe = observe
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._forced = False  # rebuild though neither source changed (server features did)
        self._unsubscribe: list[Callable[[], None]] = []
        self._thread = threading.Thread(target=self._run, name="slice-republish", daemon=True)
        self.rebuilds = 0  # rebuilds handed to the publisher (tests)

    def start(self) -> None:
        for source in (self._board, self._held, self._allocated):
            if source is not None:
                self._unsubscribe.append(source.subscribe(lambda snap: self._wake.set()))
        self._observed(self._now())
        if self._now().versions != self._built.versions:
            self._wake.set()
        self._thread.start()

    def refresh(self) -> None:
        """Rebuild now though neither source changed (what the API server keeps did)."""
        self._forced = True
        self._wake.set()

    def set_rebuild(
        self,
        rebuild: Callable[[Inputs], list[Obj]],
        *,
        observe: Callable[[Inputs], None] | None = None,
        now: bool = True,
    ) -> None:
        """Build from other devices from now on (the node's GPUs changed, docs/lifecycle.md);
        ``now``: rebuild at once, else at the next change of a source."""
        self._rebuild = rebuild
        if observe is not None:
            self._observe = observe
        self._last = None
        if now:
            self.refresh()

    def stop(self) -> None:
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(5.0)
        self._publisher.stop()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            if self._stop.is_set():
                return
            seen = self._now()
            if seen.health.version == self._built.health.version and not self._forced:
                # holdings or allocations only: one rebuild for the burst
                prepared = seen.held.version != self._built.held.version
                if prepared and seen.allocated.version == self._built.allocated.version:
                    self._burst_end(seen)
                else:  # allocations steer the next pick: no longer than a burst's settle
                    self._stop.wait(self._settle_s if prepared else self._settle_alloc_s)
                if self._stop.is_set():
                    return
            self._wake.clear()
            forced, self._forced = self._forced, False
            now = self._now()
            if now.versions != self._built.versions or forced:
                self._republish(now, forced)

    def _now(self) -> Inputs:
        return current(self._board, self._held, self._allocated)

    def _burst_end(self, seen: Inputs) -> None:
        """Wait until the holdings have not changed for ``settle_s``, at most ``max_defer_s``;
        a change of health or allocations (which steer what comes next) ends the wait."""
        deadline = time.monotonic() + self._max_defer_s
        while not self._stop.wait(min(self._settle_s, max(0.0, deadline - time.monotonic()))):
            now = self._now()
            if (
                now.held.version == seen.held.version
                or now.health.version != seen.health.version
                or now.allocated.version != seen.allocated.version
                or time.monotonic() >= deadline
            ):
                return
            seen = now

    def _republish(self, now: Inputs, forced: bool = False) -> None:
        health_changed = now.health.version != self._built.health.version
        same = not (forced or health_changed) and now.taken == self._built.taken
        if same and self._last is not None:  # e.g. an allocated claim prepared: the same GPUs
            self._observed(now)
            self._built = now
            return
        held_changed = (
            now.held.version != self._built.held.version
            or now.allocated.version != self._built.allocated.version
        )
        self._observed(now)
        if held_changed and self._last is None:
            self._last = self._baseline()
        try:
            slices = self._rebuild(now)
        except Exception as exc:  # keep following; the last good set stays published
            self._log.error(
                "cannot rebuild ResourceSlices after a health change"
                if health_changed
                else "cannot rebuild ResourceSlices after the GPUs held by claims changed",
                error=repr(exc),
            )
            return
        if health_changed:
            self._log.info(
                "GPU health changed; re-publishing ResourceSlices",
                health_version=now.health.version,
                unhealthy=sorted(now.health.unhealthy),
            )
        if held_changed and slices != self._last:
            if now.held.version != self._built.held.version:
                self._log.info(
                    "GPUs held by prepared claims changed; re-publishing ResourceSlices",
                    held_version=now.held.version,
                    held=sorted(now.held.held, key=_natural),
                )
            else:
                self._log.info(
                    "GPUs of claims allocated on this node changed; re-publishing ResourceSlices",
                    allocated_version=now.allocated.version,
                    allocated=sorted(now.allocated.held, key=_natural),
                )
        if self._metrics is not None:
            self._metrics.slices_rebuilt(
                health=health_changed, claims=held_changed, held_gpus=len(now.held.held)
            )
        self._built, self._last = now, slices
        self.rebuilds += 1
        self._publisher.set_desired(slices)

    def _observed(self, now: Inputs) -> None:
        if self._observe is None:
            return
        try:
            self._observe(now)
        except Exception as exc:  # a gauge is never worth a missed re-publish
            self._log.error("cannot update the set-capacity metrics", error=repr(exc))

    def _baseline(self) -> list[Obj] | None:
        """The set the publisher has (built from ``built_from``), to tell whether a change of
        holdings changed it; None when it cannot be rebuilt."""
        try:
            return self._rebuild(self._built)
        except Exception:  # the change is then taken to change the slices
            return None


def rebuilder(
    devices: model.NodeDevices,
    *,
    node_name: str,
    driver_name: str,
    tainted: bool = True,
    dynamic_mig: migprofiles.DynamicMig = migprofiles.STATIC,
    shareable: shares.Shareable = shares.NONE,
    gpu_sets: bool = True,
    kept: Callable[[], serverfeatures.Kept] | None = None,
) -> Callable[[Inputs], list[Obj]]:
    """``devices``' desired slices for given inputs: the taints of their health (unless
    ``tainted`` is false: no health source), the set ranks of the GPUs they leave free;
    ``kept()`` says what the API server keeps now (:func:`decoration`; ``auto:`` selections
    follow it, :func:`~dra_driver.slices.serverfeatures.publishable`)."""

    def rebuild(inputs: Inputs) -> list[Obj]:
        now = kept() if kept is not None else serverfeatures.ALL_KEPT
        node, dynamic, shared = serverfeatures.publishable(
            now, devices, dynamic_mig=dynamic_mig, shareable=shareable
        )
        return build.build(
            node,
            node_name=node_name,
            driver_name=driver_name,
            decorate=decoration(inputs.health if tainted else None, driver_name, now),
            dynamic_mig=dynamic,
            shareable=shared,
            gpu_sets=gpu_sets,
            taken=inputs.taken,
        ).slices

    return rebuild


def follow(
    publisher: Desired,
    *,
    built_from: Inputs,
    devices: model.NodeDevices,
    node_name: str,
    driver_name: str,
    log: structlog.typing.FilteringBoundLogger,
    board: health.HealthBoard | None = None,
    held: holdings.HeldGpus | None = None,
    allocated: holdings.HeldGpus | None = None,
    dynamic_mig: migprofiles.DynamicMig = migprofiles.STATIC,
    shareable: shares.Shareable = shares.NONE,
    gpu_sets: bool = True,
    settle_s: float = SETTLE_S,
    metrics: metrics_mod.DriverMetrics | None = None,
    kept: Callable[[], serverfeatures.Kept] | None = None,
) -> Republisher:
    """Start re-publishing ``devices``' slices with the taints of ``board`` and the set ranks of
    the GPUs ``held`` and ``allocated`` leave free, on every change of any (``shareable`` GPUs
    stay published with their consumable capacity)."""
    follower = Republisher(
        publisher=publisher,
        rebuild=rebuilder(
            devices,
            node_name=node_name,
            driver_name=driver_name,
            tainted=board is not None,
            dynamic_mig=dynamic_mig,
            shareable=shareable,
            gpu_sets=gpu_sets,
            kept=kept,
        ),
        board=board,
        held=held,
        allocated=allocated,
        log=log,
        built_from=built_from,
        settle_s=settle_s,
        metrics=metrics,
        observe=gauges(devices, metrics) if metrics is not None else None,
    )
    follower.start()
    return follower


def gauges(
    devices: model.NodeDevices, metrics: metrics_mod.DriverMetrics
) -> Callable[[Inputs], None]:
    """Set ``metrics``' set-capacity gauges for given inputs (the empty node's maxima computed
    at the first call, inside the republisher's guard: a failure is logged, never raised)."""
    empty: list[setcapacity.SetCapacity] = []

    def observe(inputs: Inputs) -> None:
        if not empty:
            empty.append(setcapacity.of(devices))
        metrics.set_capacity(
            setcapacity.of(
                devices,
                held=inputs.taken,
                unhealthy_uuids=inputs.health.unhealthy.keys(),
                empty=empty[0],
            )
        )

    return observe


def decoration(
    snapshot: health.Snapshot | None, driver_name: str, kept: serverfeatures.Kept
) -> Callable[[list[Obj]], None] | None:
    """The pass over the built devices for ``snapshot``'s health (None: no health source) on a
    server keeping ``kept``: taints, or withdrawal where the server drops taints; then the
    withdrawal of devices whose counters or capacity the server drops."""
    passes = [
        p
        for p in (
            taints.decorator(snapshot, driver_name, withdraw=not kept.device_taints)
            if snapshot is not None
            else None,
            serverfeatures.withdrawer(kept),
        )
        if p is not None
    ]
    if not passes:
        return None

    def apply(devices: list[Obj]) -> None:
        for each in passes:
            each(devices)

    return apply


def _natural(name: str) -> tuple[int, str]:
    """``gpu-2`` before ``gpu-10``."""
    head, _, tail = name.rpartition("-")
    return (int(tail), head) if tail.isdigit() else (-1, name)
