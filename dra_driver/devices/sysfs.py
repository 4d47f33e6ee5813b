"""What NVML does not say about where a GPU sits on the host: its PCIe root complex and NUMA node,
and what machine it sits in.

The NVML backend asks a :class:`Sysfs` for these; on a real node :class:`HostSysfs` reads
``/sys/bus/pci/devices/<bus id>`` and the firmware's DMI product name, the fake backend answers
from its profile. Keeping this a
seam lets the one discovery code path run over real and fake hardware alike.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol


class Sysfs(Protocol):
    """Host facts about a PCI device, keyed by its sysfs bus id (``0000:17:00.0``)."""

    def pcie_root(self, bus_id: str) -> str | None:
        """The ``pciDDDD:BB`` root complex the device hangs off, or None when unknown."""
        ...

    def numa_node(self, bus_id: str) -> int | None:
        """The device's NUMA node, or None when the platform reports none (-1) or it is unknown."""
        ...

    def machine_type(self) -> str | None:
        """The machine's model (DMI product name, e.g. ``DGX H100``), or None when unknown."""
        ...

    def iommu_group(self, bus_id: str) -> int | None:
        """The device's IOMMU group number, or None when the IOMMU is off or it is unknown."""
        ...


class HostSysfs:
    """The real ``/sys`` (or a copy of its layout under ``root``, for tests)."""

    def __init__(self, *, root: Path = Path("/sys")) -> None:
        self.root = root

    def _device(self, bus_id: str) -> Path:
        return self.root / "bus" / "pci" / "devices" / bus_id

    def pcie_root(self, bus_id: str) -> str | None:
        link = self._device(bus_id)
        if not link.exists():
            return None
        real = Path(os.path.realpath(link))
        devices = Path(os.path.realpath(self.root / "devices"))
        try:
            parts = real.relative_to(devices).parts
        except ValueError:
            parts = real.parts
        return next((p for p in parts if p.startswith("pci")), None)

    def numa_node(self, bus_id: str) -> int | None:
        try:
            text = (self._device(bus_id) / "numa_node").read_text(encoding="ascii")
            node = int(text.strip())
        except (OSError, ValueError):
            return None
        return node if node >= 0 else None

    def iommu_group(self, bus_id: str) -> int | None:
        """The name of the group ``iommu_group`` links to (``.../iommu_groups/<n>``)."""
        try:
            target = os.readlink(self._device(bus_id) / "iommu_group")
            return int(Path(target).name)
        except (OSError, ValueError):
            return None

    def machine_type(self) -> str | None:
        """``/sys/class/dmi/id/product_name``, trimmed; None when absent, unreadable or empty."""
        try:
            text = (self.root / "class" / "dmi" / "id" / "product_name").read_text(
                encoding="utf-8", errors="replace"
            )
        except OSError:
            return None
        return text.strip() or None
