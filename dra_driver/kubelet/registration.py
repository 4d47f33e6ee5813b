"""Plugin registration: how the kubelet discovers our DRA service.

The kubelet watches its ``plugins_registry`` directory; for our socket there it calls ``GetInfo``
(answered with the plugin type, our driver name, the DRA socket path and the DRA API versions we
serve, v1 first, then the health stream versions), then reports with
``NotifyRegistrationStatus``. A refusal is logged as an error the operator sees, with the
kubelet's reason; the kubelet retries on its own. ``on_status`` hands each verdict to the app
(readiness follows it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import grpc
import structlog

from dra_driver import records
from dra_driver.pb.pluginregistration.v1 import registration_pb2, registration_pb2_grpc

PLUGIN_TYPE = "DRAPlugin"
DRA_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
# The DRAPlugin versions come first; the health stream strings follow (contracts.md §2.3).
ALL_VERSIONS = (*DRA_VERSIONS, "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")


@records.record
class Status:
    """The kubelet's last word on our registration."""

    registered: bool
    error: str


class RegistrationService(registration_pb2_grpc.RegistrationServicer):
    """Servicer for ``pluginregistration.Registration``."""

    def __init__(
        self,
        *,
        driver_name: str,
        endpoint: str,
        log: structlog.typing.FilteringBoundLogger,
        versions: tuple[str, ...] = DRA_VERSIONS,
        on_status: Callable[[Status], None] | None = None,
    ) -> None:
        self.driver_name = driver_name
        self.endpoint = endpoint
        self.versions = versions
        self.log = log
        self.status: Status | None = None
        self.status_changed = threading.Event()
        self._on_status = on_status

    def GetInfo(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.log.debug("kubelet asked for plugin info")
        return registration_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=self.driver_name,
            endpoint=self.endpoint,
            supported_versions=list(self.versions),
        )

    def NotifyRegistrationStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.status = Status(registered=bool(request.plugin_registered), error=request.error)
        if self.status.registered:
            self.log.info(
                "kubelet registered the plugin", driver=self.driver_name, endpoint=self.endpoint
            )
        else:
            self.log.error(
                "kubelet REFUSED to register the plugin",
                driver=self.driver_name,
                endpoint=self.endpoint,
                reason=request.error or "(no reason given)",
            )
        self.status_changed.set()
        if self._on_status is not None:
            self._on_status(self.status)
        return registration_pb2.RegistrationStatusResponse()

    def add_to(self, server: grpc.Server) -> None:
        registration_pb2_grpc.add_RegistrationServicer_to_server(self, server)
