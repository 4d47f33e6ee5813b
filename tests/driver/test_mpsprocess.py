"""The MPS control program as processes, in-process: the environment and command line a daemon
is started with, how it is recognised (pid + start time from ``/proc``), and the grace periods
of ending one that does not quit (on an injected clock)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from dra_driver.devices.fake import fakemps
from dra_driver.driver import driverfiles
from dra_driver.driver.mps import mpsprocess


def dirs(tmp_path: Path) -> tuple[Path, Path, Path]:
    pipe, log, shm = tmp_path / "pipe", tmp_path / "log", tmp_path / "shm"
    for path in (pipe, log, shm):
        path.mkdir()
    return pipe, log, shm


def test_a_daemon_gets_its_pipe_log_visible_devices_and_marker(tmp_path: Path) -> None:
    pipe, log, shm = dirs(tmp_path)
    dump = tmp_path / "env"
    session = tmp_path / "session"
    script = f'env > {dump}; cut -d" " -f1,6 /proc/$$/stat > {session}; echo "args: $*"'
    procs = mpsprocess.Processes(command=("sh", "-c", script, "prog"), env={"EXTRA": "1"})
    pid = procs.spawn(pipe=pipe, log=log, shm=shm, visible=["GPU-a", "MIG-b"])
    child = procs._children[pid]
    assert child.wait(20) == 0
    env = dict(line.split("=", 1) for line in dump.read_text().splitlines() if "=" in line)
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-a,MIG-b"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe)
    assert env["CUDA_MPS_LOG_DIRECTORY"] == str(log)
    assert env[mpsprocess.MARKER] == str(pipe) and env["EXTRA"] == "1"
    assert (log / "daemon.out").read_text() == "args: -f\n"  # foreground, output in the log
    assert session.read_text().split() == [str(pid), str(pid)]  # its own session: outlives us


def test_isolated_shm_wraps_the_program_in_a_mount_namespace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipe, log, shm = dirs(tmp_path)
    seen: list[tuple[list[str], dict[str, Any]]] = []

    class Started:
        pid = 4242

    def popen(argv: list[str], **kw: Any) -> Started:
        seen.append((argv, kw))
        return Started()

    monkeypatch.setattr(mpsprocess.subprocess, "Popen", popen)
    procs = mpsprocess.Processes(command=("mps-control",), isolate_shm=True)
    assert procs.spawn(pipe=pipe, log=log, shm=shm, visible=["GPU-a"]) == 4242
    [(argv, kw)] = seen
    assert argv == [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        'mount --bind "$0" /dev/shm && exec "$@"',
        str(shm),
        "mps-control",
        "-f",
    ]
    assert kw["close_fds"] is True and kw["start_new_session"] is True
    assert kw["stdin"] == subprocess.DEVNULL and kw["stderr"] == subprocess.STDOUT


def test_pid_and_start_time_come_from_proc(tmp_path: Path) -> None:
    me = os.getpid()
    fields = Path(f"/proc/{me}/stat").read_text().rsplit(")", 1)[1].split()
    assert mpsprocess._stat(me) == ("R", int(fields[19]))  # reading it: running
    assert mpsprocess.start_time(me) == int(fields[19])
    procs = mpsprocess.Processes(command=())
    assert procs.alive(me, int(fields[19])) and procs.alive(me, None)
    assert not procs.alive(me, int(fields[19]) + 1)  # a reused pid is not the daemon
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(20)
    assert mpsprocess.start_time(gone.pid) is None and mpsprocess._stat(gone.pid) is None
    assert not procs.alive(gone.pid, None)


def test_two_threads_reaping_the_same_exited_child_both_succeed() -> None:
    """Found by the SIGKILL-with-shares crash test: an unprepare and the supervisor reaped at
    once and one failed with ``KeyError: <pid>``. Here both threads are inside ``poll`` of the
    same exited child before either removes it."""
    both_polling = threading.Barrier(2, timeout=10)

    class Exited:
        def poll(self) -> int:
            both_polling.wait()
            return 0

    procs = mpsprocess.Processes(command=())
    procs._children[4242] = Exited()  # type: ignore[assignment]
    failures: list[BaseException] = []

    def reap() -> None:
        try:
            procs.reap()
        except BaseException as exc:  # the failure is the finding
            failures.append(exc)

    threads = [threading.Thread(target=reap) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert failures == [] and procs._children == {}


class Clock:
    """time.monotonic / time.sleep of mpsprocess, advanced only by its sleeps."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_ending_a_daemon_that_ignores_quit_waits_then_sigterm_then_sigkill(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    monkeypatch.setattr(mpsprocess, "time", clock)
    asked: list[dict[str, Any]] = []
    monkeypatch.setattr(mpsprocess.subprocess, "run", lambda argv, **kw: asked.append(kw))
    signals: list[tuple[int, float]] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: signals.append((sig, clock.now)))
    procs = mpsprocess.Processes(command=("mps-control",), env={"E": "1"}, stop_timeout_s=4.0)
    alive_calls: list[int | None] = []

    def alive(pid: int, start_time: int | None) -> bool:
        alive_calls.append(start_time)
        return clock.now < 11.5  # gone some time after SIGKILL

    monkeypatch.setattr(procs, "alive", alive)
    procs.end(tmp_path / "pipe", 77, 1234)
    [run] = asked
    assert run["input"] == b"quit\n" and run["timeout"] == 4.0
    assert run["env"]["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path / "pipe")
    assert run["env"]["E"] == "1"
    assert [sig for sig, _ in signals] == [signal.SIGTERM, signal.SIGKILL]
    (_, term_at), (_, kill_at) = signals
    assert term_at == pytest.approx(4.0, abs=0.05)  # stop_timeout_s after quit
    assert kill_at - term_at == pytest.approx(2.0, abs=0.05)  # SIGTERM's grace
    assert set(alive_calls) == {1234}  # the daemon, never a process that reused its pid
    assert clock.now < 11.5 + 0.05


def test_ending_gives_up_after_sigkill_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    monkeypatch.setattr(mpsprocess, "time", clock)
    monkeypatch.setattr(mpsprocess.subprocess, "run", lambda argv, **kw: None)
    monkeypatch.setattr(os, "kill", lambda pid, sig: None)
    procs = mpsprocess.Processes(command=("mps-control",), stop_timeout_s=1.0)
    monkeypatch.setattr(procs, "alive", lambda pid, start_time: True)  # never dies
    procs.end(tmp_path / "pipe", 77, None)
    assert clock.now == pytest.approx(1.0 + 2.0 + 5.0, abs=0.05)


def test_the_program_is_the_stand_in_on_fake_nodes_else_the_driver_roots() -> None:
    assert mpsprocess.program(fake=True, files=(), driver_root_is_slash=False) == (
        (sys.executable, "-I", "-S", fakemps.__file__),
        {},
    )
    control = driverfiles.Mount(
        host_path="/run/nvidia/driver/usr/bin/nvidia-cuda-mps-control",
        container_path="/usr/bin/nvidia-cuda-mps-control",
        local_path="/driver-root/usr/bin/nvidia-cuda-mps-control",
    )
    libcuda = driverfiles.Mount(
        host_path="/run/nvidia/driver/usr/lib64/libcuda.so.1",
        container_path="/usr/lib64/libcuda.so.1",
    )
    files = (control, libcuda)
    # This process runs the binary where it sees it; its libraries come from the driver root.
    assert mpsprocess.program(fake=False, files=files, driver_root_is_slash=False) == (
        ("/driver-root/usr/bin/nvidia-cuda-mps-control",),
        {"LD_LIBRARY_PATH": "/run/nvidia/driver/usr/lib64"},
    )
    # The host's own driver (root "/"): its libraries are found the usual way.
    assert mpsprocess.program(fake=False, files=files, driver_root_is_slash=True) == (
        ("/driver-root/usr/bin/nvidia-cuda-mps-control",),
        {},
    )
    assert mpsprocess.program(fake=False, files=(control,), driver_root_is_slash=False) == (
        ("/driver-root/usr/bin/nvidia-cuda-mps-control",),
        {},
    )
    assert mpsprocess.program(fake=False, files=(libcuda,), driver_root_is_slash=True) == ((), {})
