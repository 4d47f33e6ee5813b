"""The host-facing parts the node agent drives besides the GPUs' devices: GPU settings
(compute mode, time-slicing), MPS control daemons and MIG instances — each real or the fake
node's stand-in, as the settings say.

Why its own module: choosing between NVML / the driver root's programs and the stand-ins is
the same decision for three parts; :mod:`dra_driver.app` wires what these return and the tests
build the same parts the agent would.
"""

from __future__ import annotations

from pathlib import Path

import structlog

from dra_driver.devices import backend as devices_backend
from dra_driver.devices import control, fake, migcontrol, model, nvml
from dra_driver.driver import checkpoint, driverfiles, mps, mpsprocess
from dra_driver.pluginsettings import PluginSettings


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


def mps_daemons_for(
    settings: PluginSettings,
    *,
    files: tuple[driverfiles.Mount, ...],
    gpu_control: control.GpuControl,
    log: structlog.typing.FilteringBoundLogger,
) -> mps.MpsDaemons:
    """MPS control daemons under ``<plugin dir>/mps``: the stand-in on fake nodes, else the
    driver root's ``nvidia-cuda-mps-control`` (with its libraries), in a mount namespace whose
    ``/dev/shm`` is the directory its clients get."""
    command, env = mpsprocess.program(
        fake=settings.fake,
        files=files,
        driver_root_is_slash=(settings.driver_root_mount or settings.driver_root) == Path("/"),
    )
    return mps.MpsDaemons(
        root=settings.plugin_dir / "mps",
        command=command,
        gpu_control=gpu_control,
        boot_id=checkpoint.read_boot_id(settings.boot_id_file),
        log=log.bind(component="mps"),
        env=env,
        isolate_shm=not settings.fake,
    )


def mig_control_for(
    settings: PluginSettings, backend: devices_backend.Backend
) -> migcontrol.MigControl | None:
    """MIG control over the backend's NVML (the stand-in for fake nodes, with its state file);
    None when no GPU is dynamic (the agent then never changes a MIG layout)."""
    if not settings.dynamic.enabled:
        return None
    fake_nvml = backend.nvml if isinstance(backend, fake.FakeBackend) else None
    if fake_nvml is not None:
        fake_nvml.mig_state.use_file(settings.fake_mig_state)
    return migcontrol.NvmlMigControl(nvml_api=fake_nvml or nvml.real_module())
