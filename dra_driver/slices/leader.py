"""One ResourceSlice publisher per node, however many agent instances run there.

Why it exists: during a seamless upgrade (the chart's ``seamlessUpgrade``: ``maxSurge 1``) the
old and the new agent pod run side by side on a node. Both would publish the node's slices, and
as soon as their content differs (a new version adds an attribute) each rewrites what the other
wrote, without end. So publishing is guarded by an exclusive ``flock`` on a file in the plugin
directory, which both pods share: the instance holding it publishes, the other waits on it
(blocked in the kernel, no polling) and is *standing by*. The lock is handed over on exit — a
clean stop, a crash or a SIGKILL alike, since the kernel drops it with the process — and the
waiting instance takes it at that instant and publishes: the slices on the server stay in place
through the hand-over, so there is no gap.

A standing-by instance counts as ready: its node's slices are published, by the other one
(whose own readiness says how that goes). Otherwise the surge could never finish: the old pod is
only stopped once the new one is ready.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Callable
from pathlib import Path

from dra_driver.slices import pubtypes

LOCK_FILE = "publisher.lock"


class LockError(Exception):
    """The lock file cannot be opened (the message names it)."""


class PublisherLock:
    """The node-wide publisher lock; :meth:`start` waits for it in a daemon thread."""

    def __init__(self, path: Path, *, log: pubtypes.Log) -> None:
        self.path = path
        self.log = log
        self._guard = threading.Lock()
        self._fd: int | None = None
        self._held = threading.Event()
        self._waiting = False  # the lock is taken by another instance and we wait for it
        self._stopped = False
        self._thread: threading.Thread | None = None

    @property
    def held(self) -> bool:
        return self._held.is_set()

    @property
    def standby(self) -> bool:
        """Waiting while another instance holds the lock (and publishes)."""
        with self._guard:
            return self._waiting and not self._stopped

    def start(self, on_acquired: Callable[[], None]) -> None:
        """Open the lock file (errors raise :class:`LockError`), then take the lock — at once
        if it is free, else when its holder lets go — and call ``on_acquired`` once."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise LockError(f"cannot open lock file {self.path}: {exc.strerror or exc}") from exc
        with self._guard:
            self._fd = fd
            self._thread = threading.Thread(
                target=self._take, args=(fd, on_acquired), name="publisher-lock", daemon=True
            )
            self._thread.start()

    def wait_held(self, timeout_s: float) -> bool:
        return self._held.wait(timeout_s)

    def release(self) -> None:
        """Let go (or stop waiting); the other instance takes over at once."""
        with self._guard:
            self._stopped = True
            fd, self._fd = self._fd, None
            self._held.clear()
        if fd is not None:
            os.close(fd)  # drops the lock; a thread still blocked on it fails and ends

    def _take(self, fd: int, on_acquired: Callable[[], None]) -> None:
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                with self._guard:
                    self._waiting = True
                self.log.info(
                    "another agent instance on this node publishes the ResourceSlices; "
                    "standing by to take over",
                    lock=str(self.path),
                )
                fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:  # closed by release() while waiting
            with self._guard:
                stopped = self._stopped
            if not stopped:
                self.log.error(
                    "cannot take the publisher lock", lock=str(self.path), error=str(exc)
                )
            return
        with self._guard:
            self._waiting = False
            if self._stopped:  # released while we waited: closing the file let go of it
                return
            self._held.set()
        self.log.info("publishing this node's ResourceSlices", lock=str(self.path))
        on_acquired()
