"""A stand-in kubelet for the device plugin: our own Registration server on a real unix socket.

It records every RegisterRequest (and the deadline it came with), can answer slowly, can refuse
registrations like a kubelet that already has the resource, and can "restart" the way the real
one does: stop, delete ``kubelet.sock`` (and the plugin sockets), then serve a fresh Registration
server on a new ``kubelet.sock``.
"""

from __future__ import annotations

import threading
from concurrent import futures
from pathlib import Path

import grpc

from dra_driver.pb.deviceplugin.v1beta1 import deviceplugin_pb2 as pb
from dra_driver.pb.deviceplugin.v1beta1 import deviceplugin_pb2_grpc as pb_grpc


class _Registration(pb_grpc.RegistrationServicer):
    def __init__(self, owner: FakeKubelet) -> None:
        self.owner = owner

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.Empty:
        with self.owner.cond:
            self.owner.deadlines.append(context.time_remaining())
        if self.owner.hold is not None:  # a slow kubelet: answer once the test lets it
            self.owner.hold.wait(timeout=30)
        with self.owner.cond:
            self.owner.requests.append(request)
            self.owner.cond.notify_all()
        if self.owner.reject is not None:
            context.abort(grpc.StatusCode.UNKNOWN, self.owner.reject)
        return pb.Empty()


class FakeKubelet:
    """Registration side of a kubelet in ``plugin_dir``."""

    def __init__(self, plugin_dir: Path, *, reject: str | None = None) -> None:
        self.plugin_dir = plugin_dir
        self.socket = plugin_dir / "kubelet.sock"
        self.reject = reject
        self.requests: list[pb.RegisterRequest] = []
        self.deadlines: list[float | None] = []  # seconds each Register call had left
        self.hold: threading.Event | None = None  # set: Register waits for it first
        self.cond = threading.Condition()
        self._server: grpc.Server | None = None

    def start(self) -> FakeKubelet:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port(f"unix:{self.socket}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=0).wait(timeout=2)
            self._server = None
        self.socket.unlink(missing_ok=True)

    def restart(self, *, delete_plugin_sockets: bool = True) -> None:
        """What a kubelet restart looks like from the plugin directory."""
        self.stop()
        if delete_plugin_sockets:
            for entry in self.plugin_dir.glob("*.sock"):
                entry.unlink(missing_ok=True)
        self.start()

    def wait_requests(self, count: int, timeout: float = 5.0) -> list[pb.RegisterRequest]:
        with self.cond:
            ok = self.cond.wait_for(lambda: len(self.requests) >= count, timeout=timeout)
            assert ok, f"expected {count} registrations within {timeout}s, got {self.requests}"
            return list(self.requests)

    def plugin_channel(self, endpoint: str) -> grpc.Channel:
        """A channel to a registered plugin, dialled the way the kubelet does it."""
        return grpc.insecure_channel(f"unix:{(self.plugin_dir / endpoint).absolute()}")
