"""Unix-socket gRPC servers with the lifecycle the kubelet expects.

A socket file left by a crashed earlier run is removed before binding (otherwise bind fails and
the kubelet keeps dialing a dead socket); our sockets are removed on shutdown, the registration
socket first, which is how the kubelet learns the plugin is gone. Only our own paths are touched,
never another instance's.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import stat
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc
import structlog

MAX_SOCKET_PATH = 107  # sun_path is 108 bytes including the terminating NUL


class SocketError(Exception):
    """A socket path cannot be used (too long, or occupied by something that is not a socket)."""


def remove_stale_socket(path: Path) -> bool:
    """Remove ``path`` if it is a socket; error if it is anything else. True if removed."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return False
    if not stat.S_ISSOCK(mode):
        raise SocketError(f"{path} exists and is not a socket; refusing to remove it")
    path.unlink(missing_ok=True)
    return True


class UnixServer:
    """One grpc.Server bound to one unix socket."""

    def __init__(
        self,
        *,
        path: Path,
        services: Sequence[Callable[[grpc.Server], None]],
        log: structlog.typing.FilteringBoundLogger,
        max_workers: int = 16,
        stream_slots: int = 0,
    ) -> None:
        """``max_workers`` serve unary calls; ``stream_slots`` more threads serve the streams
        a :class:`~dra_driver.grpcstreams.StreamSlots` of that size lets in."""
        self.path = path.absolute()
        self.services = services
        self.log = log.bind(socket=str(self.path))
        self.max_workers = max_workers
        self.stream_slots = stream_slots
        self._server: grpc.Server | None = None

    def start(self) -> None:
        if len(os.fsencode(self.path)) > MAX_SOCKET_PATH:
            raise SocketError(f"socket path {self.path} is longer than {MAX_SOCKET_PATH} bytes")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if remove_stale_socket(self.path):
            self.log.info("removed a stale socket left by an earlier run")
        server = grpc.server(
            concurrent.futures.ThreadPoolExecutor(
                max_workers=self.max_workers + self.stream_slots,
                thread_name_prefix=f"grpc-{self.path.stem}",
            )
        )
        for add in self.services:
            add(server)
        # "unix:<absolute path>": grpc refuses "unix://" addresses of 106 and 107 bytes.
        server.add_insecure_port(f"unix:{self.path}")
        server.start()
        self._server = server
        self.log.info("serving")

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop serving (in-flight calls get ``grace_s``) and remove the socket file."""
        if self._server is not None:
            self._server.stop(grace_s).wait()
            self._server = None
        with contextlib.suppress(SocketError, OSError):
            remove_stale_socket(self.path)
        self.log.info("stopped")
