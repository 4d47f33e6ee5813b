"""The MPS control program as processes: spawn a daemon, talk to it, find it, end it.

Why it exists: :mod:`~.daemons` decides *when* a daemon runs and keeps the records;
this module knows *how* a process is started (foreground ``-f``, its own session so it outlives
the agent, a marker in its environment), recognised again after an agent restart (pid plus the
kernel's start time, so a reused pid never passes for it), asked to ``quit`` through the control
client, and, if it does not, ended with SIGTERM and SIGKILL. :class:`ProcessRunner` is the
:class:`~dra_driver.driver.mps.mpsrunner.DaemonRunner` on top (daemons as the agent's own processes,
outside a cluster); the Pod runner uses :meth:`Processes.quit` too. The program is a command
prefix (:func:`program`): the real ``nvidia-cuda-mps-control`` or the stand-in
:mod:`dra_driver.devices.fake.fakemps`. The periodic housekeeping is
:class:`~dra_driver.driver.periodic.MpsSupervisor`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final, Literal

from dra_driver.driver import driverfiles
from dra_driver.driver.mps.mpsrecords import DaemonRecord, Dirs, MpsError
from dra_driver.driver.mps.mpsrunner import Launch, Liveness, Stray

MARKER: Final = "DRA_DRIVER_MPS_DAEMON"
POLL_S: Final = 0.02


class Processes:
    """Daemon processes of one agent; children it spawned are reaped, others are polled."""

    def __init__(
        self,
        *,
        command: Sequence[str],
        env: Mapping[str, str] | None = None,
        isolate_shm: bool = False,
        stop_timeout_s: float = 10.0,
    ) -> None:
        self.command = tuple(command)
        self.env = dict(env or {})
        self.isolate_shm = isolate_shm
        self.stop_timeout_s = stop_timeout_s
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    def spawn(self, *, pipe: Path, log: Path, shm: Path, visible: Sequence[str]) -> int:
        """Start the control daemon in the foreground of its own session; its pid."""
        env = {
            **os.environ,
            **self.env,
            "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
            "CUDA_MPS_LOG_DIRECTORY": str(log),
            "CUDA_VISIBLE_DEVICES": ",".join(visible),
            MARKER: str(pipe),
        }
        argv = [*self.command, "-f"]
        if self.isolate_shm:  # the daemon's /dev/shm is the directory its clients get too
            script = 'mount --bind "$0" /dev/shm && exec "$@"'
            argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script,
                    str(shm), *argv]  # fmt: skip
        with (log / "daemon.out").open("ab") as out:
            child = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # outlives the agent: adopted after a restart
                close_fds=True,
            )
        self._children[child.pid] = child
        return child.pid

    def alive(self, pid: int, start_time: int | None) -> bool:
        """Whether ``pid`` is a live (not zombie) process started at ``start_time``."""
        self.reap()
        stat = _stat(pid)
        if stat is None or stat[0] == "Z":
            return False
        return start_time is None or stat[1] == start_time

    def reap(self) -> None:
        # Called from request threads and the supervisor at once: both may see the same child
        # exited, so the second one must not fail removing what the first removed.
        for pid, child in list(self._children.items()):
            if child.poll() is not None:
                self._children.pop(pid, None)

    def find(self, pipe: Path) -> int | None:
        """A live process marked as the daemon of ``pipe`` (one whose pid was never recorded)."""
        marker = f"{MARKER}={pipe}".encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            if marker in environ.split(b"\0") and self.alive(int(entry.name), None):
                return int(entry.name)
        return None

    def quit(self, pipe: Path) -> bool:
        """Ask the daemon behind ``pipe`` to ``quit`` through the control client; whether the
        client said it was done (it fails when no daemon answers)."""
        if not self.command:
            return False
        try:
            done = subprocess.run(
                list(self.command),
                input=b"quit\n",
                env={**os.environ, **self.env, "CUDA_MPS_PIPE_DIRECTORY": str(pipe)},
                capture_output=True,
                timeout=self.stop_timeout_s,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            return False
        return getattr(done, "returncode", 1) == 0

    def end(self, pipe: Path, pid: int, start_time: int | None) -> None:
        """Ask the daemon to ``quit``, then insist (SIGTERM, SIGKILL) until ``pid`` is gone."""
        self.quit(pipe)
        for sig, wait_s in (
            (None, self.stop_timeout_s),
            (signal.SIGTERM, 2.0),
            (signal.SIGKILL, 5.0),
        ):
            if sig is not None and self.alive(pid, start_time):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + wait_s
            while self.alive(pid, start_time) and time.monotonic() < deadline:
                time.sleep(POLL_S)
            if not self.alive(pid, start_time):
                return


class ProcessRunner:
    """Daemons as processes of the agent, in sessions of their own (adopted after a restart of
    the agent's *process*, but ended with its container)."""

    kind: Final[Literal["process"]] = "process"

    def __init__(self, processes: Processes, *, ready_timeout_s: float = 15.0) -> None:
        self.processes = processes
        self.ready_timeout_s = ready_timeout_s

    def intent(self, record: DaemonRecord) -> DaemonRecord:
        return record  # a pid exists only once spawned; a crash before it is found by marker

    def start(self, launch: Launch, record: DaemonRecord) -> DaemonRecord:
        dirs = launch.dirs
        pid = self.processes.spawn(
            pipe=dirs.pipe, log=dirs.log, shm=dirs.shm, visible=[d.uuid for d in launch.devices]
        )
        return record.model_copy(
            update={"state": "Running", "pid": pid, "startTime": start_time(pid)}
        )

    def wait_ready(self, launch: Launch, record: DaemonRecord) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        control_socket = launch.dirs.pipe / "control"
        while not control_socket.exists():
            if not self.liveness(record).alive:
                raise MpsError(f"the daemon exited at start: {log_tail(launch.dirs)}")
            if time.monotonic() > deadline:
                raise MpsError(
                    f"no control socket after {self.ready_timeout_s:g}s: {log_tail(launch.dirs)}"
                )
            time.sleep(POLL_S)

    def liveness(self, record: DaemonRecord) -> Liveness:
        if record.pid is not None and self.processes.alive(record.pid, record.startTime):
            return Liveness(alive=True)
        return Liveness(alive=False, reason="exited", detail=f"process {record.pid} is gone")

    def stop(self, record: DaemonRecord, dirs: Dirs) -> None:
        alive = self.liveness(record).alive
        pid = record.pid if alive else self.processes.find(dirs.pipe)
        if pid is not None:
            self.processes.end(dirs.pipe, pid, record.startTime if pid == record.pid else None)

    def strays(self, records: Mapping[str, DaemonRecord]) -> list[Stray]:
        return []  # an unrecorded process is found by its marker when its record is read

    def end_stray(self, stray: Stray) -> None:
        return None

    def describe(self, record: DaemonRecord) -> dict[str, object]:
        return {"pid": record.pid}


def log_tail(dirs: Dirs) -> str:
    """The end of what a daemon process printed (one line, for an error message)."""
    try:
        text = (dirs.log / "daemon.out").read_text(errors="replace")
    except OSError:
        text = ""
    return " ".join(text.split())[-300:] or "no output"


def program(
    *, fake: bool, files: Sequence[driverfiles.Mount], driver_root_is_slash: bool
) -> tuple[tuple[str, ...], dict[str, str]]:
    """(command, extra environment) of the MPS control program: the stand-in
    :mod:`dra_driver.devices.fake.fakemps` on fake nodes, else ``nvidia-cuda-mps-control`` from the
    driver root (none found: an empty command, and starting a daemon says so), with the driver
    root's libraries when that root is not ``/``."""
    if fake:
        # Run as a script, isolated and without site-packages: the stand-in needs only the
        # standard library, and ``-m`` would first import the fake backend's package (a third of
        # a second per daemon and per client command, paid on every start and stop).
        from dra_driver.devices.fake import fakemps

        return (sys.executable, "-I", "-S", fakemps.__file__), {}
    found = {Path(m.container_path).name: Path(m.local_path or m.host_path) for m in files}
    binary = found.get("nvidia-cuda-mps-control")
    env: dict[str, str] = {}
    libcuda = found.get("libcuda.so.1")
    if libcuda is not None and not driver_root_is_slash:
        env["LD_LIBRARY_PATH"] = str(libcuda.parent)
    return ((str(binary),) if binary is not None else ()), env


def start_time(pid: int) -> int | None:
    stat = _stat(pid)
    return stat[1] if stat is not None else None


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks since boot) of ``pid``; None when there is none."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[19])
