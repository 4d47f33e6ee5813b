"""GPU discovery through NVML (nvidia-ml-py): :class:`PynvmlBackend` reads what the model needs.

Discovery's rules for NVML's quirks live here: calls a GPU does not support degrade to "absent",
a GPU that fails while being read is skipped with a warning, and only a missing library or driver
stops discovery (one operator-facing :class:`~dra_driver.devices.backend.DiscoveryError`).
The NVML module is *injected*: :class:`PynvmlBackend` takes any object offering pynvml's
functions, so the fake backend runs this very code over :mod:`dra_driver.devices.fake.fakenvml`
(one code path for real and fake hardware).

The pieces it stands on are modules of their own, below it: :mod:`dra_driver.devices.nvmlapi`
(the only importer of pynvml: its exception classes, structs and constants, the absent-fact
rules, and the library loading seam), :mod:`dra_driver.devices.nvmlmig` (MIG profiles and
devices) and :mod:`dra_driver.devices.nvmlsampler` (metrics sampling). Every public name of
``nvmlapi`` and :class:`~dra_driver.devices.nvmlsampler.NvmlSampler` are re-exported here, so
callers keep writing ``nvml.NVMLError``, ``nvml.optional``, ``nvml.NvmlSampler``.
"""

from __future__ import annotations

import ctypes
import dataclasses
import itertools
import os
import uuid as uuidlib
from collections.abc import Mapping
from typing import Any, Final

from dra_driver import logs
from dra_driver.devices import backend, model, nvmlapi, nvmlmig, topology
from dra_driver.devices import sysfs as sysfs_mod

# Re-exports (see the module docstring): the NVML facts, and the sampler.
from dra_driver.devices.nvmlapi import *  # noqa: F403
from dra_driver.devices.nvmlsampler import NvmlSampler as NvmlSampler

_log = logs.get(__name__)

_LEVEL_PATHS: Final[Mapping[int, model.PathType]] = {
    nvmlapi.NVML_TOPOLOGY_INTERNAL: model.PathType.PIX,  # two GPUs on one board
    nvmlapi.NVML_TOPOLOGY_SINGLE: model.PathType.PIX,
    nvmlapi.NVML_TOPOLOGY_MULTIPLE: model.PathType.PXB,
    nvmlapi.NVML_TOPOLOGY_HOSTBRIDGE: model.PathType.PHB,
    nvmlapi.NVML_TOPOLOGY_NODE: model.PathType.NODE,
    nvmlapi.NVML_TOPOLOGY_SYSTEM: model.PathType.SYS,
}
_HINT = "the NVIDIA driver must be installed on this node; use --fake PROFILE to run without GPUs"


@dataclasses.dataclass(slots=True)
class _Read:
    handle: Any
    gpu: model.Gpu
    direct: dict[int, int] = dataclasses.field(default_factory=dict)  # peer index → links
    switch_links: int = 0


