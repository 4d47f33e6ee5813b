"""Socket lifecycle and kubelet registration for one device-plugin resource.

Why its own module: the kubelet forgets every device plugin when it restarts. It recreates
``kubelet.sock`` and deletes the plugin sockets in its directory, and it never calls back; the
plugin must notice and start over. :class:`Endpoint` serves the DevicePlugin service on its own
socket in ``--device-plugin-dir`` and runs one watcher thread that (re)registers whenever the
kubelet's socket is a new file (inode/ctime changed) and re-serves whenever our socket vanished.
A registration the kubelet *rejects* (resource name taken, version refused) is fatal, as the API
expects; an unreachable kubelet is retried every poll interval.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc

from dra_driver import logs
from dra_driver.deviceplugin import service
from dra_driver.pb.deviceplugin.v1beta1 import deviceplugin_pb2 as pb
from dra_driver.pb.deviceplugin.v1beta1 import deviceplugin_pb2_grpc as pb_grpc

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
MAX_SOCKET_PATH = 107  # sun_path is 108 bytes including the terminating NUL
UNARY_WORKERS = 8  # Allocate, GetPreferredAllocation, ...; ListAndWatch streams get their own
_TRANSIENT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)

_log = logs.get("deviceplugin.registrar")

FileId = tuple[int, int, int]  # (st_dev, st_ino, st_ctime_ns): a new file, not just a new inode


class RegistrationError(Exception):
    """The kubelet refused our registration, or our socket cannot be served."""


def socket_name(resource_name: str) -> str:
    """Our socket file name: ``nvidia.com/gpu`` → ``dra-driver-nvidia.com-gpu.sock``."""
    return f"dra-driver-{resource_name.replace('/', '-')}.sock"


def _file_id(path: Path) -> FileId | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_ctime_ns


class Endpoint:
    """Serve one :class:`~service.DevicePluginService` and keep it registered with the kubelet."""

    def __init__(
        self,
        *,
        service: service.DevicePluginService,
        plugin_dir: Path,
        poll_interval_s: float,
        register_timeout_s: float = 5.0,
        on_fatal: Callable[[RegistrationError], None] | None = None,
        on_registered: Callable[[str], None] | None = None,
    ) -> None:
        """``on_registered(resource_name)`` runs after every successful registration."""
        self.service = service
        self.resource_name = service.resource.name
        self.plugin_dir = plugin_dir.absolute()
        self.socket_path = self.plugin_dir / socket_name(self.resource_name)
        self.kubelet_socket = self.plugin_dir / KUBELET_SOCKET
        if len(os.fsencode(self.socket_path)) > MAX_SOCKET_PATH:
            raise RegistrationError(
                f"socket path {self.socket_path} is longer than the {MAX_SOCKET_PATH} bytes a "
                "unix socket path may have; use a shorter --device-plugin-dir"
            )
        self._poll = poll_interval_s
        self._timeout = register_timeout_s
        self._on_fatal = on_fatal
        self._on_registered = on_registered
        self._server: grpc.Server | None = None
        self._served: FileId | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cond = threading.Condition()
        self.registrations = 0
        self.serves = 0
        self._log = _log.bind(resource=self.resource_name, socket=str(self.socket_path))

    # --- public -------------------------------------------------------------------------------

    def start(self) -> None:
        """Serve now (errors raise), then register and watch in a background thread."""
        self._serve()
        self._thread = threading.Thread(
            target=self._watch, daemon=True, name=f"dp-registrar-{self.resource_name}"
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop watching and serving and remove our socket (only if it is still ours)."""
        self._stop.set()
        self.service.stop()
        if self._thread is not None:
            self._thread.join(timeout=self._timeout + 2)
        self._shutdown_server()

    def wait_registered(self, count: int, timeout: float) -> bool:
        """Block until at least ``count`` successful registrations happened (tests, start-up)."""
        with self._cond:
            return self._cond.wait_for(lambda: self.registrations >= count, timeout=timeout)

    # --- serving ------------------------------------------------------------------------------

    def _serve(self) -> None:
        self._shutdown_server()
        try:
            self.plugin_dir.mkdir(parents=True, exist_ok=True)
            self.socket_path.unlink(missing_ok=True)  # a stale socket from a previous run
        except OSError as exc:  # e.g. a directory where our socket goes
            raise RegistrationError(f"cannot listen on {self.socket_path}: {exc}") from exc
        server = grpc.server(
            futures.ThreadPoolExecutor(
                max_workers=UNARY_WORKERS + self.service.slots.limit,
                thread_name_prefix=f"dp-{self.resource_name}",
            )
        )
        pb_grpc.add_DevicePluginServicer_to_server(self.service, server)
        # "unix:<absolute path>": grpc refuses "unix://" addresses of 106 and 107 bytes.
        try:  # grpc raises (never returns 0) when it cannot bind
            server.add_insecure_port(f"unix:{self.socket_path}")
        except RuntimeError as exc:
            raise RegistrationError(f"cannot listen on {self.socket_path}: {exc}") from exc
        server.start()
        self._server = server
        self._served = _file_id(self.socket_path)
        self.serves += 1
        self._log.info("serving device plugin")

    def _shutdown_server(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.stop(grace=0.2).wait(timeout=2)
        if self._served is not None and _file_id(self.socket_path) == self._served:
            self.socket_path.unlink(missing_ok=True)
        self._served = None

    def _socket_is_ours(self) -> bool:
        return self._served is not None and _file_id(self.socket_path) == self._served

    # --- registration -------------------------------------------------------------------------

    def _register(self) -> None:
        request = pb.RegisterRequest(
            version=API_VERSION,
            endpoint=self.socket_path.name,
            resource_name=self.resource_name,
            options=pb.DevicePluginOptions(
                pre_start_required=False, get_preferred_allocation_available=True
            ),
        )
        with grpc.insecure_channel(f"unix:{self.kubelet_socket}") as channel:
            pb_grpc.RegistrationStub(channel).Register(request, timeout=self._timeout)

    def _watch(self) -> None:
        registered_with: FileId | None = None
        warned_for: FileId | None = None
        waiting = False  # said that kubelet.sock is missing, and it still is
        while not self._stop.is_set():
            if not self._socket_is_ours():
                self._log.warning(
                    "our socket was removed or replaced (kubelet restart?); serving again"
                )
                try:
                    self._serve()
                except RegistrationError as exc:
                    self._fatal(exc)
                    return
                registered_with = None
            kubelet = _file_id(self.kubelet_socket)
            if kubelet is None and not waiting:
                # No kubelet (yet, or restarting): say what we wait for instead of waiting mutely.
                self._log.info(
                    "waiting for the kubelet's registration socket",
                    kubelet=str(self.kubelet_socket),
                )
            waiting = kubelet is None
            if kubelet is not None and kubelet != registered_with:
                try:
                    self._register()
                except grpc.RpcError as exc:
                    code = exc.code() if isinstance(exc, grpc.Call) else None
                    detail = exc.details() if isinstance(exc, grpc.Call) else str(exc)
                    if code in _TRANSIENT:
                        if warned_for != kubelet:
                            self._log.warning(
                                "kubelet not reachable yet, will retry",
                                kubelet=str(self.kubelet_socket),
                                error=detail,
                            )
                            warned_for = kubelet
                    else:
                        self._fatal(
                            RegistrationError(
                                f"kubelet at {self.kubelet_socket} rejected the registration of "
                                f"{self.resource_name}: {detail}"
                            )
                        )
                        return
                else:
                    registered_with = kubelet
                    count = self.registrations + 1  # only this thread changes it
                    # Logged and reported before waiters wake: whoever waits for a registration
                    # (start-up, tests) finds its log line and readiness already there.
                    self._log.info("registered with kubelet", count=count)
                    if self._on_registered is not None:
                        self._on_registered(self.resource_name)
                    with self._cond:
                        self.registrations = count
                        self._cond.notify_all()
            self._stop.wait(self._poll)

    def _fatal(self, exc: RegistrationError) -> None:
        self._log.error("device plugin cannot continue", error=str(exc))
        if self._on_fatal is not None:
            self._on_fatal(exc)
