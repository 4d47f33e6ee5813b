"""The node agent's health socket: what ``discover`` and ``fake-event`` talk to.

Why it exists: the GPU health an agent tracks (conditions, hold times, recovery counts) lives in
that process, and on fake nodes so do the fake GPUs themselves, so ``dra-driver fake-event``
must reach the running agent to make a fake GPU fail through the agent's own NVML stand-in, and
``dra-driver discover`` asks it what it knows. One small unix socket next to the agent's other
sockets (``<kubelet-plugins-dir>/<driver>/health.sock``, or
``<device-plugin-dir>/dra-driver-health.sock``) speaks one JSON object per line each way:

* ``{"op": "status"}`` → ``{"ok": true, "fake": bool, "devices": [...]}``
* ``{"op": "inject", "gpu": 3, "event": "xid", "xid": 79, ...}`` → ``{"ok": true, "message"}``
  (fake nodes only; a real node answers ``ok: false`` with the reason)

Bad requests get ``{"ok": false, "error": "..."}`` and never disturb the agent. The server
re-creates its socket if someone deletes it (the kubelet empties its device-plugin directory when
it restarts). Standard library only.
"""

from __future__ import annotations

import json
import os
import socket
import socketserver
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dra_driver import logs

_log = logs.get("healthcontrol")
Handler = Callable[[Mapping[str, Any]], dict[str, Any]]
MAX_REQUEST = 64 * 1024
DRA_SOCKET = "health.sock"
DEVICE_PLUGIN_SOCKET = "dra-driver-health.sock"


class ControlError(Exception):
    """The agent cannot be reached or answered with an error (the message says which)."""


class _Server(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    handler: Handler


class _Request(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        line = self.rfile.readline(MAX_REQUEST + 1)
        try:
            if len(line) > MAX_REQUEST:
                raise ValueError(f"request longer than {MAX_REQUEST} bytes")
            request = json.loads(line or b"{}")
            if not isinstance(request, dict):
                raise ValueError("request must be a JSON object")
            answer = self.server.handler(request)
        except ValueError as exc:
            answer = {"ok": False, "error": f"bad request: {exc}"}
        except Exception as exc:  # never let one request take the server down
            _log.error("health socket request failed", error=repr(exc))
            answer = {"ok": False, "error": f"internal error: {exc!r}"}
        self.wfile.write(json.dumps(answer).encode() + b"\n")


class ControlServer:
    """Serves ``handler`` on ``path`` in daemon threads until :meth:`stop`."""

    def __init__(self, path: Path, handler: Handler, *, check_s: float = 1.0) -> None:
        self.path = path
        self._handler = handler
        self._check_s = check_s
        self._server: _Server | None = None
        self._inode: int | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._bind()
        keeper = threading.Thread(target=self._keep, name="health-socket", daemon=True)
        keeper.start()
        self._threads.append(keeper)
        _log.info("health socket listening", socket=str(self.path))

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            self._close()
        for thread in self._threads:
            thread.join(2.0)

    def _bind(self) -> None:
        with self._lock:
            if self._stop.is_set():
                return
            self._close()
            if self.path.exists() or self.path.is_symlink():
                self.path.unlink()
            server = _Server(str(self.path), _Request)
            server.handler = self._handler
            self._server = server
            self._inode = os.stat(self.path).st_ino
            thread = threading.Thread(target=server.serve_forever, args=(0.2,), daemon=True)
            thread.start()

    def _close(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._server = None
        try:
            if os.stat(self.path).st_ino == self._inode:
                self.path.unlink()
        except OSError:
            pass

    def _keep(self) -> None:
        """Re-create the socket when it was deleted or replaced under us."""
        while not self._stop.wait(self._check_s):
            try:
                ours = os.stat(self.path).st_ino == self._inode
            except OSError:
                ours = False
            if not ours and not self._stop.is_set():
                _log.warning("health socket vanished; serving it again", socket=str(self.path))
                try:
                    self._bind()
                except OSError as exc:
                    _log.error("cannot re-create the health socket", error=str(exc))


def request(path: Path, message: Mapping[str, Any], *, timeout_s: float = 10.0) -> dict[str, Any]:
    """Send one request to the agent behind ``path``; raises :class:`ControlError`."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        try:
            sock.connect(str(path))
            sock.sendall(json.dumps(dict(message)).encode() + b"\n")
            with sock.makefile("rb") as stream:
                line = stream.readline(MAX_REQUEST + 1)
        except FileNotFoundError:
            raise ControlError(
                f"no node agent health socket at {path} (is the agent running?)"
            ) from None
        except OSError as exc:
            raise ControlError(f"cannot talk to the node agent at {path}: {exc}") from None
    try:
        answer = json.loads(line)
    except ValueError:
        raise ControlError(f"the node agent at {path} sent no valid answer") from None
    if not isinstance(answer, dict):
        raise ControlError(f"the node agent at {path} sent no valid answer")
    if not answer.get("ok"):
        raise ControlError(str(answer.get("error") or "the node agent refused the request"))
    return answer


def dra_sockets(plugins_dir: Path, driver_name: str) -> list[Path]:
    """Health sockets of the DRA agent(s) of ``driver_name`` (one per running instance)."""
    directory = plugins_dir / driver_name
    return sorted(directory.glob("health*.sock")) if directory.is_dir() else []


def dra_socket(plugin_dir: Path, short_id: str = "") -> Path:
    """The DRA agent's socket in its plugin directory (per instance with a pod UID)."""
    return plugin_dir / (f"health-{short_id}.sock" if short_id else DRA_SOCKET)


def device_plugin_socket(device_plugin_dir: Path) -> Path:
    return device_plugin_dir / DEVICE_PLUGIN_SOCKET
