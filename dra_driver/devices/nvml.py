"""GPU discovery through NVML (nvidia-ml-py): the only module that imports ``pynvml``.

NVML's quirks live here and nowhere else: calls a GPU does not support degrade to "absent", a
GPU that fails while being read is skipped with a warning, and only a missing library or driver
stops discovery (one operator-facing :class:`~dra_driver.devices.backend.DiscoveryError`).
The NVML module is *injected*: :class:`PynvmlBackend` takes any object offering pynvml's
functions, so the fake backend runs this very code over :mod:`dra_driver.devices.fake.fakenvml`
(one code path for real and fake hardware). Constants, struct types and the real exception
classes are re-exported below so that stand-in never imports pynvml itself.
"""

from __future__ import annotations

import ctypes
import dataclasses
import itertools
import math
import uuid as uuidlib
from collections.abc import Mapping, Sequence
from typing import Any, Final

import pynvml

from dra_driver import logs
from dra_driver.devices import backend, model, nvmlmig, topology
from dra_driver.devices import sysfs as sysfs_mod

_log = logs.get(__name__)

# pynvml itself, or a stand-in offering the same functions with the same return shapes.
NvmlApi = Any

# --- Facts of the NVML API, shared with the stand-in (real classes, real values) -------------
NVMLError = pynvml.NVMLError
NVMLError_Uninitialized = pynvml.NVMLError_Uninitialized
NVMLError_InvalidArgument = pynvml.NVMLError_InvalidArgument
NVMLError_NotSupported = pynvml.NVMLError_NotSupported
NVMLError_NoPermission = pynvml.NVMLError_NoPermission
NVMLError_NotFound = pynvml.NVMLError_NotFound
NVMLError_DriverNotLoaded = pynvml.NVMLError_DriverNotLoaded
NVMLError_LibraryNotFound = pynvml.NVMLError_LibraryNotFound
NVMLError_FunctionNotFound = pynvml.NVMLError_FunctionNotFound
NVMLError_GpuIsLost = pynvml.NVMLError_GpuIsLost
NVMLError_LibRmVersionMismatch = pynvml.NVMLError_LibRmVersionMismatch
NVMLError_Unknown = pynvml.NVMLError_Unknown
NVMLError_InUse = pynvml.NVMLError_InUse
NVMLError_InsufficientResources = pynvml.NVMLError_InsufficientResources
NVMLError_InsufficientSize = pynvml.NVMLError_InsufficientSize
nvmlFriendlyObject = pynvml.nvmlFriendlyObject
NVMLError_Timeout = pynvml.NVMLError_Timeout

c_nvmlMemory_t = pynvml.c_nvmlMemory_t
c_nvmlUtilization_t = pynvml.c_nvmlUtilization_t
nvmlPciInfo_t = pynvml.nvmlPciInfo_t
c_nvmlDeviceAttributes = pynvml.c_nvmlDeviceAttributes
c_nvmlGpuInstanceInfo_t = pynvml.c_nvmlGpuInstanceInfo_t
c_nvmlGpuInstancePlacement_t = pynvml.c_nvmlGpuInstancePlacement_t
c_nvmlGpuInstanceProfileInfo_v2_t = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t
c_nvmlGpuInstanceProfileInfo_t = pynvml.c_nvmlGpuInstanceProfileInfo_t
c_nvmlGpuInstance_t = pynvml.c_nvmlGpuInstance_t
c_nvmlComputeInstance_t = pynvml.c_nvmlComputeInstance_t
c_nvmlComputeInstanceInfo_t = pynvml.c_nvmlComputeInstanceInfo_t
c_nvmlComputeInstancePlacement_t = pynvml.c_nvmlComputeInstancePlacement_t
c_nvmlComputeInstanceProfileInfo_t = pynvml.c_nvmlComputeInstanceProfileInfo_t
c_nvmlComputeInstanceProfileInfo_v2_t = pynvml.c_nvmlComputeInstanceProfileInfo_v2_t
# Fabric structs appeared over time; older bindings lack the versioned one.
c_nvmlGpuFabricInfo_t = getattr(pynvml, "c_nvmlGpuFabricInfo_t", None)
c_nvmlGpuFabricInfoV_t = getattr(pynvml, "c_nvmlGpuFabricInfoV_t", None)
# Health watching (devices/watcher.py): event structs, handles, field values.
c_nvmlDevice_t = pynvml.c_nvmlDevice_t
c_nvmlEventSet_t = pynvml.c_nvmlEventSet_t
c_nvmlEventData_t = pynvml.c_nvmlEventData_t
c_nvmlFieldValue_t = pynvml.c_nvmlFieldValue_t

