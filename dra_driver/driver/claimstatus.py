"""The ResourceClaim's ``status.devices``: what we prepared, reported back to the API server.

Why it exists: after a prepare, users and tools read in the claim which physical GPUs they got
(UUIDs, minors, PCI bus IDs; the MIG instance's UUID; a share's consumed capacity) and whether
the device is ready, without access to the node. After a successful prepare each device of ours
gets one entry (``driver``, ``pool``, ``device``, ``shareID`` for a share, ``data``, a ``Ready``
condition); after unprepare our entries go. Written with server-side apply under our own field
manager (``<driver>-kubelet-plugin``, ``force=true``), so the rest of the status (allocation,
reservedFor, other managers' entries) is never touched, and an apply of no entries removes
exactly ours. ``metadata.uid`` travels as a precondition: a claim re-created under the same
name is never written to.

Never on the prepare path: :meth:`StatusWriter.sync` only queues the claim, a background thread
writes, and it writes once no claim of this node has been prepared or unprepared for ``settle_s``
(:meth:`StatusWriter.busy`; at most ``max_defer_s`` late): on a busy API server (2 cores, a burst
of claims) each apply costs the server about what a claim GET does, so applying in the middle of
a burst made every prepare of it wait longer for its GET (issue 37); and a write slipped into
the few milliseconds between two calls of a burst (the kubelet's pods do not start at the same
instant) ran into the next ones (issue 46: the API server's CPU during warm bursts of 32 was
all status writes). What it writes is derived at write time from the checkpoint (a completed
record: its devices; no record: nothing), so a queued prepare and a later unprepare cannot be
applied in the wrong order. A refused or failed
write is logged with the claim, counted (``dra_driver_claim_status_writes_total{result}``) and
retried with exponential backoff, up to ``max_attempts``; a claim gone from the API server (404,
or replaced: UID conflict) is dropped.
Pending writes are not persisted: a restart loses them (docs/status.md).

Only the :class:`~dra_driver.kube.api.KubeApi` port is used (plain dicts, no client library).
What the entries say is :mod:`~dra_driver.driver.statusentries`' (re-exported here).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import prometheus_client as prom
import structlog

from dra_driver import logs
from dra_driver import metrics as metrics_mod
from dra_driver.driver import checkpoint, claims, inventory
from dra_driver.driver.statusentries import VANISHED_REASON as VANISHED_REASON
from dra_driver.driver.statusentries import GpuFacts as GpuFacts
from dra_driver.driver.statusentries import device_entries as device_entries
from dra_driver.driver.statusentries import gpu_facts as gpu_facts
from dra_driver.driver.statusentries import ready_condition as ready_condition
from dra_driver.kube import api as kube

RESULTS = ("success", "failure", "gone", "abandoned", "dropped")
SETTLE_S = 0.1  # how long after the last claim in progress a write may go out
_COUNTERS: weakref.WeakKeyDictionary[prom.CollectorRegistry, prom.Counter] = (
    weakref.WeakKeyDictionary()
)
_COUNTERS_LOCK = threading.Lock()
# Writers alive: a fork (tests fork a driver mid-claim) waits until none is inside a write, so
# the child never inherits a lock the writer held (the API's, logging's).
_WRITERS: weakref.WeakSet[StatusWriter] = weakref.WeakSet()


def _before_fork() -> None:
    """A forked child must not inherit a lock another thread held: it would wait on it forever
    (seen in the crash-point tests' forked children). Both are taken, one after the other as
    the writer thread takes them (never nested there), and released on both sides."""
    for writer in list(_WRITERS):
        writer._busy.acquire()
        writer._cond.acquire()


def _after_fork() -> None:
    for writer in list(_WRITERS):
        writer._cond.release()
        if writer._busy.locked():
            writer._busy.release()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork, after_in_child=_after_fork)


def field_manager(driver_name: str) -> str:
    return f"{driver_name}-kubelet-plugin"


def writes_counter(metrics: metrics_mod.DriverMetrics) -> prom.Counter:
    """``dra_driver_claim_status_writes_total{result}`` in ``metrics``' registry (once)."""
    with _COUNTERS_LOCK:
        found = _COUNTERS.get(metrics.registry)
        if found is None:
            found = prom.Counter(
                "claim_status_writes",
                "Writes of ResourceClaim status.devices by result: success, failure (a refused "
                "or failed attempt; retried), gone (the claim no longer exists), abandoned "
                "(retries exhausted), dropped (the API server stored the claim without it: "
                "feature gate DRAResourceClaimDeviceStatus off).",
                ["result"],
                namespace=metrics_mod.NAMESPACE,
                registry=metrics.registry,
            )
            for result in RESULTS:
                found.labels(result=result)
            _COUNTERS[metrics.registry] = found
        return found


@dataclasses.dataclass(slots=True)
class _Job:
    ref: claims.ClaimRef
    due: float
    attempts: int = 0
    generation: int = 0  # bumped by every sync; a retry of an older one is dropped


class StatusWriter:
    """Queues claims whose status must follow their checkpoint record; writes them in the
    background. ``sync`` never blocks on the API."""

    def __init__(
        self,
        *,
        api: kube.KubeApi,
        store: checkpoint.Checkpoint,
        devices: inventory.Inventory,
        gpus: Mapping[int, GpuFacts],
        driver_name: str,
        log: structlog.typing.FilteringBoundLogger,
        metrics: metrics_mod.DriverMetrics | None = None,
        backoff_s: tuple[float, float] = (1.0, 60.0),
        max_attempts: int = 10,
        clock: Callable[[], float] = time.monotonic,
        max_defer_s: float = 2.0,
        settle_s: float = SETTLE_S,
    ) -> None:
        """``max_defer_s``: how long a due write may wait for claims in progress to end;
        ``settle_s``: how long the claims must have been quiet before a write goes out."""
        self.api = api
        self.store = store
        self.devices = devices
        self.gpus = gpus
        self.driver_name = driver_name
        self.field_manager = field_manager(driver_name)
        self.log = log
        self.counter = writes_counter(metrics or metrics_mod.new())
        self.backoff_s = backoff_s
        self.max_attempts = max_attempts
        self._clock = clock
        self._jobs: dict[str, _Job] = {}
        self._last: dict[str, dict[str, Any]] = {}  # claim UID → the patch last applied
        self._dropped_said = False  # the server drops status.devices: said once
        self._since: dict[str, str] = {}  # claim UID → when we first reported it Ready
        self._lost: dict[str, tuple[frozenset[str], str]] = {}  # UID → lost devices, since when
        self._cond = threading.Condition()
        self.max_defer_s = max_defer_s
        self.settle_s = settle_s
        self._in_progress = 0  # prepares and unprepares running now (see busy())
        self._last_busy = -float("inf")  # when the last claim in progress ended
        self._stopped = False
        self._busy = threading.Lock()  # held while writing (see _before_fork)
        _WRITERS.add(self)
        self._thread = threading.Thread(target=self._run, name="claim-status", daemon=True)
        self._thread.start()

    def sync(self, ref: claims.ClaimRef) -> None:
        """Make the claim's status follow its record (prepared: entries; none: no entries)."""
        with self._cond:
            old = self._jobs.get(ref.uid)
            gen = old.generation + 1 if old is not None else 0
            now = self._clock()
            # Claims in progress and another job already due: the writer sleeps until that
            # one's deadline, no later than this one's. Waking it for nothing took the
            # interpreter from the burst (issue 46: most of the writer's wake-ups).
            covered = self._in_progress and any(
                j.due <= now for uid, j in self._jobs.items() if uid != ref.uid
            )
            self._jobs[ref.uid] = _Job(ref=ref, due=now, generation=gen)
            if not covered:
                self._cond.notify()

    def lost(self, ref: claims.ClaimRef, devices: set[str]) -> None:
        """The claim's devices whose GPU vanished: written ``Ready=False``/``GpuVanished`` from
        now on, in the same queue as its prepare's write, so a deferred ``Ready=True`` can never
        land after (and overwrite) the report."""
        with self._cond:
            old, _ = self._lost.get(ref.uid, (frozenset(), ""))
            self._lost[ref.uid] = (old | frozenset(devices), _now())
        self.sync(ref)

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """Around a claim's prepare or unprepare: writes wait until none has been in progress
        for ``settle_s``."""
        with self._cond:
            self._in_progress += 1
        try:
            yield
        finally:
            with self._cond:
                self._in_progress -= 1
                if not self._in_progress:
                    self._last_busy = self._clock()
                    if self._jobs:  # nothing queued: nothing to wake the writer for
                        self._cond.notify()

    def pending(self) -> int:
        with self._cond:
            return len(self._jobs)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join(timeout=5)

    # ------------------------------------------------------------------ the writer thread
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped:
                    now = self._clock()
                    due = [j for j in self._jobs.values() if j.due <= now]
                    settles = self._last_busy + self.settle_s - now  # > 0: claims just ended
                    held = bool(self._in_progress) or settles > 0
                    if due and held:  # claims first, unless one waited too long
                        due = [j for j in due if j.due + self.max_defer_s <= now]
                    if due:
                        break
                    waits = [j.due - now for j in self._jobs.values() if j.due > now]
                    if held and self._jobs:
                        waits += [j.due + self.max_defer_s - now for j in self._jobs.values()]
                        if not self._in_progress:
                            waits.append(settles)
                    self._cond.wait(timeout=max(0.0, min(waits)) if waits else None)
                if self._stopped:
                    return
                job = min(due, key=lambda j: j.due)
                started = job.generation
            with self._busy:
                done = self._write(job)
            with self._cond:
                current = self._jobs.get(job.ref.uid)
                if current is None or current.generation != started:
                    continue  # synced again meanwhile: that job runs next
                if done:
                    del self._jobs[job.ref.uid]
                    continue
                job.attempts += 1
                if job.attempts >= self.max_attempts:
                    del self._jobs[job.ref.uid]
                    self.counter.labels(result="abandoned").inc()
                    self._claim_log(job.ref).error(
                        "giving up writing the claim's device status", attempts=job.attempts
                    )
                    continue
                low, high = self.backoff_s
                job.due = self._clock() + min(high, low * 2 ** (job.attempts - 1))

    def _write(self, job: _Job) -> bool:
        """One apply; True when nothing is left to do for this job."""
        ref = job.ref
        clog = self._claim_log(ref)
        record = self.store.get(ref.uid)
        with self._cond:
            lost, lost_since = self._lost.get(ref.uid, (frozenset(), ""))
        if record is not None and record.state == checkpoint.PREPARE_COMPLETED:
            since = lost_since or self._since.setdefault(ref.uid, _now())
            entries = device_entries(
                record,
                driver_name=self.driver_name,
                devices=self.devices,
                gpus=self.gpus,
                since=since,
                lost=lost,
            )
        else:
            self._since.pop(ref.uid, None)
            with self._cond:
                self._lost.pop(ref.uid, None)
            entries = []
        patch = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": ref.name, "namespace": ref.namespace, "uid": ref.uid},
            "status": {"devices": entries},
        }
        if self._last.get(ref.uid) == patch:
            return True  # written already (a kubelet retry of a prepared claim)
        try:
            stored = self.api.apply_resource_claim_status(
                ref.namespace, ref.name, patch, self.field_manager
            )
        except kube.ApiError as exc:
            if isinstance(exc, kube.NotFound) or (
                isinstance(exc, kube.Conflict) and "UID" in str(exc)
            ):
                self.counter.labels(result="gone").inc()
                self._last.pop(ref.uid, None)
                clog.debug("claim gone from the API server; its device status is not written")
                return True
            self.counter.labels(result="failure").inc()
            low, high = self.backoff_s
            clog.warning(
                "cannot write the claim's device status; will retry",
                error=str(exc),
                status=exc.status,
                attempt=job.attempts + 1,
                retry_in_s=min(high, low * 2**job.attempts),
            )
            return False
        except Exception as exc:  # a bug must not kill the writer thread
            self.counter.labels(result="failure").inc()
            clog.exception("writing the claim's device status failed unexpectedly", error=str(exc))
            return False
        if entries and not (stored.get("status") or {}).get("devices"):
            # A server with DRAResourceClaimDeviceStatus off stores the claim without it (201).
            self.counter.labels(result="dropped").inc()
            if not self._dropped_said:
                self._dropped_said = True
                clog.warning(
                    "API server did not keep the claim's device status (feature gate "
                    "DRAResourceClaimDeviceStatus off?); prepared claims are not reported there",
                    devices=len(entries),
                )
            self._last[ref.uid] = patch
            return True
        self.counter.labels(result="success").inc()
        if entries:
            self._last[ref.uid] = patch
        else:
            self._last.pop(ref.uid, None)
        clog.debug("wrote the claim's device status", devices=len(entries))
        return True

    def _claim_log(self, ref: claims.ClaimRef) -> structlog.typing.FilteringBoundLogger:
        return logs.claim_logger(self.log, uid=ref.uid, namespace=ref.namespace, name=ref.name)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
