"""The per-call loop the kubelet adapter drives: many claims in, one answer per claim out.

Kubelet sends every claim of a pod in one call. Each claim is prepared on its own (in parallel on
a thread pool, since the work is mostly waiting: an API GET and several fsyncs) and gets its own
result; a failing or crashing claim becomes that claim's error string and never affects the
others or the call as a whole. ``serial=True`` prepares one claim after the other (used by the
benchmark to show what parallelism buys).

It also runs the periodic clean-up: claims we still hold whose ResourceClaim no longer exists
(or exists under a new UID) are unprepared, so nothing leaks when kubelet never calls back.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

import structlog

from dra_driver import logs
from dra_driver.driver import checkpoint, claims, results, state
from dra_driver.kube import api as kube

T = TypeVar("T")


class Driver:
    """Plain ``prepare``/``unprepare`` over batches of claims, keyed by claim UID."""

    def __init__(
        self,
        *,
        claim_state: state.ClaimState,
        log: structlog.typing.FilteringBoundLogger,
        workers: int = 32,
        serial: bool = False,
    ) -> None:
        self.state = claim_state
        self.log = log
        self.serial = serial
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=max(1, workers), thread_name_prefix="claim"
        )

    def prepare(self, refs: Sequence[claims.ClaimRef]) -> dict[str, results.PrepareResult]:
        def one(ref: claims.ClaimRef) -> results.PrepareResult:
            try:
                return results.PrepareResult(devices=self.state.prepare(ref))
            except Exception as exc:
                return results.PrepareResult(error=self._error("prepare", ref, exc))

        return self._each(refs, one)

    def unprepare(self, refs: Sequence[claims.ClaimRef]) -> dict[str, str]:
        """Claim UID → error ("" = success)."""

        def one(ref: claims.ClaimRef) -> str:
            try:
                self.state.unprepare(ref)
                return ""
            except Exception as exc:
                return self._error("unprepare", ref, exc)

        return self._each(refs, one)

    def cleanup(self) -> list[claims.ClaimRef]:
        """Unprepare held claims whose ResourceClaim is gone or replaced; returns them."""
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

    def _each(
        self, refs: Sequence[claims.ClaimRef], one: Callable[[claims.ClaimRef], T]
    ) -> dict[str, T]:
        unique = list({ref.uid: ref for ref in refs}.values())  # a claim listed twice: once
        if self.serial or len(unique) <= 1:
            return {ref.uid: one(ref) for ref in unique}
        futures = {ref.uid: self._pool.submit(one, ref) for ref in unique}
        return {uid: future.result() for uid, future in futures.items()}

    def _error(self, what: str, ref: claims.ClaimRef, exc: Exception) -> str:
        clog = logs.claim_logger(self.log, uid=ref.uid, namespace=ref.namespace, name=ref.name)
        if isinstance(exc, claims.ClaimError | checkpoint.CheckpointError):
            clog.error(f"{what} failed", error=str(exc))
            return str(exc)
        clog.exception(f"{what} failed unexpectedly")
        return f"{ref}: {what} failed: internal error: {type(exc).__name__}: {exc}"


class CleanupLoop:
    """Runs :meth:`Driver.cleanup` every ``interval_s`` seconds on a daemon thread."""

    def __init__(
        self, *, driver: Driver, interval_s: float, log: structlog.typing.FilteringBoundLogger
    ) -> None:
        self.driver = driver
        self.interval_s = interval_s
        self.log = log
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="claim-cleanup", daemon=True)

    def start(self) -> None:
        if self.interval_s > 0:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.driver.cleanup()
            except Exception:
                self.log.exception("claim clean-up failed; will retry")
