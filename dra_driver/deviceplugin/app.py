"""Composition root of device-plugin mode: discovered devices + settings → running endpoints.

Builds the resources (MIG strategy, replicas), the static CDI spec, one servicer and one
registered endpoint per resource, and shuts them down in order. The CLI hands in the discovered
devices, the health source and the readiness flags (``registered`` once every resource is
registered with the kubelet), so tests run the very same wiring against a fake profile and a
test kubelet.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping
from pathlib import Path

from dra_driver import health_server, logs
from dra_driver.deviceplugin import allocate, cdi, inventory, registrar, service
from dra_driver.devices import health, model, topology

_log = logs.get("deviceplugin.app")


@dataclasses.dataclass(frozen=True, slots=True)
class Config:
    """Everything ``dra-driver device-plugin`` can be told (each is a flag with an env twin)."""

    resource_name: str = "nvidia.com/gpu"
    plugin_dir: Path = Path("/var/lib/kubelet/device-plugins")
    strategy: allocate.Strategy = allocate.Strategy.CDI
    cdi_root: Path = Path("/var/run/cdi")
    cdi_kind: str = cdi.DEFAULT_KIND
    replicas: int = 1
    mig_strategy: inventory.MigStrategy = inventory.MigStrategy.NONE
    fake_node: str | None = None  # with a fake backend: the host node backing /dev/nvidia*
    poll_interval_s: float = 0.5
    stream_poll_s: float = 1.0


class DevicePluginApp:
    """All endpoints of one node. Raises InventoryError / CdiError / RegistrationError early."""

    def __init__(
        self,
        *,
        config: Config,
        devices: model.NodeDevices,
        health_source: health.HealthSource,
        mig_minors: Mapping[str, int] | None,
        readiness: health_server.Readiness | None = None,
    ) -> None:
        """``mig_minors``: the host's MIG capability minors, ``None`` with a fake backend."""
        self.config = config
        self.readiness = readiness or health_server.Readiness(
            conditions=health_server.DEVICE_PLUGIN_CONDITIONS
        )
        self._registered: set[str] = set()
        self._registered_lock = threading.Lock()
        self.resources = inventory.build(
            devices,
            resource_name=config.resource_name,
            mig_strategy=config.mig_strategy,
            mig_minors=mig_minors,
            replicas=config.replicas,
        )
        units = [d.unit for r in self.resources for d in r.devices]
        for unit in {u.uuid: u for u in units if u.problem}.values():
            _log.warning("device cannot be allocated", device=unit.uuid, problem=unit.problem)
        self.spec = cdi.StaticSpec(
            root=config.cdi_root,
            kind=config.cdi_kind,
            units=units,
            fake_node=config.fake_node,
        )
        topo = topology.build(devices)
        self._fatal: registrar.RegistrationError | None = None
        self._done = threading.Event()
        self.endpoints: dict[str, registrar.Endpoint] = {}
        for res in self.resources:
            svc = service.DevicePluginService(
                resource=res,
                topo=topo,
                health_source=health_source,
                strategy=config.strategy,
                cdi_kind=config.cdi_kind,
                spec=self.spec,
                fake_node=config.fake_node,
                stream_poll_s=config.stream_poll_s,
            )
            self.endpoints[res.name] = registrar.Endpoint(
                service=svc,
                plugin_dir=config.plugin_dir,
                poll_interval_s=config.poll_interval_s,
                on_fatal=self._on_fatal,
                on_registered=self._on_registered,
            )

    def start(self) -> None:
        """Write the CDI spec, then serve and register every resource."""
        if self.config.strategy is allocate.Strategy.CDI:
            self.spec.ensure()
        for name, endpoint in self.endpoints.items():
            try:
                endpoint.start()
            except BaseException:
                self.stop()
                raise
            _log.info(
                "device plugin resource started",
                resource=name,
                devices=len(endpoint.service.resource.devices),
                strategy=self.config.strategy.value,
                replicas=self.config.replicas,
            )

    def stop(self) -> None:
        """Stop every endpoint and remove our sockets; the static CDI spec stays."""
        for endpoint in self.endpoints.values():
            endpoint.stop()
        self._done.set()

    def run(self, stop: threading.Event) -> registrar.RegistrationError | None:
        """Start, block until ``stop`` is set or registration fails fatally, then stop."""
        self.start()
        try:
            while not stop.wait(0.2) and not self._done.is_set():
                pass
        finally:
            self.stop()
        return self._fatal

    def _on_fatal(self, exc: registrar.RegistrationError) -> None:
        self._fatal = self._fatal or exc
        self.readiness.set("registered", False)
        self._done.set()

    def _on_registered(self, resource: str) -> None:
        with self._registered_lock:
            self._registered.add(resource)
            everything = self._registered >= set(self.endpoints)
        if everything:
            self.readiness.set("registered")
