"""Runs NVIDIA's IMEX daemon in a ComputeDomain daemon pod and reports its readiness.

Why it exists: the node agent reports a node Ready from the daemon's ``status.json`` in the
domain's directory (:func:`.imexconfig.daemon_ready`), but NVIDIA's ``nvidia-imex`` writes no
such file: its readiness is what ``nvidia-imex-ctl -c <config> -q`` prints (``READY``, or
another word). ``dra-driver imex-daemon`` is the daemon pod's program on real nodes: it starts
``nvidia-imex -c <dir>/imexd.cfg`` as its child and, every interval, asks ``nvidia-imex-ctl``
(with a timeout: a hung query counts as not ready, it never hangs the loop) and writes
``status.json`` (``READY`` / ``NOT_READY``, the word ctl said, the peers ``-N`` lists).

The child is supervised, not restarted: when it dies the wrapper writes ``NOT_READY``, logs why
and exits 1, so the kubelet restarts the container (its restart count shows the failure).
SIGTERM / SIGINT are forwarded to the child; once it ends the wrapper exits 0. IMEX reads its
nodes config only when it starts, so when the agent rewrites ``nodes.cfg`` (a peer joined or
left) the child is restarted on the new one.

``nvidia-imex`` daemonizes unless its config says ``DAEMONIZE=0``: the child we start then exits
0 at once and the daemon lives on detached. The wrapper follows a detached daemon through
``nvidia-imex-ctl`` alone, and exits 1 when ctl has not answered for ``lost_after_s`` seconds
or when the nodes config changes (a container restart starts the daemon on the new one).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import structlog

from dra_driver import records
from dra_driver.computedomain import imexconfig

IMEX = "nvidia-imex"
IMEX_CTL = "nvidia-imex-ctl"
NOT_READY = "NOT_READY"
# Where the real daemon pods see the host's NVIDIA driver root (manifests mount it there).
DRIVER_ROOT_MOUNT = "/driver-root"
# Where a driver root keeps its binaries (relative to the root).
BINARY_DIRS = ("usr/bin", "usr/sbin", "bin", "sbin")
# ``nvidia-imex-ctl -N``: "Node #0   - 10.0.0.1   - READY   - Version: ...".
_NODE_LINE = re.compile(r"^\s*Node #\d+\s+-\s+(\S+)\s+-\s+(\S+)")

Log = structlog.typing.FilteringBoundLogger


class MissingBinary(Exception):
    """An IMEX binary is neither where its flag says nor on PATH nor under the driver root."""


def find_binary(name: str, *, explicit: str | None, driver_root: Path | None) -> str:
    """The executable ``name``: ``explicit`` (a path, or a name looked up on PATH) when given,
    else the first on PATH, else the first in the driver root's binary directories."""
    if explicit:
        found = shutil.which(explicit)
        if found is None:
            raise MissingBinary(f"{name}: {explicit} is not an executable file")
        return found
    found = shutil.which(name)
    if found is None and driver_root is not None:
        found = shutil.which(name, path=os.pathsep.join(str(driver_root / d) for d in BINARY_DIRS))
    if found is None:
        where = f" nor in {driver_root}/{{{','.join(BINARY_DIRS)}}}" if driver_root else ""
        raise MissingBinary(
            f"{name} is not on PATH{where}: the IMEX daemon pod needs NVIDIA's IMEX binaries "
            "(the driver's nvidia-imex package, from the host's driver root or the image)"
        )
    return found


@records.record
class Answer:
    """What one ``nvidia-imex-ctl`` call said."""

    word: str  # the first word of its output; TIMEOUT or NO_ANSWER when there is none
    answered: bool  # it ran to the end with exit status 0
    text: str = ""


def ask(command: Sequence[str], *, timeout_s: float) -> Answer:
    """Run ``command`` (a ctl query) with a timeout; a hung one is killed with its group."""
    try:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,  # its own group: a timeout kills what it started too
        )
    except OSError as exc:
        return Answer("NO_ANSWER", False, str(exc))
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        try:
            proc.communicate(timeout=1.0)
        except subprocess.TimeoutExpired:  # what it started left its group and holds the pipe
            if proc.stdout is not None:
                proc.stdout.close()
            proc.wait()
        return Answer("TIMEOUT", False)
    words = out.split()
    return Answer(words[0] if words else "NO_ANSWER", proc.returncode == 0, out.strip())


def peers(text: str) -> dict[str, str]:
    """Address → state of every node ``nvidia-imex-ctl -N`` lists."""
    return {m[1]: m[2] for m in map(_NODE_LINE.match, text.splitlines()) if m}


