"""The host-facing parts the node agent drives besides the GPUs' devices: GPU settings
(compute mode, time-slicing), MPS control daemons (processes of the agent, or Pods of their own
with ``--mps-daemon-image``) and MIG instances — each real or the fake node's stand-in, as the
settings say.

Why its own module: choosing between NVML / the driver root's programs and the stand-ins is
the same decision for three parts; :mod:`dra_driver.app` wires what these return and the tests
build the same parts the agent would.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from dra_driver.devices import backend as devices_backend
from dra_driver.devices import control, migcontrol, model, nvml
from dra_driver.driver import cdi, checkpoint, driverfiles, inventory
from dra_driver.kube import api as kube
from dra_driver.pluginsettings import PluginSettings

if TYPE_CHECKING:  # the MPS modules load with the first claim that needs them (lazymps)
    from dra_driver.driver.mps import daemons as mps
    from dra_driver.driver.mps import mpsprocess, mpsrecords, mpsrunner


def gpu_control_for(
    settings: PluginSettings,
    *,
    devices: model.NodeDevices,
    files: tuple[driverfiles.Mount, ...],
) -> control.GpuControl:
    """Fake nodes: settings recorded in ``<plugin dir>/fake-gpu-control.json``. Real nodes: NVML
    plus the driver root's nvidia-smi (preloading its libnvidia-ml when the root is not /)."""
    if settings.fake:
        return control.FakeGpuControl.for_devices(
            devices, state_file=settings.plugin_dir / "fake-gpu-control.json"
        )
    found = {Path(m.container_path).name: Path(m.local_path or m.host_path) for m in files}
    local_root = settings.driver_root_mount or settings.driver_root
    return control.HostGpuControl(
        nvml_api=nvml.real_module(),
        nvidia_smi=found.get("nvidia-smi"),
        preload=found.get("libnvidia-ml.so.1") if local_root != Path("/") else None,
    )


def mps_root(settings: PluginSettings) -> Path:
    """Where the MPS control daemons' records and directories are: ``<plugin dir>/mps``."""
    return settings.plugin_dir / "mps"


def mps_daemons_for(
    settings: PluginSettings,
    *,
    files: tuple[driverfiles.Mount, ...],
    gpu_control: control.GpuControl,
    log: structlog.typing.FilteringBoundLogger,
    api: kube.KubeApi | None = None,
    devices: inventory.Inventory | None = None,
    metrics: mps.MpsMetrics | None = None,
) -> mps.MpsDaemons:
    """MPS control daemons under ``<plugin dir>/mps``: the stand-in on fake nodes, else the
    driver root's ``nvidia-cuda-mps-control`` (with its libraries). With
    ``settings.mps_daemon_image`` each runs in a Pod of its own on this node (through ``api``;
    ``devices`` gives a GPU's device nodes), else as a process of the agent, in a mount
    namespace whose ``/dev/shm`` is the directory its clients get."""
    from dra_driver.driver.mps import daemons as mps
    from dra_driver.driver.mps import mpsprocess

    root_seen = settings.driver_root_mount or settings.driver_root
    command, env = mpsprocess.program(
        fake=settings.fake, files=files, driver_root_is_slash=root_seen == Path("/")
    )
    runner = None
    if settings.mps_daemon_image:
        if api is None or devices is None:
            raise ValueError("MPS daemon Pods need the API server and the node's devices")
        runner = _pod_runner(settings, api=api, devices=devices, log=log.bind(component="mps"))
    return mps.MpsDaemons(
        root=mps_root(settings),
        command=command,
        gpu_control=gpu_control,
        boot_id=checkpoint.read_boot_id(settings.boot_id_file),
        log=log.bind(component="mps"),
        env=env,
        isolate_shm=not settings.fake,
        runner=runner,
        metrics=metrics,
    )


def _pod_runner(
    settings: PluginSettings,
    *,
    api: kube.KubeApi,
    devices: inventory.Inventory,
    log: structlog.typing.FilteringBoundLogger,
) -> Callable[[mpsprocess.Processes], mpsrunner.DaemonRunner]:
    root_seen = settings.driver_root_mount or settings.driver_root

    def nodes(device: mpsrecords.DaemonDevice) -> tuple[str, ...]:
        known = devices.get(device.name)
        return known.device_nodes if known is not None else ()

    def build(processes: mpsprocess.Processes) -> mpsrunner.DaemonRunner:
        from dra_driver.driver.mps import mpspod, mpspodspec
        from dra_driver.kube import objectclient  # the client library, only when it is needed

        template = mpspodspec.PodTemplate(
            driver_name=settings.driver_name,
            node_name=settings.node_name,
            namespace=settings.pod_namespace,
            image=settings.mps_daemon_image,
            command=processes.command,
            env=processes.env,
            device_nodes=nodes,
            fake_device_node=cdi.FAKE_DEVICE_NODE if settings.fake else None,
            driver_root=None if settings.fake else (str(settings.driver_root), str(root_seen)),
            privileged=not settings.fake,
        )
        return mpspod.PodRunner(
            objects=objectclient.objects_for(api),
            template=template,
            owner=lambda: api.get_node(settings.node_name),
            processes=processes,
            log=log,
            ready_timeout_s=settings.mps_ready_timeout_s,
        )

    return build


def mig_control_for(
    settings: PluginSettings, backend: devices_backend.Backend
) -> migcontrol.MigControl | None:
    """MIG control over the backend's NVML (the stand-in for fake nodes, with its state file);
    None when no GPU is dynamic (the agent then never changes a MIG layout) and none is offered
    for passthrough (which asks it for a GPU's processes)."""
    if not settings.dynamic.enabled and not settings.vfio.selection.enabled:
        return None
    # The fake backend's module is loaded only when --fake made one (a real node never loads it).
    fake = sys.modules.get("dra_driver.devices.fake")
    fake_nvml = backend.nvml if fake is not None and isinstance(backend, fake.FakeBackend) else None
    if fake_nvml is not None:
        fake_nvml.mig_state.use_file(settings.fake_mig_state)
    return migcontrol.NvmlMigControl(nvml_api=fake_nvml or nvml.real_module())
