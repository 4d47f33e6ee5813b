"""A stand-in for ``nvidia-cuda-mps-control``, so MPS sharing runs on nodes without GPUs.

Why it exists: on fake nodes (tests, the demo, CPU-only kind clusters) the node agent must still
start, supervise, adopt and stop one MPS control daemon per shared GPU. This small program plays
the real binary's part, with the same command line and environment, so the agent's code path is
the one it uses with real GPUs (:mod:`dra_driver.driver.mps.daemons`):

* ``python -m dra_driver.devices.fake.fakemps -f`` (or ``python -I -S .../fakemps.py -f``, as the
  node agent runs it: this module needs nothing beyond the standard library, and must not): the
  control daemon in the foreground. It needs
  ``CUDA_MPS_PIPE_DIRECTORY`` and ``CUDA_MPS_LOG_DIRECTORY`` (like the real one), creates the
  ``control`` socket in the pipe directory once it is ready, writes ``control.log`` in the log
  directory, and refuses to start when a daemon already answers on that pipe directory.
  ``-d`` does the same in the background (the process detaches and the command returns).
* ``python -m dra_driver.devices.fake.fakemps`` (no option): the client. It sends each line of
  standard input to the daemon and prints the answers, like ``echo quit |
  nvidia-cuda-mps-control``; without a daemon it fails as the real client does.

Commands understood: ``quit`` (the daemon exits), ``get_default_active_thread_percentage``,
``set_default_active_thread_percentage <n>``, ``get_server_list`` (empty: no GPU work runs
here). The socket is bound and reached through an open descriptor of the pipe directory, so a
long plugin directory never hits the 108-byte limit of unix socket paths.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TextIO

CONTROL = "control"
LOG = "control.log"
_TIMEOUT_S = 5.0


class FakeMpsError(Exception):
    """The stand-in cannot do what it was asked (message for the operator)."""


def _pipe() -> Path:
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
    if not pipe:
        raise FakeMpsError("CUDA_MPS_PIPE_DIRECTORY must be set")
    return Path(pipe)


def _log_dir() -> Path:
    log = os.environ.get("CUDA_MPS_LOG_DIRECTORY")
    if not log:
        raise FakeMpsError("the control daemon needs CUDA_MPS_LOG_DIRECTORY")
    return Path(log)


def ask(pipe: Path, command: str, timeout_s: float = _TIMEOUT_S) -> str:
    """Send one command to the daemon behind ``pipe``; its answer (FakeMpsError if none)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock, _socket_path(pipe) as path:
        sock.settimeout(timeout_s)
        try:
            sock.connect(path)
            sock.sendall(command.encode() + b"\n")
            sock.shutdown(socket.SHUT_WR)
            chunks = []
            while chunk := sock.recv(4096):
                chunks.append(chunk)
        except OSError as exc:
            raise FakeMpsError(f"Cannot find MPS control daemon process ({exc})") from None
    return b"".join(chunks).decode()


@contextlib.contextmanager
def _socket_path(pipe: Path) -> Iterator[str]:
    """A short path naming ``<pipe>/control`` (through an open descriptor of the directory), so
    the 108-byte limit of unix socket paths never bites, whatever the plugin directory."""
    try:
        fd = os.open(pipe, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise FakeMpsError(f"Cannot find MPS control daemon process ({exc})") from None
    try:
        yield f"/proc/self/fd/{fd}/{CONTROL}"
    finally:
        os.close(fd)


class Daemon:
    """The control daemon: one command per connection, until ``quit`` or SIGTERM."""

    def __init__(self, pipe: Path, log_dir: Path) -> None:
        self.pipe = pipe
        self.log_path = log_dir / LOG
        self.threads = "100.0"
        self._stop = False

    def log(self, text: str) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        with self.log_path.open("a", encoding="utf-8") as out:
            out.write(f"[{stamp}] {text}\n")

    def serve(self) -> int:
        self.pipe.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FakeMpsError):
            ask(self.pipe, "get_server_list", timeout_s=1.0)
            self.log("An instance of this daemon is already running")
            print("An instance of this daemon is already running", file=sys.stderr)
            return 1
        with contextlib.suppress(FileNotFoundError):
            (self.pipe / CONTROL).unlink()  # stale socket of a daemon that died
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with _socket_path(self.pipe) as path:
            server.bind(path)
        server.listen(16)
        server.settimeout(0.2)
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "_stop", True))
        devices = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        self.log(f"Control daemon started (pid {os.getpid()}, devices {devices or 'all'})")
        try:
            while not self._stop:
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    continue
                with conn:
                    self._answer(conn)
        finally:
            server.close()
            with contextlib.suppress(FileNotFoundError):
                (self.pipe / CONTROL).unlink()
            self.log("Control daemon exiting")
        return 0

    def _answer(self, conn: socket.socket) -> None:
        conn.settimeout(_TIMEOUT_S)
        data = b""
        with contextlib.suppress(OSError):
            while chunk := conn.recv(4096):
                data += chunk
        command, *args = data.decode(errors="replace").split() or [""]
        self.log(f"Command: {' '.join([command, *args])}")
        reply = ""
        if command == "quit":
            self._stop = True
        elif command == "get_default_active_thread_percentage":
            reply = self.threads
        elif command == "set_default_active_thread_percentage" and len(args) == 1:
            self.threads = f"{float(args[0]):.1f}"
        elif command == "get_server_list":
            reply = ""
        else:
            reply = "Unrecognized command"
        with contextlib.suppress(OSError):
            conn.sendall((reply + "\n").encode() if reply else b"")


def client(stdin: TextIO, stdout: TextIO) -> int:
    pipe = _pipe()
    for line in stdin:
        if line.strip():
            stdout.write(ask(pipe, line.strip()))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args == ["-f"]:
            return Daemon(_pipe(), _log_dir()).serve()
        if args == ["-d"]:
            _pipe(), _log_dir()  # checked before detaching, as the real one does
            subprocess.Popen(
                [sys.executable, "-I", "-S", os.path.abspath(__file__), "-f"],
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            return 0
        if not args:
            return client(sys.stdin, sys.stdout)
        print("usage: fakemps [-d | -f]", file=sys.stderr)
        return 2
    except FakeMpsError as exc:
        print(str(exc), file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
