"""Which GPUs are offered for VFIO passthrough (``--passthrough``), and the names that go with it.

Why it exists: a GPU selected here is published twice, as today's GPU device and as a
passthrough device ``gpu-vfio-<minor>`` (DeviceClass ``vfio.gpu.nvidia.com``, attribute ``type:
vfio``, the names NVIDIA's driver uses), both consuming one shared counter, so the scheduler
picks per claim whether the GPU goes to containers or to a VM (docs/passthrough.md). The choice
is made once after discovery and carried in the model (:attr:`model.Gpu.passthrough`, set by
:func:`mark`), so every builder of slices — the agent, ``slices``, ``simulate`` — publishes the
same devices without one more parameter through each of them.

A GPU without an IOMMU group cannot be passed through (the IOMMU is off); it is not marked, and
:func:`mark` says why. The selection grammar is :mod:`dra_driver.devices.gpuselect`'s.
"""

from __future__ import annotations

import dataclasses

from dra_driver import records
from dra_driver.devices import gpuselect, model

FLAG = "--passthrough"
NEEDS = "shared counters"
DEVICE_TYPE = "vfio"  # the ``type`` attribute; the DeviceClass selects on it
DEVICE_CLASS = "vfio.gpu.nvidia.com"
DRIVER_VFIO = "vfio-pci"
DRIVER_NVIDIA = "nvidia"


def device_name(gpu: model.Gpu) -> str:
    """``gpu-vfio-<minor>``: the passthrough device of ``gpu``."""
    return f"gpu-vfio-{gpu.minor}"


def gpu_name_of(device: str) -> str | None:
    """``gpu-<minor>`` for a passthrough device name, None for any other name."""
    prefix = "gpu-vfio-"
    if device.startswith(prefix) and device[len(prefix) :].isdigit():
        return f"gpu-{device[len(prefix) :]}"
    return None


@records.record
class Passthrough:
    """The ``--passthrough`` selection (none, all, a product regex, ``auto:``...)."""

    selection: gpuselect.GpuSelection = dataclasses.field(default_factory=gpuselect.GpuSelection)

    @classmethod
    def parse(cls, text: str | None) -> Passthrough:
        """Raises :class:`gpuselect.SelectionError` naming the flag."""
        return cls(gpuselect.GpuSelection.parse(text, flag=FLAG, needs=NEEDS))

    @property
    def auto(self) -> bool:
        return self.selection.auto

    @property
    def text(self) -> str:
        return self.selection.text

    def selects(self, gpu: model.Gpu) -> bool:
        """Asked for, and the GPU has an IOMMU group."""
        return self.selection.wants(gpu) and gpu.iommu_group is not None

    def gpus(self, devices: model.NodeDevices) -> list[model.Gpu]:
        return [g for g in devices.gpus if self.selects(g)]


NONE = Passthrough()


def mark(
    devices: model.NodeDevices, selection: Passthrough, problems: list[str] | None = None
) -> model.NodeDevices:
    """``devices`` with the selected GPUs marked ``passthrough`` (the others unmarked).
    ``problems`` gets a line for each GPU asked for that cannot be offered."""
    out: list[model.Gpu] = []
    for gpu in devices.gpus:
        chosen = selection.selects(gpu)
        if selection.selection.wants(gpu) and not chosen and problems is not None:
            problems.append(
                f"GPU {gpu.name} ({gpu.pci_bus_id}) has no IOMMU group (is the IOMMU on? "
                "intel_iommu=on / amd_iommu=on); not offered for passthrough"
            )
        out.append(
            dataclasses.replace(gpu, passthrough=chosen) if chosen != gpu.passthrough else gpu
        )
    return dataclasses.replace(devices, gpus=tuple(out))


def marked(devices: model.NodeDevices) -> list[model.Gpu]:
    """The GPUs offered for passthrough."""
    return [g for g in devices.gpus if g.passthrough]
