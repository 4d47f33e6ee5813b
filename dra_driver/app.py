"""Composition root of the node agent (``dra-driver kubelet-plugin``): the one place that wires
real parts together.

It picks the device backend, the Kubernetes API adapter and the host paths, builds the driver
core, recovers its checkpoint, serves the kubelet (DRA service, then registration), runs the
ResourceSlice publisher and the periodic claim clean-up, and on SIGTERM shuts down in the order
that keeps the kubelet informed: registration socket first (the kubelet stops sending work), then
the publisher and clean-up, then the DRA service once in-flight calls are answered.
"""

from __future__ import annotations

import dataclasses
import signal
import threading
from pathlib import Path
from typing import Any, Protocol

import structlog

from dra_driver import logs
from dra_driver.devices import backend as devices_backend
from dra_driver.devices import model
from dra_driver.driver import cdi, checkpoint, driverfiles, inventory, state
from dra_driver.driver import driver as driver_mod
from dra_driver.kube import api as kube
from dra_driver.kubelet import dra_service, registration, server
from dra_driver.slices import build, publisher

FAKE_DEVICE_NODE = "/dev/null"


@dataclasses.dataclass(frozen=True, slots=True)
class PluginSettings:
    """Everything the node agent is configured with (flags / environment)."""

    node_name: str
    driver_name: str = "gpu.nvidia.com"
    registry_dir: Path = Path("/var/lib/kubelet/plugins_registry")
    plugins_dir: Path = Path("/var/lib/kubelet/plugins")
    cdi_root: Path = Path("/var/run/cdi")
    kubeconfig: Path | None = None
    driver_root: Path = Path("/")
    fake: bool = False
    dev_root: Path = Path("/")
    boot_id_file: Path = checkpoint.BOOT_ID_FILE
    workers: int = 32
    serial: bool = False
    cleanup_interval_s: float = 60.0
    publish: bool = True

    @property
    def plugin_dir(self) -> Path:
        return self.plugins_dir / self.driver_name

    @property
    def dra_socket(self) -> Path:
        return self.plugin_dir / "dra.sock"

    @property
    def registration_socket(self) -> Path:
        return self.registry_dir / f"{self.driver_name}-reg.sock"


class Stoppable(Protocol):
    def stop(self) -> None: ...


class StartupError(Exception):
    """The agent cannot start; the message says what to fix."""


def build_driver(
    settings: PluginSettings,
    *,
    devices: model.NodeDevices,
    api: kube.KubeApi,
    log: structlog.typing.FilteringBoundLogger,
) -> driver_mod.Driver:
    """The driver core for ``devices``, with its checkpoint recovered (usable without gRPC)."""
    mig_minors = None if settings.fake else inventory.read_mig_minors()
    files = driverfiles.discover(settings.driver_root)
    if not files:
        log.warning(
            "no NVIDIA driver libraries found; containers get device nodes only",
            driver_root=str(settings.driver_root),
        )
    specs = cdi.CdiSpecs(
        root=settings.cdi_root,
        driver_name=settings.driver_name,
        host=cdi.HostDevices(
            fake_node=FAKE_DEVICE_NODE if settings.fake else None, dev_root=settings.dev_root
        ),
        driver_files=files,
    )
    store = checkpoint.Checkpoint(
        directory=settings.plugin_dir,
        boot_id=checkpoint.read_boot_id(settings.boot_id_file),
        log=log,
    )
    claim_state = state.ClaimState(
        api=api,
        driver_name=settings.driver_name,
        pool_name=settings.node_name,
        devices=inventory.build(devices, mig_minors=mig_minors),
        specs=specs,
        store=store,
        log=log,
    )
    claim_state.recover()
    return driver_mod.Driver(
        claim_state=claim_state, log=log, workers=settings.workers, serial=settings.serial
    )


def start_publisher(
    settings: PluginSettings,
    *,
    devices: model.NodeDevices,
    api: kube.KubeApi,
    log: structlog.typing.FilteringBoundLogger,
) -> Stoppable | None:
    """Keep this node's ResourceSlices published (unless ``settings.publish`` is off)."""
    if not settings.publish:
        log.info("not publishing ResourceSlices (disabled)")
        return None
    return publisher.start_node_publisher(
        api=api,
        devices=devices,
        driver_name=settings.driver_name,
        node_name=settings.node_name,
        log=log.bind(component="publisher"),
    )


def run(
    settings: PluginSettings,
    *,
    backend: devices_backend.Backend,
    api: kube.KubeApi,
    stop: threading.Event,
    log: structlog.typing.FilteringBoundLogger | None = None,
) -> int:
    """Run the node agent until ``stop`` is set; returns the exit code."""
    log = log or logs.get("kubelet-plugin")
    log = log.bind(driver=settings.driver_name, node=settings.node_name)
    try:
        devices = backend.discover()
    except devices_backend.DiscoveryError as exc:
        raise StartupError(f"cannot discover GPUs: {exc}") from exc
    log.info("discovered devices", gpus=len(devices.gpus))
    try:
        driver = build_driver(settings, devices=devices, api=api, log=log)
    except OSError as exc:
        raise StartupError(f"cannot set up the plugin's files: {exc}") from exc

    dra = server.UnixServer(
        path=settings.dra_socket,
        services=[lambda s: dra_service.add_services(s, plugin=driver, log=log)],
        log=log,
    )
    reg_service = registration.RegistrationService(
        driver_name=settings.driver_name, endpoint=str(dra.path), log=log
    )
    reg = server.UnixServer(
        path=settings.registration_socket, services=[reg_service.add_to], log=log, max_workers=2
    )
    cleanup = driver_mod.CleanupLoop(driver=driver, interval_s=settings.cleanup_interval_s, log=log)
    slice_publisher: Stoppable | None = None
    try:
        dra.start()
        reg.start()
        try:
            slice_publisher = start_publisher(settings, devices=devices, api=api, log=log)
        except build.BuildError as exc:  # keep serving: prepared claims still need unprepare
            log.error("cannot build this node's ResourceSlices; NOT publishing", error=str(exc))
        cleanup.start()
        log.info(
            "kubelet plugin ready", dra_socket=str(dra.path), registration_socket=str(reg.path)
        )
        stop.wait()
        log.info("shutting down")
    finally:
        reg.stop(grace_s=1.0)
        if slice_publisher is not None:
            slice_publisher.stop()
        cleanup.stop()
        dra.stop(grace_s=5.0)
        driver.close()
    log.info("stopped")
    return 0


def install_signal_handlers(stop: threading.Event) -> None:
    """SIGTERM / SIGINT → orderly shutdown (call from the main thread)."""

    def handler(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