def describe(code: int) -> str:
    """A child's exit, in words (Popen's negative codes are signals)."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exit status {code}"


@records.record
class Options:
    directory: Path  # the domain's IMEX directory (/imexd in the pod)
    imex: str  # the nvidia-imex executable
    ctl: str  # the nvidia-imex-ctl executable
    interval_s: float = 1.0
    ctl_timeout_s: float = 5.0
    lost_after_s: float = 60.0  # a detached daemon silent this long is gone
    stop_timeout_s: float = 20.0  # after forwarding a stop signal, then SIGKILL

    @property
    def config(self) -> Path:
        return self.directory / imexconfig.CONFIG


class Supervisor:
    """One IMEX daemon: its child process, its readiness, its ``status.json``."""

    def __init__(
        self, options: Options, *, log: Log, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.options = options
        self._log = log
        self._clock = clock
        self._stop = threading.Event()
        self._signal: int | None = None
        self._child: subprocess.Popen[bytes] | None = None
        self._detached = False
        self._nodes: list[str] = []
        self._ready: bool | None = None

    def request_stop(self, signum: int) -> None:
        """A signal handler: forward ``signum`` to the child and end the loop."""
        self._signal = signum
        self._stop.set()
        child = self._child
        if child is not None and child.returncode is None:
            with contextlib.suppress(OSError):
                child.send_signal(signum)

    def run(self) -> int:
        """Supervise until stopped (0), the directory goes (0) or the daemon is lost (1)."""
        opts = self.options
        self._nodes = imexconfig.read_nodes(opts.directory)
        if not self._start():
            return 1
        last_answer = self._clock()
        while True:
            if self._stop.is_set():
                return self._shutdown()
            if not opts.directory.is_dir():
                self._log.info(
                    "IMEX daemon's directory is gone; stopping", directory=str(opts.directory)
                )
                self._end_child()
                return 0
            code = self._child.poll() if self._child is not None else None
            if code is not None and code != 0:
                if self._stop.is_set():  # it ended on the signal we forwarded
                    return self._shutdown()
                self._log.error("IMEX daemon exited", exit_code=code, how=describe(code))
                return self._fail("IMEX daemon exited")
            if code == 0:  # it daemonized (or ended quietly): follow it through ctl
                self._child = None
                self._detached = True
                last_answer = self._clock()
                self._log.info(
                    "IMEX daemon detached; following it through nvidia-imex-ctl",
                    hint="DAEMONIZE=0 in its config keeps it in the foreground",
                )
            nodes = imexconfig.read_nodes(opts.directory)
            if nodes != self._nodes:
                if self._detached:
                    self._log.error(
                        "IMEX nodes config changed under a detached IMEX daemon; exiting so "
                        "the container restarts it",
                        nodes=nodes,
                    )
                    return self._fail("nodes config changed")
                self._log.info("IMEX daemon restarting for a new nodes config", nodes=nodes)
                self._end_child()
                self._nodes = nodes
                if not self._start():
                    return 1
                continue
            answer = self._ctl("-q")
            now = self._clock()
            if answer.answered:
                last_answer = now
            elif self._detached and now - last_answer > opts.lost_after_s:
                self._log.error(
                    "IMEX daemon stopped answering",
                    seconds=round(now - last_answer, 1),
                    answer=answer.word,
                )
                return self._fail("IMEX daemon stopped answering")
            self._report(answer)
            self._stop.wait(opts.interval_s)

    def _ctl(self, flag: str) -> Answer:
        opts = self.options
        return ask([opts.ctl, "-c", str(opts.config), flag], timeout_s=opts.ctl_timeout_s)

    def _start(self) -> bool:
        opts = self.options
        command = [opts.imex, "-c", str(opts.config)]
        try:
            self._child = subprocess.Popen(command, stdin=subprocess.DEVNULL)
        except OSError as exc:
            self._write(NOT_READY, reason=f"cannot start {opts.imex}: {exc}")
            self._log.error("IMEX daemon cannot start", command=command, error=str(exc))
            return False
        self._detached = False
        if self._stop.is_set() and self._signal is not None:  # stopped while starting
            self._child.send_signal(self._signal)
        self._log.info("IMEX daemon started", pid=self._child.pid, command=command)
        return True

    def _report(self, answer: Answer) -> None:
        ready = answer.answered and answer.word == imexconfig.READY_STATE
        listed: dict[str, str] = {}
        if answer.answered:  # a daemon that answers lists its peers
            table = self._ctl("-N")
            listed = peers(table.text) if table.answered else {}
        self._write(
            imexconfig.READY_STATE if ready else NOT_READY,
            ctl=answer.word,
            nodes=self._nodes,
            peers=listed,
            daemon="detached" if self._detached else "child",
        )
        if ready != self._ready:
            self._ready = ready
            self._log.info("IMEX daemon readiness changed", ready=ready, answer=answer.word)

    def _write(self, state: str, **detail: object) -> None:
        with contextlib.suppress(OSError):  # the directory went: the loop's check ends us
            imexconfig.write_status(self.options.directory, state, **detail)

    def _end_child(self) -> str:
        """Stop the child (SIGTERM unless a stop signal was forwarded already, SIGKILL after
        ``stop_timeout_s``); its exit in words."""
        child, self._child = self._child, None
        if child is None:
            return "detached: ends with the container" if self._detached else "not running"
        if child.returncode is None and self._signal is None:
            with contextlib.suppress(OSError):
                child.terminate()
        try:
            code = child.wait(timeout=self.options.stop_timeout_s)
        except subprocess.TimeoutExpired:
            child.kill()
            code = child.wait()
        return describe(code)

    def _shutdown(self) -> int:
        outcome = self._end_child()
        self._write(NOT_READY, reason="stopped")
        name = signal.Signals(self._signal).name if self._signal is not None else "stop"
        self._log.info("IMEX daemon stopped", signal=name, outcome=outcome)
        return 0

    def _fail(self, reason: str) -> int:
        """The daemon is lost: NOT_READY, and exit status 1 (the kubelet restarts us)."""
        self._end_child()
        self._write(NOT_READY, reason=reason)
        return 1
