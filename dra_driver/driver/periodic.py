"""A task run every few seconds on a daemon thread, for the node agents' housekeeping.

Why it exists: the claim clean-up (:class:`~dra_driver.driver.driver.CleanupLoop`) and the MPS
supervision (:class:`MpsSupervisor`, here so that starting it loads no MPS module) follow the
same rules — an interval of 0 never starts the thread, a failing round is logged and the next
one retries (the loop never dies), and stop wakes the thread at once and waits for it — so they
share one implementation.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import structlog


class Periodic:
    """Runs ``task`` every ``interval_s`` seconds on a daemon thread named ``name``."""

    def __init__(
        self,
        *,
        name: str,
        task: Callable[[], object],
        interval_s: float,
        log: structlog.typing.FilteringBoundLogger,
        failed: str,
    ) -> None:
        """``failed``: the log message of a round that raised (the traceback goes with it)."""
        self.task = task
        self.interval_s = interval_s
        self.log = log
        self._failed = failed
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

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
                self.task()
            except Exception:  # never let housekeeping die; the next round retries
                self.log.exception(self._failed)


class MpsSupervisor(Periodic):
    """Runs ``check`` every ``interval_s`` seconds on a daemon thread (MPS housekeeping)."""

    def __init__(
        self,
        *,
        check: Callable[[], object],
        interval_s: float,
        log: structlog.typing.FilteringBoundLogger,
    ) -> None:
        super().__init__(
            name="mps-supervisor",
            task=check,
            interval_s=interval_s,
            log=log,
            failed="MPS supervision failed; will retry",
        )
