"""The MIG half of the NVML stand-in: MIG mode, profiles, placements, GPU instances.

Why it exists: dynamic MIG must run in tests and the demo through the very code that drives a
real card (:mod:`dra_driver.devices.migcontrol` and discovery), so the stand-in answers the MIG
calls of ``pynvml`` with its real struct types, handle types and errors, from a real GPU's
profile table (:mod:`dra_driver.devices.migtables`) and a state that outlives the process
(:mod:`dra_driver.devices.fake.migstate`). This module has MIG mode, profiles, placements and GPU
instances; :mod:`dra_driver.devices.fake.fakemigdev` builds on it with compute instances, MIG
devices and processes, and is mixed into :class:`~dra_driver.devices.fake.fakenvml.FakeNvml`.

Rules modelled after NVML: profile info and possible placements are answered whether or not MIG
mode is on; instances need MIG mode; a placement outside the profile's possible ones is
``InvalidArgument``; overlapping memory slices, a full profile or no compute slices left is
``InsufficientResources``; a GPU instance with compute instances (or processes) cannot be
destroyed (``InUse``); ``nvmlDeviceSetMigMode`` reports ``NVML_ERROR_IN_USE`` as its activation
status while processes run or instances exist. GPU and compute instance handles are opaque
``c_nvmlGpuInstance_t`` / ``c_nvmlComputeInstance_t`` pointers (never dereferenced), so they fit
the caller-allocated arrays of ``nvmlDeviceGetGpuInstances`` as real ones do.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any, Protocol

from dra_driver import records
from dra_driver.devices import migtables, nvml
from dra_driver.devices.fake import migstate, profiles

_GI_TOKEN, _CI_TOKEN = 0x6100_0000, 0x6200_0000  # handle "addresses": kind | pos | gi | ci


class DeviceHandle(Protocol):
    @property
    def index(self) -> int: ...

    @property
    def pos(self) -> int: ...


@records.record
class MigHandle:
    """A MIG device handle: a compute instance of a GPU instance (``slot``: its MIG index)."""

    parent: DeviceHandle
    slot: int
    gi: int
    ci: int


def target(ref: Any) -> Any:
    """The object behind a ``ctypes.pointer`` (what callers pass for NVML out-parameters)."""
    if isinstance(ref, ctypes._Pointer):
        return ref.contents
    raise nvml.NVMLError_InvalidArgument()


def _token(handle: object, kind: type[Any], base: int) -> int:
    if not isinstance(handle, kind):
        raise nvml.NVMLError_InvalidArgument()
    value = ctypes.cast(handle, ctypes.c_void_p).value or 0
    if value & 0xFF00_0000 != base:
        raise nvml.NVMLError_InvalidArgument()
    return value & 0x00FF_FFFF


class FakeMigFunctions:
    """NVML's MIG functions over :class:`~dra_driver.devices.fake.migstate.MigState`."""

    profile: profiles.Profile
    mig_state: migstate.MigState
    _mig_tables: list[tuple[migtables.TableProfile, ...] | None]
    _mig_derived: list[bool]

    if TYPE_CHECKING:  # provided by FakeNvml; declared here for the type checker only

        def _device(self, name: str, handle: object) -> Any: ...

        def _enter(self, name: str, handle: object = None) -> None: ...

    def _init_mig(self) -> None:
        """Profile tables and the initial MIG state of every GPU of the profile."""
        start = migstate.initial(self.profile)
        self._mig_tables, self._mig_derived = start.tables, start.derived
        self.mig_state = migstate.MigState(start.gpus)

    # ---- helpers -------------------------------------------------------------------------------

    def _capable(self, name: str, handle: object) -> tuple[Any, tuple[migtables.TableProfile, ...]]:
        dev = self._device(name, handle)
        table = self._mig_tables[dev.pos]
        if table is None:
            raise nvml.NVMLError_NotSupported()
        return dev, table

    def _gpu_uuid(self, dev: Any) -> str:
        return self.profile.gpu_uuid(dev.pos)

    def _row(self, dev: Any, profile_id: int) -> migtables.TableProfile:
        pos: int = dev.pos
        for row in self._mig_tables[pos] or ():
            if row.id == profile_id:
                return row
        raise nvml.NVMLError_InvalidArgument()

    def _gi_handle(self, pos: int, gi: int) -> Any:
        address = _GI_TOKEN | pos << 16 | gi << 8
        return ctypes.cast(ctypes.c_void_p(address), nvml.c_nvmlGpuInstance_t)

    def _ci_handle(self, pos: int, gi: int, ci: int) -> Any:
        address = _CI_TOKEN | pos << 16 | gi << 8 | ci
        return ctypes.cast(ctypes.c_void_p(address), nvml.c_nvmlComputeInstance_t)

    def _gi_of(self, name: str, handle: object) -> tuple[int, int]:
        """(GPU position, GPU instance id) of a GPU instance handle."""
        token = _token(handle, nvml.c_nvmlGpuInstance_t, _GI_TOKEN)
        pos, gi = token >> 16, token >> 8 & 0xFF
        if not 0 <= pos < len(self.profile.gpus):
            raise nvml.NVMLError_InvalidArgument()
        self._enter(name, self.profile.gpu_index(pos))
        return pos, gi

    def _ci_of(self, name: str, handle: object) -> tuple[int, int, int]:
        token = _token(handle, nvml.c_nvmlComputeInstance_t, _CI_TOKEN)
        pos, gi, ci = token >> 16, token >> 8 & 0xFF, token & 0xFF
        if not 0 <= pos < len(self.profile.gpus):
            raise nvml.NVMLError_InvalidArgument()
        self._enter(name, self.profile.gpu_index(pos))
        return pos, gi, ci

    def _state_of(self, state: dict[str, migstate.GpuMig], pos: int) -> migstate.GpuMig:
        return state[self.profile.gpu_uuid(pos)]

    @staticmethod
    def _find_gi(gpu: migstate.GpuMig, gi: int) -> migstate.GpuInstance:
        for inst in gpu.instances:
            if inst.id == gi:
                return inst
        raise nvml.NVMLError_InvalidArgument()  # a handle of a destroyed instance

    def _mig_devices(self, gpu: migstate.GpuMig) -> list[tuple[int, int]]:
        """(GPU instance id, compute instance id) of every MIG device, in MIG index order."""
        return [
            (inst.id, ci.id)
            for inst in sorted(gpu.instances, key=lambda i: (i.start, i.id))
            for ci in sorted(inst.computeInstances, key=lambda c: c.id)
        ]

    # ---- MIG mode and processes ----------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, handle: object) -> list[int]:
        dev, _ = self._capable("nvmlDeviceGetMigMode", handle)
        gpu = self._state_of(self.mig_state.read(), dev.pos)
        return [gpu.mode, gpu.pending]

    def nvmlDeviceSetMigMode(self, handle: object, mode: int) -> int:
        dev, _ = self._capable("nvmlDeviceSetMigMode", handle)
        if mode not in (nvml.NVML_DEVICE_MIG_DISABLE, nvml.NVML_DEVICE_MIG_ENABLE):
            raise nvml.NVMLError_InvalidArgument()
        with self.mig_state.edit() as state:
            gpu = self._state_of(state, dev.pos)
            gpu.pending = mode
            if gpu.mode == mode:
                return int(nvml.NVML_SUCCESS)
            if gpu.processes or gpu.instances:  # the reset needs an idle GPU
                return int(nvml.NVML_ERROR_IN_USE)
            gpu.mode = mode
            return int(nvml.NVML_SUCCESS)

    # ---- profiles and placements ---------------------------------------------------------------

    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, handle: object, profile: int, version: int = 2
    ) -> Any:
        _, table = self._capable("nvmlDeviceGetGpuInstanceProfileInfo", handle)
        for row in table:
            if row.slot == profile:
                info = (
                    nvml.c_nvmlGpuInstanceProfileInfo_v2_t()
                    if version == 2
                    else nvml.c_nvmlGpuInstanceProfileInfo_t()
                )
                info.id, info.sliceCount, info.instanceCount = row.id, row.slices, row.instances
                info.multiprocessorCount = row.multiprocessors
                info.copyEngineCount, info.decoderCount = row.copy_engines, row.decoders
                info.encoderCount, info.jpegCount = row.encoders, row.jpeg_engines
                info.ofaCount, info.memorySizeMB = row.ofa_engines, row.memory_mib
                if version == 2:
                    info.name = f"MIG {row.name}".encode()
                return info
        raise nvml.NVMLError_NotSupported()

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, handle: object, profile_id: int, placements: Any, count: Any
    ) -> int:
        dev, _ = self._capable("nvmlDeviceGetGpuInstancePossiblePlacements", handle)
        if self._mig_derived[dev.pos]:
            raise nvml.NVMLError_NotSupported()  # a made-up table knows no placements
        row = self._row(dev, profile_id)
        out = target(count)
        if placements is not None:
            if len(placements) < len(row.starts):
                raise nvml.NVMLError_InsufficientSize()
            for i, (start, size) in enumerate(row.placements):
                placements[i].start, placements[i].size = start, size
        out.value = len(row.starts)
        return int(nvml.NVML_SUCCESS)

    # ---- GPU instances -------------------------------------------------------------------------

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, handle: object, profile_id: int, placement: Any
    ) -> Any:
        dev, table = self._capable("nvmlDeviceCreateGpuInstanceWithPlacement", handle)
        row = self._row(dev, profile_id)
        wanted = target(placement)
        start, size = int(wanted.start), int(wanted.size)
        if (start, size) not in row.placements:
            raise nvml.NVMLError_InvalidArgument()
        total_slices = max(r.slices for r in table)
        with self.mig_state.edit() as state:
            gpu = self._state_of(state, dev.pos)
            if gpu.mode != nvml.NVML_DEVICE_MIG_ENABLE:
                raise nvml.NVMLError_NotSupported()
            used = {s for i in gpu.instances for s in range(i.start, i.start + i.size)}
            same = sum(1 for i in gpu.instances if i.profileId == profile_id)
            slices = sum(self._row(dev, i.profileId).slices for i in gpu.instances)
            if (
                used & set(range(start, start + size))
                or same >= row.instances
                or slices + row.slices > total_slices
            ):
                raise nvml.NVMLError_InsufficientResources()
            gi = min(set(range(1, 64)) - {i.id for i in gpu.instances})
            gpu.instances.append(
                migstate.GpuInstance(
                    id=gi, profileId=row.id, slot=row.slot, name=row.name, start=start, size=size
                )
            )
        return self._gi_handle(dev.pos, gi)

    def nvmlDeviceGetGpuInstances(
        self, handle: object, profile_id: int, instances: Any, count: Any
    ) -> int:
        dev, _ = self._capable("nvmlDeviceGetGpuInstances", handle)
        row = self._row(dev, profile_id)
        gpu = self._state_of(self.mig_state.read(), dev.pos)
        if gpu.mode != nvml.NVML_DEVICE_MIG_ENABLE:
            raise nvml.NVMLError_NotSupported()
        found = sorted(i.id for i in gpu.instances if i.profileId == row.id)
        if len(instances) < len(found):
            raise nvml.NVMLError_InsufficientSize()
        for i, gi in enumerate(found):
            instances[i] = self._gi_handle(dev.pos, gi)
        target(count).value = len(found)
        return int(nvml.NVML_SUCCESS)

    def nvmlDeviceGetGpuInstanceById(self, handle: object, gi_id: int) -> Any:
        dev, _ = self._capable("nvmlDeviceGetGpuInstanceById", handle)
        gpu = self._state_of(self.mig_state.read(), dev.pos)
        if not any(i.id == gi_id for i in gpu.instances):
            raise nvml.NVMLError_NotFound()
        return self._gi_handle(dev.pos, gi_id)

    def nvmlGpuInstanceGetInfo(self, gpu_instance: object) -> Any:
        pos, gi = self._gi_of("nvmlGpuInstanceGetInfo", gpu_instance)
        inst = self._find_gi(self._state_of(self.mig_state.read(), pos), gi)
        placement = nvml.c_nvmlGpuInstancePlacement_t(start=inst.start, size=inst.size)
        return nvml.c_nvmlGpuInstanceInfo_t(id=gi, profileId=inst.profileId, placement=placement)

    def nvmlGpuInstanceDestroy(self, gpu_instance: object) -> int:
        pos, gi = self._gi_of("nvmlGpuInstanceDestroy", gpu_instance)
        with self.mig_state.edit() as state:
            gpu = self._state_of(state, pos)
            inst = self._find_gi(gpu, gi)
            if inst.computeInstances or any(p.gpuInstanceId == gi for p in gpu.processes):
                raise nvml.NVMLError_InUse()
            gpu.instances.remove(inst)
        return int(nvml.NVML_SUCCESS)
