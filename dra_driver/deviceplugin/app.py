"""Composition root of device-plugin mode: discovered devices + settings → running endpoints.

Builds the resources (MIG strategy, replicas), the static CDI spec, one servicer and one
registered endpoint per resource, and shuts them down in order. The CLI hands in the discovered
devices, the health source and the readiness flags (``registered`` once every resource is
registered with the kubelet), so tests run the very same wiring against a fake profile and a
test kubelet.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Mapping
from pathlib import Path

from dra_driver import health_server, logs, records
from dra_driver.deviceplugin import allocate, cdi, inventory, registrar, service
from dra_driver.deviceplugin import mps as mps_replicas
from dra_driver.devices import control, health, model, nvml, topology
from dra_driver.driver import checkpoint, driverfiles, periodic
from dra_driver.driver.mps import daemons as mps
from dra_driver.driver.mps import mpsprocess

_log = logs.get("deviceplugin.app")


class SharingStrategy(enum.StrEnum):
    """How the replicas of one GPU share it (with ``--replicas`` above 1)."""

    TIME_SLICING = "time-slicing"  # no limits: CUDA time-slicing between the containers
    MPS = "mps"  # one MPS daemon per GPU; each replica 1/N of memory and SMs


@records.record
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
    sharing: SharingStrategy = SharingStrategy.TIME_SLICING
    mps_dir: Path = Path("/run/dra-driver/mps")  # daemons' pipe, log and shm dirs; records
    mps_check_interval_s: float = 10.0  # how often dead MPS daemons are restarted
    driver_root: Path = Path("/")  # where nvidia-cuda-mps-control is found (real GPUs)


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
        gpu_control: control.GpuControl | None = None,
    ) -> None:
        """``mig_minors``: the host's MIG capability minors, ``None`` with a fake backend;
        ``gpu_control`` (MPS replicas switch compute modes): default by ``config.fake_node``."""
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
        self.daemons = _daemons(config, devices, gpu_control)
        self.mps = (
            mps_replicas.MpsReplicas(daemons=self.daemons, units=units, replicas=config.replicas)
            if config.sharing is SharingStrategy.MPS
            else None
        )
        # Restarts a daemon that died (every few seconds while MPS replicas are served).
        self._supervisor = periodic.MpsSupervisor(
            check=self.daemons.supervise, interval_s=config.mps_check_interval_s, log=_log
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
                mps=self.mps,
            )
            self.endpoints[res.name] = registrar.Endpoint(
                service=svc,
                plugin_dir=config.plugin_dir,
                poll_interval_s=config.poll_interval_s,
                on_fatal=self._on_fatal,
                on_registered=self._on_registered,
            )

    def start(self) -> None:
        """Write the CDI spec, start (or adopt) the MPS daemons of MPS replicas (stopping any
        left from an earlier MPS configuration otherwise), then serve and register."""
        if self.config.strategy is allocate.Strategy.CDI:
            self.spec.ensure()
        problems = self.mps.start() if self.mps is not None else self.daemons.recover({})
        for problem in problems:
            _log.error("MPS daemon problem", problem=problem)
        if self.mps is not None:
            self._supervisor.start()
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
        """Stop every endpoint and remove our sockets; the static CDI spec and the MPS daemons
        stay (containers still use them; the next start adopts them)."""
        self._supervisor.stop()
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


def _daemons(
    config: Config, devices: model.NodeDevices, gpu_control: control.GpuControl | None
) -> mps.MpsDaemons:
    """The MPS daemons under ``config.mps_dir``: the stand-in and a recording GPU control with a
    fake backend, else the driver root's nvidia-cuda-mps-control and NVML."""
    log = logs.get("deviceplugin.mps")
    fake = config.fake_node is not None
    files = driverfiles.discover(config.driver_root) if config.sharing == "mps" and not fake else ()
    command, env = mpsprocess.program(
        fake=fake, files=files, driver_root_is_slash=config.driver_root == Path("/")
    )
    if fake:
        gpu_control = gpu_control or control.FakeGpuControl.for_devices(
            devices, state_file=config.mps_dir / "fake-gpu-control.json"
        )
    else:
        gpu_control = gpu_control or control.HostGpuControl(
            nvml_api=nvml.real_module(), nvidia_smi=None
        )
    return mps.MpsDaemons(
        root=config.mps_dir,
        command=command,
        env=env,
        gpu_control=gpu_control,
        boot_id=checkpoint.read_boot_id(),
        log=log,
        isolate_shm=config.fake_node is None,
    )
