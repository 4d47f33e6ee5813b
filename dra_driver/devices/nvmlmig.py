"""MIG discovery through NVML: a GPU's instance profiles with their placements, its MIG devices.

Why it exists: dynamic MIG publishes a device per possible placement of every profile, read from
NVML on the node (``nvmlDeviceGetGpuInstanceProfileInfo`` per NVML_GPU_INSTANCE_PROFILE_* slot,
``nvmlDeviceGetGpuInstancePossiblePlacements_v2`` per profile — both answer whether or not MIG
mode is on), and static MIG publishes the MIG devices that exist. Split from
:mod:`dra_driver.devices.nvml` (whose backend calls in here, passing its rules for absent facts:
``optional`` answers None where the GPU or binding cannot, ``required`` raises) to keep each
module small. It stands below the backend: it reaches pynvml only through
:mod:`dra_driver.devices.nvmlapi` and never imports :mod:`dra_driver.devices.nvml`.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Mapping
from typing import Any

from dra_driver import logs
from dra_driver.devices import model, nvmlapi

_log = logs.get(__name__)
Call = Callable[..., Any]


def read_profiles(optional: Call, handle: Any) -> tuple[model.MigProfile, ...]:
    """Every GPU instance profile NVML lists for the GPU, in slot order, with placements."""
    found: list[model.MigProfile] = []
    for slot in range(nvmlapi.NVML_GPU_INSTANCE_PROFILE_COUNT):
        info = optional("nvmlDeviceGetGpuInstanceProfileInfo", handle, slot)
        name = str(getattr(info, "name", "") or "").removeprefix("MIG ").strip()
        if info is None or not name:
            continue
        found.append(
            model.MigProfile(
                id=int(info.id),
                slot=slot,
                name=name,
                slices=int(info.sliceCount),
                instances=int(info.instanceCount),
                memory_bytes=int(info.memorySizeMB) << 20,
                multiprocessors=int(info.multiprocessorCount),
                copy_engines=int(info.copyEngineCount),
                decoders=int(info.decoderCount),
                encoders=int(info.encoderCount),
                jpeg_engines=int(info.jpegCount),
                ofa_engines=int(info.ofaCount),
                placements=_placements(optional, handle, int(info.id)),
            )
        )
    return tuple(found)


def _placements(optional: Call, handle: Any, profile_id: int) -> tuple[tuple[int, int], ...]:
    """Possible placements of one profile (asked for the count first, as NVML wants)."""
    count = ctypes.c_uint(0)
    name = "nvmlDeviceGetGpuInstancePossiblePlacements"
    if optional(name, handle, profile_id, None, ctypes.pointer(count)) is None:
        return ()
    array = (nvmlapi.c_nvmlGpuInstancePlacement_t * max(1, count.value))()
    if optional(name, handle, profile_id, array, ctypes.pointer(count)) is None:
        return ()
    return tuple(sorted((int(p.start), int(p.size)) for p in array[: count.value]))


def read_devices(
    required: Call,
    optional: Call,
    *,
    index: int,
    handle: Any,
    total: int,
    profiles: tuple[model.MigProfile, ...],
) -> tuple[model.MigDevice, ...]:
    """The MIG devices that exist on a GPU in MIG mode; one that fails to read is skipped."""
    slots = int(optional("nvmlDeviceGetMaxMigDeviceCount", handle) or 0)
    names = {p.id: p.name for p in profiles}
    found: list[model.MigDevice] = []
    for slot in range(slots):
        mig = optional("nvmlDeviceGetMigDeviceHandleByIndex", handle, slot)
        if mig is None:
            continue  # no MIG device at this index
        try:
            found.append(_read_device(required, index, handle, mig, names, total))
        except (nvmlapi.NVMLError, nvmlapi.Absent) as exc:
            _log.warning(
                "MIG device skipped", index=index, mig_index=slot, error=nvmlapi.describe(exc)
            )
    return tuple(
        sorted(found, key=lambda m: (m.placement_start, m.gpu_instance_id, m.compute_instance_id))
    )


def _read_device(
    required: Call, index: int, parent: Any, mig: Any, names: Mapping[int, str], total: int
) -> model.MigDevice:
    attrs = required("nvmlDeviceGetAttributes", mig)
    gi_id = int(required("nvmlDeviceGetGpuInstanceId", mig))
    ci_id = int(required("nvmlDeviceGetComputeInstanceId", mig))
    gi = required("nvmlDeviceGetGpuInstanceById", parent, gi_id)
    info = required("nvmlGpuInstanceGetInfo", gi)
    profile = names.get(int(info.profileId)) or nvmlapi.mig_profile_name(
        int(attrs.gpuInstanceSliceCount), int(attrs.memorySizeMB), total
    )
    return model.MigDevice(
        uuid=str(required("nvmlDeviceGetUUID", mig)),
        parent_index=index,
        profile=profile,
        gpu_instance_id=gi_id,
        compute_instance_id=ci_id,
        placement_start=int(info.placement.start),
        placement_size=int(info.placement.size),
        memory_bytes=int(attrs.memorySizeMB) << 20,
        multiprocessors=int(attrs.multiprocessorCount),
        copy_engines=int(attrs.sharedCopyEngineCount),
        decoders=int(attrs.sharedDecoderCount),
        encoders=int(attrs.sharedEncoderCount),
        jpeg_engines=int(attrs.sharedJpegCount),
        ofa_engines=int(attrs.sharedOfaCount),
    )
