"""The facts of NVML that the rest of the package names: pynvml's exception classes, structs and
constants, the rules for absent facts, and where the NVML library is loaded from.

Why it exists: it is the only module that imports ``pynvml``. Everything else — the discovery
backend (:mod:`dra_driver.devices.nvml`), its MIG reader (:mod:`dra_driver.devices.nvmlmig`),
the health watcher, GPU and MIG control, and the fake NVML of :mod:`dra_driver.devices.fake`
(which must raise the real exception classes and return the real structs without importing
pynvml) — takes these names from here, so the binding's quirks stay in one place and the
backend and its MIG reader share them without importing each other.
:mod:`dra_driver.devices.nvml` re-exports every public name, so ``nvml.NVMLError`` keeps working.

Where the library comes from: pynvml itself always asks the dynamic loader for
``libnvidia-ml.so.1``. :func:`load_library` is the seam to name another file first — the
environment variable ``DRA_DRIVER_NVML_LIBRARY`` (:data:`LIBRARY_ENV`) read by
:meth:`~dra_driver.devices.nvml.PynvmlBackend.create` — for a driver installed outside the
loader's path, and for tests that make a node without a driver on any machine by naming a
library that does not exist.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Mapping
from typing import Any, Final

import pynvml

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


class Absent(Exception):
    """A fact a GPU cannot be modelled without is not available (the GPU is skipped)."""


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


# --- Where the library comes from ------------------------------------------------------------
LIBRARY_ENV: Final = "DRA_DRIVER_NVML_LIBRARY"
DEFAULT_LIBRARY: Final = "libnvidia-ml.so.1"  # what pynvml asks the dynamic loader for


def load_library(path: str) -> None:
    """Load NVML from ``path`` (a file, or a name for the dynamic loader) before ``nvmlInit``.

    A path that cannot be loaded raises :class:`NVMLError_LibraryNotFound`, as pynvml does when
    the loader finds no ``libnvidia-ml.so.1``, and leaves pynvml as it was. pynvml keeps one
    library per process: when one is loaded already (an earlier ``nvmlInit``) it stays in use.
    """
    try:
        library = ctypes.CDLL(path)
    except OSError as exc:
        raise NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND) from exc
    with pynvml.libLoadLock:
        if pynvml.nvmlLib is None:
            pynvml.nvmlLib = library
