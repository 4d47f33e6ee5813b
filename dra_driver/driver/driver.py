"""The per-call loop the kubelet adapter drives: many claims in, one answer per claim out.

Kubelet sends every claim of a pod in one call. Each claim is prepared on its own (in parallel on
a thread pool, since the work is mostly waiting: an API GET and several fsyncs) and gets its own
result; a failing or crashing claim becomes that claim's error string and never affects the
others or the call as a whole. ``serial=True`` prepares one claim after the other (used by the
benchmark to show what parallelism buys).

It also runs the periodic clean-up: claims we still hold whose ResourceClaim no longer exists
(or exists under a new UID) are unprepared, so nothing leaks when kubelet never calls back, and
device ownership left without a record (a rollback that could not finish) is released.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
from collections.abc import Callable, Sequence
from typing import TypeVar

import structlog

from dra_driver import logs
from dra_driver import metrics as metrics_mod
from dra_driver.driver import checkpoint, claims, claimstatus, periodic, recovery, results, state
from dra_driver.kube import api as kube

T = TypeVar("T")
ClaimLock = Callable[[str], contextlib.AbstractContextManager[object]]


class Driver:
    """Plain ``prepare``/``unprepare`` over batches of claims, keyed by claim UID."""

    # Checked before each prepare: raises claims.ClaimError to refuse it (None: no gate).
    gate: Callable[[claims.ClaimRef], None] | None = None

    def __init__(
        self,
        *,
        claim_state: state.ClaimState,
        log: structlog.typing.FilteringBoundLogger,
        workers: int = 32,
        serial: bool = False,
        metrics: metrics_mod.DriverMetrics | None = None,
        claim_lock: ClaimLock | None = None,
        status: claimstatus.StatusWriter | None = None,
    ) -> None:
        """``metrics`` counts and times every claim (one log event each, too); ``claim_lock``
        (a claim UID → context manager) wraps each claim's work, e.g. a file lock shared with
        another instance of the plugin (:mod:`dra_driver.driver.instances`); ``status`` is told
        of every claim prepared or unprepared, to write its ``status.devices`` (in the
        background: never delays or fails the call)."""
        self.status = status
        self.state = claim_state
        self.log = log
        self.serial = serial
        self.metrics = metrics or metrics_mod.new()
        self._claim_lock: ClaimLock = claim_lock or (lambda uid: contextlib.nullcontext())
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=max(1, workers), thread_name_prefix="claim"
        )

    def prepare(self, refs: Sequence[claims.ClaimRef]) -> dict[str, results.PrepareResult]:
        def one(ref: claims.ClaimRef) -> results.PrepareResult:
            with self._busy(), self.metrics.request("prepare", log=self._claim_log(ref)) as req:
                try:
                    if self.gate is not None:  # e.g. the NVIDIA driver is away (driverwatch)
                        self.gate(ref)
                    with self._claim_lock(ref.uid):
                        devices = self.state.prepare(ref)
                except Exception as exc:
                    req.fail(self._error("prepare", ref, exc))
                    return results.PrepareResult(error=req.error)
                req.devices = [d.device_name for d in devices]
                self._status_changed(ref)
                return results.PrepareResult(devices=devices)

        return self._each(refs, one)

    def unprepare(self, refs: Sequence[claims.ClaimRef]) -> dict[str, str]:
        """Claim UID → error ("" = success)."""

        def one(ref: claims.ClaimRef) -> str:
            with self._busy(), self.metrics.request("unprepare", log=self._claim_log(ref)) as req:
                try:
                    with self._claim_lock(ref.uid):
                        self.state.unprepare(ref)
                except Exception as exc:
                    req.fail(self._error("unprepare", ref, exc))
                else:
                    self._status_changed(ref)
                return req.error

        return self._each(refs, one)

    def update_gauges(self) -> None:
        """Set the prepared claims/devices gauges from the checkpoint."""
        records = self.state.store.records()
        self.metrics.set_prepared(claims=len(records), devices=sum(len(r.devices) for r in records))

    def cleanup(self) -> list[claims.ClaimRef]:
        """Unprepare held claims whose ResourceClaim is gone or replaced; returns them. Also
        releases device ownership no record backs."""
        for orphan in self.state.release_orphans():
            self.log.warning("released devices held without a prepared claim", claim_uid=orphan)
        recovery.refresh_held(self.state)  # claims another instance of the agent prepared
        gone: list[claims.ClaimRef] = []
        for ref in self.state.prepared_claims():
            clog = logs.claim_logger(self.log, uid=ref.uid, namespace=ref.namespace, name=ref.name)
            try:
                claim = self.state.api.get_resource_claim(ref.namespace, ref.name)
                uid = (claim.get("metadata") or {}).get("uid")
            except kube.NotFound:
                uid = None
            except kube.ApiError as exc:
                clog.warning("clean-up could not check the claim; will retry", error=str(exc))
                continue
            if uid == ref.uid:
                continue
            clog.info("claim no longer exists in the API server; unpreparing it")
            error = self.unprepare([ref])[ref.uid]
            if not error:
                gone.append(ref)
        return gone

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self.status is not None:
            self.status.stop()

    def _busy(self) -> contextlib.AbstractContextManager[object]:
        """A claim in progress: status writes wait for it (:meth:`StatusWriter.busy`)."""
        return self.status.busy() if self.status is not None else contextlib.nullcontext()

    def _status_changed(self, ref: claims.ClaimRef) -> None:
        if self.status is None:
            return
        try:
            self.status.sync(ref)
        except Exception:  # reporting status never costs the kubelet its answer
            self._claim_log(ref).exception("cannot queue the claim's device status write")

    def _each(
        self, refs: Sequence[claims.ClaimRef], one: Callable[[claims.ClaimRef], T]
    ) -> dict[str, T]:
        unique = list({ref.uid: ref for ref in refs}.values())  # a claim listed twice: once
        if self.serial or len(unique) <= 1:
            answers = {ref.uid: one(ref) for ref in unique}
        else:
            futures = {ref.uid: self._pool.submit(one, ref) for ref in unique}
            answers = {uid: future.result() for uid, future in futures.items()}
        try:
            self.update_gauges()
        except Exception:  # a gauge never costs the kubelet its answer
            self.log.exception("cannot update the prepared-claims gauges")
        return answers

    def _claim_log(self, ref: claims.ClaimRef) -> structlog.typing.FilteringBoundLogger:
        return logs.claim_logger(self.log, uid=ref.uid, namespace=ref.namespace, name=ref.name)

    def _error(self, what: str, ref: claims.ClaimRef, exc: Exception) -> str:
        """The claim's error string; the request's log event carries it (bugs also get a
        traceback event of their own)."""
        if isinstance(exc, claims.ClaimError):
            return str(exc)
        if isinstance(exc, checkpoint.CheckpointError):  # names the claim by UID only
            return f"{ref}: {exc}"
        self._claim_log(ref).exception(f"{what} failed unexpectedly")
        return f"{ref}: {what} failed: internal error: {type(exc).__name__}: {exc}"


class CleanupLoop(periodic.Periodic):
    """Runs :meth:`Driver.cleanup` every ``interval_s`` seconds on a daemon thread."""

    def __init__(
        self, *, driver: Driver, interval_s: float, log: structlog.typing.FilteringBoundLogger
    ) -> None:
        super().__init__(
            name="claim-cleanup",
            task=driver.cleanup,
            interval_s=interval_s,
            log=log,
            failed="claim clean-up failed; will retry",
        )
