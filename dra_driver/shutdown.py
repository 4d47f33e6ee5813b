"""An orderly stop that always ends: each part stopped in turn and timed, under a deadline.

Why it exists: on SIGTERM the agent stops its parts one after the other (registration first,
the DRA service last: :mod:`dra_driver.app`). Each part's stop is bounded, but a part that
hangs — a thread stuck in a call nobody times out — would keep the process alive, silently,
until the kubelet's SIGKILL (``terminationGracePeriodSeconds``, 30 s in the chart), and the
next agent's start waits that long. :class:`Stopper` runs the steps, goes on past a step that
fails, logs a step that is slow, and once armed (by the signal) ends the process at its
deadline, saying which step was running and dumping every thread's stack to stderr: what an
operator needs to report the hang. Exiting without the remaining steps loses nothing: the claim
state on disk is crash-safe (the SIGKILL tests), and sockets left behind are removed at the
next start.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TextIO

import structlog

DEADLINE_EXIT_CODE = 1
SLOW_STEP_S = 1.0  # a step that takes longer is logged, with its time

Step = tuple[str, Callable[[], None] | None]  # a name, and its stop (None: not running)


class Stopper:
    """Runs the stop steps; :meth:`arm` starts the deadline (``deadline_s`` <= 0: none). It
    stays armed until the process ends: the interpreter's own exit, which waits for every
    non-daemon thread (gRPC's workers finish the call they are in), is covered too."""

    def __init__(
        self,
        *,
        log: structlog.typing.FilteringBoundLogger,
        deadline_s: float,
        stream: TextIO | None = None,
        exit_: Callable[[int], object] = os._exit,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = log
        self.deadline_s = deadline_s
        self._stream = stream
        self._exit = exit_
        self._clock = clock
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self.current = ""  # the step being stopped now ("" between steps)
        self.durations: dict[str, float] = {}  # each step run so far: its seconds

    def arm(self) -> None:
        """Start the deadline (once; a second signal does not move it).

        It never waits for its lock: a caller that finds it taken returns at once, the one
        that holds it arms the deadline. (It once ran in the signal handler, where a second
        SIGTERM could interrupt the first ``arm()``; the signals now reach it one after the
        other from the ``signal-watch`` thread: :func:`dra_driver.app.install_signal_handlers`.)
        """
        if self.deadline_s <= 0 or not self._lock.acquire(blocking=False):
            return
        try:
            if self._timer is None:
                timer = threading.Timer(self.deadline_s, self._expired)
                timer.name = "shutdown-deadline"
                timer.daemon = True
                self._timer = timer
                timer.start()
        finally:
            self._lock.release()

    def run(self, steps: Sequence[Step]) -> None:
        """Stop each part in order; a step that raises is logged and the others still run."""
        for name, stop in steps:
            if stop is None:
                continue
            self.current = name
            started = self._clock()
            try:
                stop()
            except Exception:  # one part that fails to stop must not keep the others running
                self._log.exception("cannot stop a part cleanly; stopping the others", part=name)
            took = self._clock() - started
            self.durations[name] = took
            if took >= SLOW_STEP_S:
                self._log.info("slow to stop", part=name, seconds=round(took, 3))
            self.current = ""
        ran = [name for name, stop in steps if stop is not None]
        self._log.debug(
            "parts stopped", seconds={name: round(self.durations[name], 3) for name in ran}
        )

    def _expired(self) -> None:
        threads = sorted(
            t.name for t in threading.enumerate() if t is not threading.current_thread()
        )
        self._log.error(
            "shutdown did not finish in time; exiting without the remaining steps (the claim "
            "state on disk is crash-safe); every thread's stack follows on stderr",
            deadline_s=self.deadline_s,
            stopping=self.current or "(between steps)",
            threads=threads,
        )
        stream = self._stream or sys.stderr
        try:
            stream.flush()
            faulthandler.dump_traceback(file=stream, all_threads=True)
            stream.flush()
        except (OSError, ValueError, AttributeError):  # a stream without a file descriptor
            pass
        self._exit(DEADLINE_EXIT_CODE)