class PynvmlBackend:
    """Discovery over an (injected) NVML module; see the module docstring for the rules."""

    def __init__(self, *, nvml: nvmlapi.NvmlApi, sysfs: sysfs_mod.Sysfs) -> None:
        self._nvml = nvml
        self._sysfs = sysfs

    @classmethod
    def create(
        cls,
        *,
        nvml: nvmlapi.NvmlApi | None = None,
        sysfs: sysfs_mod.Sysfs | None = None,
        library: str | None = None,
    ) -> PynvmlBackend:
        """Initialise NVML (the real pynvml unless given) or raise one clear DiscoveryError.

        The real pynvml loads ``library`` when given, else the file named by the environment
        variable ``DRA_DRIVER_NVML_LIBRARY`` when set, else what the dynamic loader finds for
        ``libnvidia-ml.so.1`` (:func:`~dra_driver.devices.nvmlapi.load_library`). A stand-in
        ``nvml`` loads nothing.
        """
        if nvml is None:
            api = nvmlapi.real_module()
            library = library or os.environ.get(nvmlapi.LIBRARY_ENV) or None
        else:
            api, library = nvml, None
        try:
            if library is not None:
                nvmlapi.load_library(library)
            api.nvmlInit()
        except nvmlapi.NVMLError_LibraryNotFound as exc:
            raise backend.DiscoveryError(
                f"NVML library {library or nvmlapi.DEFAULT_LIBRARY} not found: {_HINT}"
            ) from exc
        except nvmlapi.NVMLError_DriverNotLoaded as exc:
            raise backend.DiscoveryError(
                f"NVIDIA kernel driver is not loaded (NVML: {exc}): {_HINT}"
            ) from exc
        except nvmlapi.NVMLError_LibRmVersionMismatch as exc:
            raise backend.DiscoveryError(
                "NVML library and NVIDIA kernel driver versions differ (reload the driver or "
                f"reboot the node): {_HINT}"
            ) from exc
        except nvmlapi.NVMLError as exc:
            raise backend.DiscoveryError(f"NVML initialisation failed ({exc}): {_HINT}") from exc
        return cls(nvml=api, sysfs=sysfs or sysfs_mod.HostSysfs())

    @property
    def nvml_api(self) -> nvmlapi.NvmlApi:
        """The NVML module this backend calls (the health watcher calls the same one)."""
        return self._nvml

    def sampler(self) -> NvmlSampler:
        """Samples utilization, memory, power and temperature through this backend's NVML."""
        return NvmlSampler(self._nvml)

    def close(self) -> None:
        """Release NVML (pairs with the ``nvmlInit`` of :meth:`create`)."""
        try:
            self._nvml.nvmlShutdown()
        except nvmlapi.NVMLError as exc:
            _log.debug("nvmlShutdown failed", error=nvmlapi.describe(exc))

    def discover(self) -> model.NodeDevices:
        try:
            count = int(self._nvml.nvmlDeviceGetCount())
        except nvmlapi.NVMLError as exc:
            raise backend.DiscoveryError(
                f"NVML cannot count the GPUs: {nvmlapi.describe(exc)}"
            ) from exc
        driver = self._optional("nvmlSystemGetDriverVersion") or ""
        cuda = self._optional("nvmlSystemGetCudaDriverVersion")
        versions = (str(driver), nvmlapi.cuda_version(int(cuda)) if cuda is not None else "")
        read: dict[int, _Read] = {}
        for index in range(count):
            try:
                read[index] = self._read_gpu(index, versions)
            except (nvmlapi.NVMLError, nvmlapi.Absent) as exc:
                _log.warning("GPU skipped", index=index, error=nvmlapi.describe(exc))
        by_bus = {r.gpu.pci_bus_id: i for i, r in read.items()}
        for index, item in list(read.items()):
            try:
                self._read_links(item, by_bus)
            except nvmlapi.NVMLError as exc:
                _log.warning("GPU skipped", index=index, error=nvmlapi.describe(exc))
                del read[index]
        gpus = self._with_links(read)
        return model.NodeDevices(
            gpus=tuple(gpus[i] for i in sorted(gpus)),
            pcie_paths=self._pcie_paths(read, gpus),
            machine_type=self._sysfs.machine_type(),
        )

    # --- calls --------------------------------------------------------------------------------
    def _optional(self, name: str, *args: Any) -> Any:
        return nvmlapi.optional(self._nvml, name, *args)

    def _required(self, name: str, *args: Any) -> Any:
        fn = getattr(self._nvml, name, None)
        if fn is None:
            raise nvmlapi.Absent(f"{name} is not available in this NVML binding")
        try:
            return fn(*args)
        except nvmlapi.UNSUPPORTED as exc:
            raise nvmlapi.Absent(f"{name}: {nvmlapi.describe(exc)}") from exc

    # --- one GPU ------------------------------------------------------------------------------
    def _read_gpu(self, index: int, versions: tuple[str, str]) -> _Read:
        handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = str(self._required("nvmlDeviceGetUUID", handle))
        bus_id = nvmlapi.sysfs_bus_id(str(self._required("nvmlDeviceGetPciInfo", handle).busId))
        memory = int(self._required("nvmlDeviceGetMemoryInfo", handle).total)
        minor = self._optional("nvmlDeviceGetMinorNumber", handle)
        if minor is None:
            _log.warning("GPU has no minor number; using its index", index=index)
            minor = index
        cc = self._optional("nvmlDeviceGetCudaComputeCapability", handle)
        mig_mode = self._optional("nvmlDeviceGetMigMode", handle)
        mig_enabled = mig_mode is not None and mig_mode[0] == nvmlapi.NVML_DEVICE_MIG_ENABLE
        mig_profiles = nvmlmig.read_profiles(self._optional, handle) if mig_mode is not None else ()
        gpu = model.Gpu(
            index=index,
            minor=int(minor),
            uuid=uuid,
            product_name=str(self._optional("nvmlDeviceGetName", handle) or "Unknown"),
            brand=nvmlapi.BRAND_NAMES.get(self._optional("nvmlDeviceGetBrand", handle), "Unknown"),
            architecture=nvmlapi.ARCH_NAMES.get(
                self._optional("nvmlDeviceGetArchitecture", handle), "Unknown"
            ),
            cuda_compute_capability=f"{cc[0]}.{cc[1]}" if cc is not None else "",
            driver_version=versions[0],
            cuda_driver_version=versions[1],
            memory_bytes=memory,
            pci_bus_id=bus_id,
            pcie_root=self._sysfs.pcie_root(bus_id),
            numa_node=self._numa(handle, bus_id),
            iommu_group=self._sysfs.iommu_group(bus_id),
            mig_enabled=mig_enabled,
            mig_capable=mig_mode is not None,
            mig_devices=(
                nvmlmig.read_devices(
                    self._required,
                    self._optional,
                    index=index,
                    handle=handle,
                    total=memory,
                    profiles=mig_profiles,
                )
                if mig_enabled
                else ()
            ),
            fabric=self._fabric(handle),
            mig_profiles=mig_profiles,
        )
        return _Read(handle=handle, gpu=gpu)

    def _numa(self, handle: Any, bus_id: str) -> int | None:
        node = self._optional("nvmlDeviceGetNumaNodeId", handle)
        if node is not None and int(node) >= 0:
            return int(node)
        return self._sysfs.numa_node(bus_id)

    def _fabric(self, handle: Any) -> model.FabricInfo | None:
        info = None
        for name, struct in (
            ("nvmlDeviceGetGpuFabricInfoV", nvmlapi.c_nvmlGpuFabricInfoV_t),
            ("nvmlDeviceGetGpuFabricInfo", nvmlapi.c_nvmlGpuFabricInfo_t),
        ):
            candidate = struct() if struct is not None else None
            if (
                candidate is not None
                and self._optional(name, handle, ctypes.pointer(candidate)) is not None
            ):
                info = candidate
                break
        if info is None or info.state == nvmlapi.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED:
            return None
        return model.FabricInfo(
            cluster_uuid=str(uuidlib.UUID(bytes=bytes(info.clusterUuid))),
            clique_id=int(info.cliqueId),
            state=nvmlapi.FABRIC_STATES.get(int(info.state), "unknown"),
        )

    # --- NVLink and PCIe ----------------------------------------------------------------------
    def _read_links(self, item: _Read, by_bus: Mapping[str, int]) -> None:
        """Count active links per peer GPU and into NVSwitches; unsupported links are absent."""
        if getattr(self._nvml, "nvmlDeviceGetNvLinkState", None) is None:
            return
        for link in range(nvmlapi.NVML_NVLINK_MAX_LINKS):
            if self._optional("nvmlDeviceGetNvLinkState", item.handle, link) != (
                nvmlapi.NVML_FEATURE_ENABLED
            ):
                continue
            kind = self._optional("nvmlDeviceGetNvLinkRemoteDeviceType", item.handle, link)
            if kind == nvmlapi.NVML_NVLINK_DEVICE_TYPE_SWITCH:
                item.switch_links += 1
                continue
            if kind not in (None, nvmlapi.NVML_NVLINK_DEVICE_TYPE_GPU):
                continue  # e.g. a CPU (IBM NPU) at the other end
            remote = self._optional("nvmlDeviceGetNvLinkRemotePciInfo", item.handle, link)
            peer = (
                by_bus.get(nvmlapi.sysfs_bus_id(str(remote.busId))) if remote is not None else None
            )
            if peer is not None and peer != item.gpu.index:
                item.direct[peer] = item.direct.get(peer, 0) + 1

    @staticmethod
    def _with_links(read: Mapping[int, _Read]) -> dict[int, model.Gpu]:
        """Direct links as counted; every switch-attached pair gets the narrower side's links."""
        switched = {i for i, r in read.items() if r.switch_links}
        gpus: dict[int, model.Gpu] = {}
        for index, item in read.items():
            links = {p: n for p, n in item.direct.items() if p in read}
            if item.switch_links:
                for peer in switched - {index}:
                    links[peer] = links.get(peer, 0) + min(
                        item.switch_links, read[peer].switch_links
                    )
            gpus[index] = dataclasses.replace(
                item.gpu, nvlinks=links, nvlink_switched=bool(item.switch_links)
            )
        return gpus

    def _pcie_paths(
        self, read: Mapping[int, _Read], gpus: Mapping[int, model.Gpu]
    ) -> dict[tuple[int, int], model.PathType]:
        paths: dict[tuple[int, int], model.PathType] = {}
        for a, b in itertools.combinations(sorted(gpus), 2):
            try:
                level = self._optional(
                    "nvmlDeviceGetTopologyCommonAncestor", read[a].handle, read[b].handle
                )
            except nvmlapi.NVMLError as exc:
                _log.warning(
                    "PCIe path unknown; derived from sysfs",
                    gpus=[a, b],
                    error=nvmlapi.describe(exc),
                )
                level = None
            paths[(a, b)] = (
                _LEVEL_PATHS.get(int(level), model.PathType.SYS)
                if level is not None
                else topology.derive_pcie_path(gpus[a], gpus[b], None, None)
            )
        return paths