NVML_SUCCESS: Final[int] = pynvml.NVML_SUCCESS
NVML_TEMPERATURE_GPU: Final[int] = pynvml.NVML_TEMPERATURE_GPU
NVML_FEATURE_DISABLED: Final[int] = pynvml.NVML_FEATURE_DISABLED
NVML_FEATURE_ENABLED: Final[int] = pynvml.NVML_FEATURE_ENABLED
NVML_DEVICE_MIG_DISABLE: Final[int] = pynvml.NVML_DEVICE_MIG_DISABLE
NVML_DEVICE_MIG_ENABLE: Final[int] = pynvml.NVML_DEVICE_MIG_ENABLE
NVML_NVLINK_MAX_LINKS: Final[int] = pynvml.NVML_NVLINK_MAX_LINKS
NVML_NVLINK_DEVICE_TYPE_GPU: Final[int] = pynvml.NVML_NVLINK_DEVICE_TYPE_GPU
NVML_NVLINK_DEVICE_TYPE_SWITCH: Final[int] = pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
NVML_TOPOLOGY_INTERNAL: Final[int] = pynvml.NVML_TOPOLOGY_INTERNAL
NVML_TOPOLOGY_SINGLE: Final[int] = pynvml.NVML_TOPOLOGY_SINGLE
NVML_TOPOLOGY_MULTIPLE: Final[int] = pynvml.NVML_TOPOLOGY_MULTIPLE
NVML_TOPOLOGY_HOSTBRIDGE: Final[int] = pynvml.NVML_TOPOLOGY_HOSTBRIDGE
NVML_TOPOLOGY_NODE: Final[int] = pynvml.NVML_TOPOLOGY_NODE
NVML_TOPOLOGY_SYSTEM: Final[int] = pynvml.NVML_TOPOLOGY_SYSTEM
NVML_GPU_FABRIC_STATE_NOT_SUPPORTED: Final[int] = pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
NVML_GPU_FABRIC_STATE_NOT_STARTED: Final[int] = pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED
NVML_GPU_FABRIC_STATE_IN_PROGRESS: Final[int] = pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS
NVML_GPU_FABRIC_STATE_COMPLETED: Final[int] = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
NVML_GPU_INSTANCE_PROFILE_COUNT: Final[int] = pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT
NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED: Final[int] = (
    pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
)
NVML_ERROR_IN_USE: Final[int] = pynvml.NVML_ERROR_IN_USE
# NVML_COMPUTE_INSTANCE_PROFILE_* of the compute instance spanning a whole GPU instance.
CI_PROFILE_BY_SLICES: Final[Mapping[int, int]] = {
    slices: getattr(pynvml, f"NVML_COMPUTE_INSTANCE_PROFILE_{slices}_SLICE")
    for slices in (1, 2, 3, 4, 6, 7, 8)
}
NVML_COMPUTEMODE_DEFAULT: Final[int] = pynvml.NVML_COMPUTEMODE_DEFAULT
NVML_COMPUTEMODE_PROHIBITED: Final[int] = pynvml.NVML_COMPUTEMODE_PROHIBITED
NVML_COMPUTEMODE_EXCLUSIVE_PROCESS: Final[int] = pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
EVENT_XID: Final[int] = pynvml.nvmlEventTypeXidCriticalError
EVENT_DBE: Final[int] = pynvml.nvmlEventTypeDoubleBitEccError
EVENT_SBE: Final[int] = pynvml.nvmlEventTypeSingleBitEccError
EVENT_RECOVERY_ACTION: Final[int] = getattr(pynvml, "nvmlEventTypeGpuRecoveryAction", 0)
INSTANCE_ID_ANY: Final[int] = 0xFFFFFFFF  # NVML_GPU_INSTANCE_ID_ANY / _COMPUTE_INSTANCE_ID_ANY
FI_RECOVERY_ACTION: Final[int] = getattr(pynvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", 230)
NVML_VALUE_TYPE_UNSIGNED_INT: Final[int] = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
# NVML_GPU_RECOVERY_ACTION_* (pinned by a test against pynvml) → the name we log and taint with.
RECOVERY_ACTIONS: Final[Mapping[int, str]] = {
    0: "none", 1: "gpu-reset", 2: "node-reboot", 3: "drain-p2p", 4: "drain-and-reset",
    5: "recover-imex-domain", 6: "bus-reset", 7: "system-reboot",
}  # fmt: skip
# Fabric health: the "route unhealthy" field of c_nvmlGpuFabricInfoV_t.healthMask.
FABRIC_ROUTE_UNHEALTHY_SHIFT: Final[int] = pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY
FABRIC_ROUTE_UNHEALTHY_TRUE: Final[int] = pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_TRUE

# fmt: off
# NVML_BRAND_* values (pinned by a test against pynvml) → names as the device model reports them.
BRAND_NAMES: Final[Mapping[int, str]] = {
    0: "Unknown", 1: "Quadro", 2: "Tesla", 3: "NVS", 4: "Grid", 5: "GeForce", 6: "Titan",
    7: "NvidiaVApps", 8: "NvidiaVPC", 9: "NvidiaVCS", 10: "NvidiaVWS", 11: "NvidiaCloudGaming",
    12: "QuadroRTX", 13: "NvidiaRTX", 14: "Nvidia", 15: "GeForceRTX", 16: "TitanRTX",
}
# NVML_DEVICE_ARCH_* values → architecture names (nvidia-smi's spelling).
ARCH_NAMES: Final[Mapping[int, str]] = {
    2: "Kepler", 3: "Maxwell", 4: "Pascal", 5: "Volta", 6: "Turing", 7: "Ampere",
    8: "Ada Lovelace", 9: "Hopper", 10: "Blackwell", 13: "Rubin",
}
# fmt: on
FABRIC_STATES: Final[Mapping[int, str]] = {
    NVML_GPU_FABRIC_STATE_NOT_SUPPORTED: "not-supported",
    NVML_GPU_FABRIC_STATE_NOT_STARTED: "not-started",
    NVML_GPU_FABRIC_STATE_IN_PROGRESS: "in-progress",
    NVML_GPU_FABRIC_STATE_COMPLETED: "completed",
}
_LEVEL_PATHS: Final[Mapping[int, model.PathType]] = {
    NVML_TOPOLOGY_INTERNAL: model.PathType.PIX,  # two GPUs on one board
    NVML_TOPOLOGY_SINGLE: model.PathType.PIX,
    NVML_TOPOLOGY_MULTIPLE: model.PathType.PXB,
    NVML_TOPOLOGY_HOSTBRIDGE: model.PathType.PHB,
    NVML_TOPOLOGY_NODE: model.PathType.NODE,
    NVML_TOPOLOGY_SYSTEM: model.PathType.SYS,
}
# Errors meaning "this GPU / driver / binding cannot answer this question": the fact is absent.
UNSUPPORTED: Final[tuple[type[Exception], ...]] = tuple(
    getattr(pynvml, name)
    for name in (
        "NVMLError_NotSupported",
        "NVMLError_FunctionNotFound",
        "NVMLError_InvalidArgument",
        "NVMLError_NotFound",
        "NVMLError_NoPermission",
        "NVMLError_NotReady",
        "NVMLError_ArgumentVersionMismatch",
        "NVMLError_Deprecated",
    )
    if hasattr(pynvml, name)
)
_HINT = "the NVIDIA driver must be installed on this node; use --fake PROFILE to run without GPUs"


class Absent(Exception):
    """A fact a GPU cannot be modelled without is not available (the GPU is skipped)."""


@dataclasses.dataclass(slots=True)
class _Read:
    handle: Any
    gpu: model.Gpu
    direct: dict[int, int] = dataclasses.field(default_factory=dict)  # peer index → links
    switch_links: int = 0


def sysfs_bus_id(bus_id: str) -> str:
    """NVML's ``00000000:17:00.0`` (or sysfs' ``0000:17:00.0``) → the sysfs form, lower case."""
    domain, rest = bus_id.strip().lower().split(":", 1)
    return f"{int(domain, 16):04x}:{rest}"


def cuda_version(value: int) -> str:
    """NVML's CUDA driver version integer (12080) → ``"12.8"``."""
    return f"{value // 1000}.{value % 1000 // 10}"


def mig_profile_name(slices: int, memory_mib: int, total_bytes: int) -> str:
    """``<slices>g.<GB>gb`` when NVML gives no profile name: memory as eighths of the GPU."""
    if total_bytes <= 0:
        return f"{slices}g.{round(memory_mib / 1024)}gb"
    eighths = math.ceil(memory_mib * (1 << 20) * 8 / total_bytes - 1e-9)
    return f"{slices}g.{round(eighths / 8 * total_bytes / (1 << 30))}gb"


def real_module() -> NvmlApi:
    """The real pynvml module, for code that calls NVML but may not import it (GPU control)."""
    return pynvml


def optional(api: NvmlApi, name: str, *args: Any) -> Any:
    """``api.<name>(*args)``, or None when this GPU, driver or binding cannot answer it (other
    errors, GpuIsLost included, propagate)."""
    fn = getattr(api, name, None)
    if fn is None:
        return None
    try:
        return fn(*args)
    except UNSUPPORTED:
        return None


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class NvmlSampler:
    """One NVML pass over the given GPUs: utilization, memory, power, temperature
    (:class:`~dra_driver.devices.backend.GpuSampler`). A value NVML cannot give for a GPU
    (NotSupported, NoPermission, a lost GPU, any NVMLError) is left None and its name listed in
    the sample's ``errors``; a GPU whose handle cannot be found has every value None. Handles
    are looked up once per UUID and kept. Not thread-safe: one sampling thread calls it."""

    def __init__(self, api: NvmlApi) -> None:
        self._nvml = api
        self._handles: dict[str, Any] = {}

    def sample(self, uuids: Sequence[str]) -> dict[str, backend.GpuSample]:
        return {uuid: self._one(uuid) for uuid in uuids}

    def _one(self, uuid: str) -> backend.GpuSample:
        api = self._nvml
        handle = self._handles.get(uuid)
        if handle is None:
            try:
                handle = api.nvmlDeviceGetHandleByUUID(uuid)
            except NVMLError:
                return backend.GpuSample(uuid=uuid, errors=backend.SAMPLE_VALUES)
            self._handles[uuid] = handle
        errors: list[str] = []
        gpu_util = mem_util = used = total = power = temperature = None
        try:
            rates = api.nvmlDeviceGetUtilizationRates(handle)
            gpu_util, mem_util = float(rates.gpu), float(rates.memory)
        except NVMLError:
            errors.append("utilization")
        try:
            mem = api.nvmlDeviceGetMemoryInfo(handle)
            used, total = int(mem.used), int(mem.total)
        except NVMLError:
            errors.append("memory")
        try:
            power = int(api.nvmlDeviceGetPowerUsage(handle)) / 1000.0  # milliwatts
        except NVMLError:
            errors.append("power")
        try:
            temperature = float(api.nvmlDeviceGetTemperature(handle, NVML_TEMPERATURE_GPU))
        except NVMLError:
            errors.append("temperature")
        if errors and len(errors) == len(backend.SAMPLE_VALUES):
            self._handles.pop(uuid, None)  # look it up again next time (a GPU reset, ...)
        return backend.GpuSample(
            uuid=uuid,
            gpu_util_percent=gpu_util,
            memory_util_percent=mem_util,
            memory_used_bytes=used,
            memory_total_bytes=total,
            power_watts=power,
            temperature_celsius=temperature,
            errors=tuple(errors),
        )


class PynvmlBackend:
    """Discovery over an (injected) NVML module; see the module docstring for the rules."""

    def __init__(self, *, nvml: NvmlApi, sysfs: sysfs_mod.Sysfs) -> None:
        self._nvml = nvml
        self._sysfs = sysfs

    @classmethod
    def create(
        cls, *, nvml: NvmlApi | None = None, sysfs: sysfs_mod.Sysfs | None = None
    ) -> PynvmlBackend:
        """Initialise NVML (the real pynvml unless given) or raise one clear DiscoveryError."""
        api = pynvml if nvml is None else nvml
        try:
            api.nvmlInit()
        except NVMLError_LibraryNotFound as exc:
            raise backend.DiscoveryError(
                f"NVML library libnvidia-ml.so.1 not found: {_HINT}"
            ) from exc
        except NVMLError_DriverNotLoaded as exc:
            raise backend.DiscoveryError(
                f"NVIDIA kernel driver is not loaded (NVML: {exc}): {_HINT}"
            ) from exc
        except NVMLError_LibRmVersionMismatch as exc:
            raise backend.DiscoveryError(
                "NVML library and NVIDIA kernel driver versions differ (reload the driver or "
                f"reboot the node): {_HINT}"
            ) from exc
        except NVMLError as exc:
            raise backend.DiscoveryError(f"NVML initialisation failed ({exc}): {_HINT}") from exc
        return cls(nvml=api, sysfs=sysfs or sysfs_mod.HostSysfs())

    @property
    def nvml_api(self) -> NvmlApi:
        """The NVML module this backend calls (the health watcher calls the same one)."""
        return self._nvml

    def sampler(self) -> NvmlSampler:
        """Samples utilization, memory, power and temperature through this backend's NVML."""
        return NvmlSampler(self._nvml)

    def close(self) -> None:
        """Release NVML (pairs with the ``nvmlInit`` of :meth:`create`)."""
        try:
            self._nvml.nvmlShutdown()
        except NVMLError as exc:
            _log.debug("nvmlShutdown failed", error=describe(exc))

    def discover(self) -> model.NodeDevices:
        try:
            count = int(self._nvml.nvmlDeviceGetCount())
        except NVMLError as exc:
            raise backend.DiscoveryError(f"NVML cannot count the GPUs: {describe(exc)}") from exc
        driver = self._optional("nvmlSystemGetDriverVersion") or ""
        cuda = self._optional("nvmlSystemGetCudaDriverVersion")
        versions = (str(driver), cuda_version(int(cuda)) if cuda is not None else "")
        read: dict[int, _Read] = {}
        for index in range(count):
            try:
                read[index] = self._read_gpu(index, versions)
            except (NVMLError, Absent) as exc:
                _log.warning("GPU skipped", index=index, error=describe(exc))
        by_bus = {r.gpu.pci_bus_id: i for i, r in read.items()}
        for index, item in list(read.items()):
            try:
                self._read_links(item, by_bus)
            except NVMLError as exc:
                _log.warning("GPU skipped", index=index, error=describe(exc))
                del read[index]
        gpus = self._with_links(read)
        return model.NodeDevices(
            gpus=tuple(gpus[i] for i in sorted(gpus)),
            pcie_paths=self._pcie_paths(read, gpus),
            machine_type=self._sysfs.machine_type(),
        )

    # --- calls --------------------------------------------------------------------------------
    def _optional(self, name: str, *args: Any) -> Any:
        return optional(self._nvml, name, *args)

    def _required(self, name: str, *args: Any) -> Any:
        fn = getattr(self._nvml, name, None)
        if fn is None:
            raise Absent(f"{name} is not available in this NVML binding")
        try:
            return fn(*args)
        except UNSUPPORTED as exc:
            raise Absent(f"{name}: {describe(exc)}") from exc

    # --- one GPU ------------------------------------------------------------------------------
    def _read_gpu(self, index: int, versions: tuple[str, str]) -> _Read:
        handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = str(self._required("nvmlDeviceGetUUID", handle))
        bus_id = sysfs_bus_id(str(self._required("nvmlDeviceGetPciInfo", handle).busId))
        memory = int(self._required("nvmlDeviceGetMemoryInfo", handle).total)
        minor = self._optional("nvmlDeviceGetMinorNumber", handle)
        if minor is None:
            _log.warning("GPU has no minor number; using its index", index=index)
            minor = index
        cc = self._optional("nvmlDeviceGetCudaComputeCapability", handle)
        mig_mode = self._optional("nvmlDeviceGetMigMode", handle)
        mig_enabled = mig_mode is not None and mig_mode[0] == NVML_DEVICE_MIG_ENABLE
        mig_profiles = nvmlmig.read_profiles(self._optional, handle) if mig_mode is not None else ()
        gpu = model.Gpu(
            index=index,
            minor=int(minor),
            uuid=uuid,
            product_name=str(self._optional("nvmlDeviceGetName", handle) or "Unknown"),
            brand=BRAND_NAMES.get(self._optional("nvmlDeviceGetBrand", handle), "Unknown"),
            architecture=ARCH_NAMES.get(
                self._optional("nvmlDeviceGetArchitecture", handle), "Unknown"
            ),
            cuda_compute_capability=f"{cc[0]}.{cc[1]}" if cc is not None else "",
            driver_version=versions[0],
            cuda_driver_version=versions[1],
            memory_bytes=memory,
            pci_bus_id=bus_id,
            pcie_root=self._sysfs.pcie_root(bus_id),
            numa_node=self._numa(handle, bus_id),
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
            ("nvmlDeviceGetGpuFabricInfoV", c_nvmlGpuFabricInfoV_t),
            ("nvmlDeviceGetGpuFabricInfo", c_nvmlGpuFabricInfo_t),
        ):
            candidate = struct() if struct is not None else None
            if (
                candidate is not None
                and self._optional(name, handle, ctypes.pointer(candidate)) is not None
            ):
                info = candidate
                break
        if info is None or info.state == NVML_GPU_FABRIC_STATE_NOT_SUPPORTED:
            return None
        return model.FabricInfo(
            cluster_uuid=str(uuidlib.UUID(bytes=bytes(info.clusterUuid))),
            clique_id=int(info.cliqueId),
            state=FABRIC_STATES.get(int(info.state), "unknown"),
        )

    # --- NVLink and PCIe ----------------------------------------------------------------------
    def _read_links(self, item: _Read, by_bus: Mapping[str, int]) -> None:
        """Count active links per peer GPU and into NVSwitches; unsupported links are absent."""
        if getattr(self._nvml, "nvmlDeviceGetNvLinkState", None) is None:
            return
        for link in range(NVML_NVLINK_MAX_LINKS):
            if self._optional("nvmlDeviceGetNvLinkState", item.handle, link) != (
                NVML_FEATURE_ENABLED
            ):
                continue
            kind = self._optional("nvmlDeviceGetNvLinkRemoteDeviceType", item.handle, link)
            if kind == NVML_NVLINK_DEVICE_TYPE_SWITCH:
                item.switch_links += 1
                continue
            if kind not in (None, NVML_NVLINK_DEVICE_TYPE_GPU):
                continue  # e.g. a CPU (IBM NPU) at the other end
            remote = self._optional("nvmlDeviceGetNvLinkRemotePciInfo", item.handle, link)
            peer = by_bus.get(sysfs_bus_id(str(remote.busId))) if remote is not None else None
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
            except NVMLError as exc:
                _log.warning(
                    "PCIe path unknown; derived from sysfs", gpus=[a, b], error=describe(exc)
                )
                level = None
            paths[(a, b)] = (
                _LEVEL_PATHS.get(int(level), model.PathType.SYS)
                if level is not None
                else topology.derive_pcie_path(gpus[a], gpus[b], None, None)
            )
        return paths
