"""Plugin registration: how the kubelet discovers our DRA service.

The kubelet watches its ``plugins_registry`` directory; for our socket there it calls ``GetInfo``
(answered with the plugin type, our driver name, the DRA socket path and the DRA API versions we
serve, v1 first, then the health stream versions), then reports with
``NotifyRegistrationStatus``. A refusal is logged as an error the operator sees, with the
kubelet's reason; the kubelet retries on its own. ``on_status`` hands each verdict to the app
(readiness follows it). The messages are read and written by :mod:`~dra_driver.kubelet.wire`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import grpc
import structlog

from dra_driver import records
from dra_driver.kubelet import wire

SERVICE = "pluginregistration.Registration"
PLUGIN_TYPE = "DRAPlugin"
DRA_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
# The DRAPlugin versions come first; the health stream strings follow (contracts.md §2.3).
ALL_VERSIONS = (*DRA_VERSIONS, "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")


@records.record
class Status:
    """The kubelet's last word on our registration."""

    registered: bool
    error: str


class RegistrationService:
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

    def GetInfo(self, request: wire.Empty, context: grpc.ServicerContext) -> wire.PluginInfo:
        self.log.debug("kubelet asked for plugin info")
        return wire.PluginInfo(
            type=PLUGIN_TYPE,
            name=self.driver_name,
            endpoint=self.endpoint,
            supported_versions=tuple(self.versions),
        )

    def NotifyRegistrationStatus(
        self, request: wire.RegistrationStatus, context: grpc.ServicerContext
    ) -> wire.Empty:
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
        return wire.EMPTY

    def add_to(self, server: grpc.Server) -> None:
        wire.add_service(
            server,
            SERVICE,
            [
                ("GetInfo", wire.unary(self.GetInfo, wire.decode_empty, wire.encode_plugin_info)),
                (
                    "NotifyRegistrationStatus",
                    wire.unary(
                        self.NotifyRegistrationStatus,
                        wire.decode_registration_status,
                        wire.encode_empty,
                    ),
                ),
            ],
        )
