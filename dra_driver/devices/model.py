"""The typed model of one node's GPUs: what every other layer of the driver is written against.

Discovery backends (real NVML, fake profiles) produce a :class:`NodeDevices`; slice building,
allocation, preparation and the device plugin only ever read it. Everything here is immutable
plain data so it can be shared between threads and compared for equality (a changed model is
what bumps a ResourceSlice pool generation).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from dra_driver import records


class PathType(enum.StrEnum):
    """How two GPUs reach each other, in the vocabulary of ``nvidia-smi topo -m``.

    Ordered from closest to farthest for the PCIe kinds; NVLink is reported as ``NV<links>``.
    """

    NVLINK = "NV"
    PIX = "PIX"  # at most one PCIe bridge between them
    PXB = "PXB"  # several PCIe bridges, no host bridge
    PHB = "PHB"  # through one PCIe host bridge (same root complex)
    NODE = "NODE"  # across host bridges inside one NUMA node
    SYS = "SYS"  # across NUMA nodes (the SMP interconnect)


@records.record
class FabricInfo:
    """Multi-node NVLink fabric membership (GB200-class systems), as NVML reports it."""

    cluster_uuid: str
    clique_id: int
    state: str  # "completed", "in-progress", "not-started", "not-supported"


@records.record
class MigDevice:
    """One existing MIG device (a GPU instance plus its compute instance)."""

    uuid: str
    parent_index: int
    profile: str  # e.g. "1g.10gb", "3g.40gb"
    gpu_instance_id: int
    compute_instance_id: int
    placement_start: int
    placement_size: int
    memory_bytes: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int


@records.record
class MigProfile:
    """One GPU instance profile a MIG-capable GPU offers, with every placement NVML allows.

    Read from NVML whether or not MIG mode is on (``nvmlDeviceGetGpuInstanceProfileInfo`` and
    ``nvmlDeviceGetGpuInstancePossiblePlacements_v2``); what dynamic MIG publishes and creates.
    """

    id: int  # the GPU instance profile id instances are created with (19 for 1g.10gb on H100)
    slot: int  # the NVML_GPU_INSTANCE_PROFILE_* value it is listed under
    name: str  # "1g.10gb", "1g.10gb+me"
    slices: int  # GPU (compute) slices
    instances: int  # how many instances of this profile the GPU can hold at most
    memory_bytes: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    placements: tuple[tuple[int, int], ...]  # (start, size) in memory slices


@records.record
class Gpu:
    """One physical GPU."""

    index: int
    minor: int
    uuid: str
    product_name: str
    brand: str
    architecture: str
    cuda_compute_capability: str  # "9.0"
    driver_version: str  # as NVML prints it, e.g. "580.95.05"
    cuda_driver_version: str  # "12.8"
    memory_bytes: int
    pci_bus_id: str  # "0000:17:00.0" (sysfs form, lower case)
    pcie_root: str | None  # "pci0000:15"
    numa_node: int | None
    mig_enabled: bool = False
    # The GPU supports MIG (NVML answers its MIG mode), whether or not MIG mode is on.
    mig_capable: bool = False
    mig_devices: tuple[MigDevice, ...] = ()
    # Active NVLink links to each peer GPU, keyed by peer *index*. GPUs behind NVSwitches
    # see every other switch-attached GPU with the link count of the narrower side.
    nvlinks: Mapping[int, int] = dataclasses.field(default_factory=dict)
    nvlink_switched: bool = False  # links go to NVSwitches rather than straight to peers
    fabric: FabricInfo | None = None
    # MIG-capable GPUs: the profiles NVML offers (in MIG mode or not); empty otherwise.
    mig_profiles: tuple[MigProfile, ...] = ()
    # The GPU's IOMMU group (``/sys/bus/pci/devices/<bdf>/iommu_group``); None: no IOMMU.
    iommu_group: int | None = None
    # Offered for VFIO passthrough as well (``--passthrough`` selected it, after discovery:
    # :func:`dra_driver.devices.passthrough.mark`); published twice then (docs/passthrough.md).
    passthrough: bool = False

    @property
    def name(self) -> str:
        """The device name published in ResourceSlices and used in claims."""
        return f"gpu-{self.minor}"

    @property
    def active_links(self) -> int:
        """Total active NVLink links of this GPU (switched GPUs: links into the fabric)."""
        if self.nvlink_switched:
            return max(self.nvlinks.values(), default=0)
        return sum(self.nvlinks.values())


@records.record
class NodeDevices:
    """All GPUs of one node, plus the PCIe path between every pair (from NVML or a profile)."""

    gpus: tuple[Gpu, ...]
    # PCIe relationship of each unordered pair (lower index first). NVLink is layered on top
    # by :mod:`dra_driver.devices.topology`; this is the path without NVLink.
    pcie_paths: Mapping[tuple[int, int], PathType] = dataclasses.field(default_factory=dict)
    # The machine's model as its firmware names it (DMI product name), None when unknown.
    machine_type: str | None = None

    def gpu(self, index: int) -> Gpu:
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu
        raise KeyError(f"no GPU with index {index}")

    def pcie_path(self, a: int, b: int) -> PathType:
        key = (a, b) if a < b else (b, a)
        return self.pcie_paths.get(key, PathType.SYS)


def mig_device_name(parent: Gpu, mig: MigDevice) -> str:
    """Stable DNS-label name of a MIG device: parent minor, profile and placement.

    The placement start identifies a GPU instance on its parent for as long as it exists, so the
    name survives driver restarts (unlike NVML's MIG device index).
    """
    return mig_placement_name(parent.minor, mig.profile, mig.placement_start)


def mig_placement_name(minor: int, profile: str, start: int) -> str:
    """``gpu-<minor>-mig-<profile>-<start>``: an existing MIG device and the dynamic MIG device
    that would be created at the same place carry the same name."""
    label = profile.lower().replace(".", "-").replace("+", "-")
    return f"gpu-{minor}-mig-{label}-{start}"


def to_dict(obj: Any) -> Any:
    """JSON-ready form of any model object (field names as in the dataclasses, documented)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
        return out
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, Mapping):
        return {str(k): to_dict(v) for k, v in obj.items()}
    if isinstance(obj, tuple | list):
        return [to_dict(v) for v in obj]
    return obj
