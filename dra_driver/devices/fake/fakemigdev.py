"""The compute-instance and MIG-device half of the NVML stand-in's MIG model, and processes.

Why it exists: split from :mod:`dra_driver.devices.fake.fakemig` (profiles, placements, GPU
instances, MIG mode) to keep modules small. Here: compute instances inside GPU instances
(one spanning the whole GPU instance is what the driver creates; smaller ones share it), the MIG
device handles discovery walks (``nvmlDeviceGetMigDeviceHandleByIndex`` over every compute
instance, in placement order) with their attributes and UUIDs, and the processes a GPU or MIG
device runs (``nvmlDeviceGetComputeRunningProcesses``, returned as pynvml's friendly objects).
Mixed into :class:`~dra_driver.devices.fake.fakenvml.FakeNvml` through :class:`FakeMigDevices`.
"""

from __future__ import annotations

import uuid as uuidlib
from typing import Any

from dra_driver.devices import nvml
from dra_driver.devices.fake import fakemig, migstate

_SLICES_BY_CI_SLOT = {slot: slices for slices, slot in nvml.CI_PROFILE_BY_SLICES.items()}
_NO_INSTANCE = 0xFFFFFFFF  # what NVML reports as GPU/compute instance id outside MIG
MigHandle = fakemig.MigHandle


class FakeMigDevices(fakemig.FakeMigFunctions):
    """Compute instances, MIG device handles and processes over the same MIG state."""

    def _gi_slices(self, pos: int, inst: migstate.GpuInstance) -> int:
        return next(r.slices for r in self._mig_tables[pos] or () if r.id == inst.profileId)

    def _mig(self, name: str, handle: object) -> tuple[MigHandle, migstate.GpuInstance, Any]:
        self._enter(name, handle)
        if not isinstance(handle, MigHandle):
            raise nvml.NVMLError_NotSupported()  # these calls only take MIG device handles
        gpu = self._state_of(self.mig_state.read(), handle.parent.pos)
        inst = self._find_gi(gpu, handle.gi)
        for ci in inst.computeInstances:
            if ci.id == handle.ci:
                return handle, inst, ci
        raise nvml.NVMLError_InvalidArgument()

    def _mig_uuid(self, handle: MigHandle) -> str:
        return str(self._mig("nvmlDeviceGetUUID", handle)[2].uuid)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> list[Any]:
        if isinstance(handle, MigHandle):
            _, inst, ci = self._mig("nvmlDeviceGetComputeRunningProcesses", handle)
            gpu = self._state_of(self.mig_state.read(), handle.parent.pos)
            procs = [
                p
                for p in gpu.processes
                if p.gpuInstanceId == inst.id and p.computeInstanceId == ci.id
            ]
        else:
            dev = self._device("nvmlDeviceGetComputeRunningProcesses", handle)
            uuid = self._gpu_uuid(dev)
            state = self.mig_state.read()
            procs = list(state[uuid].processes) if uuid in state else []
        return [
            nvml.nvmlFriendlyObject(
                {
                    "pid": p.pid,
                    "usedGpuMemory": p.usedGpuMemory,
                    "gpuInstanceId": _NO_INSTANCE if p.gpuInstanceId is None else p.gpuInstanceId,
                    "computeInstanceId": (
                        _NO_INSTANCE if p.computeInstanceId is None else p.computeInstanceId
                    ),
                }
            )
            for p in procs
        ]

    # ---- compute instances ---------------------------------------------------------------------

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, gpu_instance: object, profile: int, eng_profile: int, version: int = 2
    ) -> Any:
        pos, gi = self._gi_of("nvmlGpuInstanceGetComputeInstanceProfileInfo", gpu_instance)
        inst = self._find_gi(self._state_of(self.mig_state.read(), pos), gi)
        row = next(r for r in self._mig_tables[pos] or () if r.id == inst.profileId)
        slices = _SLICES_BY_CI_SLOT.get(profile)
        if eng_profile != nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED:
            raise nvml.NVMLError_InvalidArgument()
        if slices is None or slices > row.slices or row.slices % slices:
            raise nvml.NVMLError_NotSupported()
        info = (
            nvml.c_nvmlComputeInstanceProfileInfo_v2_t()
            if version == 2
            else nvml.c_nvmlComputeInstanceProfileInfo_t()
        )
        info.id, info.sliceCount = profile, slices
        info.instanceCount = row.slices // slices
        info.multiprocessorCount = row.multiprocessors * slices // row.slices
        info.sharedCopyEngineCount, info.sharedDecoderCount = row.copy_engines, row.decoders
        info.sharedEncoderCount, info.sharedJpegCount = row.encoders, row.jpeg_engines
        info.sharedOfaCount = row.ofa_engines
        if version == 2:
            prefix = "" if slices == row.slices else f"{slices}c."
            info.name = f"MIG {prefix}{row.name}".encode()
        return info

    def nvmlGpuInstanceCreateComputeInstance(self, gpu_instance: object, profile_id: int) -> Any:
        pos, gi = self._gi_of("nvmlGpuInstanceCreateComputeInstance", gpu_instance)
        row_slices = _SLICES_BY_CI_SLOT.get(profile_id)
        with self.mig_state.edit() as state:
            inst = self._find_gi(self._state_of(state, pos), gi)
            gi_slices = self._gi_slices(pos, inst)
            if row_slices is None or row_slices > gi_slices:
                raise nvml.NVMLError_InvalidArgument()
            if sum(c.slices for c in inst.computeInstances) + row_slices > gi_slices:
                raise nvml.NVMLError_InsufficientResources()
            ci = min(set(range(0, 64)) - {c.id for c in inst.computeInstances})
            inst.computeInstances.append(
                migstate.ComputeInstance(
                    id=ci, profileId=profile_id, slices=row_slices, uuid=f"MIG-{uuidlib.uuid4()}"
                )
            )
        return self._ci_handle(pos, gi, ci)

    def nvmlGpuInstanceGetComputeInstances(
        self, gpu_instance: object, profile_id: int, instances: Any, count: Any
    ) -> int:
        pos, gi = self._gi_of("nvmlGpuInstanceGetComputeInstances", gpu_instance)
        inst = self._find_gi(self._state_of(self.mig_state.read(), pos), gi)
        found = sorted(c.id for c in inst.computeInstances if c.profileId == profile_id)
        if len(instances) < len(found):
            raise nvml.NVMLError_InsufficientSize()
        for i, ci in enumerate(found):
            instances[i] = self._ci_handle(pos, gi, ci)
        fakemig.target(count).value = len(found)
        return int(nvml.NVML_SUCCESS)

    def nvmlComputeInstanceGetInfo(self, compute_instance: object) -> Any:
        pos, gi, ci = self._ci_of("nvmlComputeInstanceGetInfo", compute_instance)
        inst = self._find_gi(self._state_of(self.mig_state.read(), pos), gi)
        for c in inst.computeInstances:
            if c.id == ci:
                return nvml.c_nvmlComputeInstanceInfo_t(
                    gpuInstance=self._gi_handle(pos, gi),
                    id=ci,
                    profileId=c.profileId,
                    placement=nvml.c_nvmlComputeInstancePlacement_t(start=0, size=c.slices),
                )
        raise nvml.NVMLError_InvalidArgument()

    nvmlComputeInstanceGetInfo_v2 = nvmlComputeInstanceGetInfo

    def nvmlComputeInstanceDestroy(self, compute_instance: object) -> int:
        pos, gi, ci = self._ci_of("nvmlComputeInstanceDestroy", compute_instance)
        with self.mig_state.edit() as state:
            gpu = self._state_of(state, pos)
            inst = self._find_gi(gpu, gi)
            if any(p.gpuInstanceId == gi and p.computeInstanceId == ci for p in gpu.processes):
                raise nvml.NVMLError_InUse()
            kept = [c for c in inst.computeInstances if c.id != ci]
            if len(kept) == len(inst.computeInstances):
                raise nvml.NVMLError_InvalidArgument()
            inst.computeInstances = kept
        return int(nvml.NVML_SUCCESS)

    # ---- MIG devices (discovery) ---------------------------------------------------------------

    def _mig_mode_on(self, name: str, handle: object) -> tuple[Any, migstate.GpuMig]:
        """The GPU and its state; NotSupported while MIG mode is off (no MIG devices to walk)."""
        dev, _ = self._capable(name, handle)
        gpu = self._state_of(self.mig_state.read(), dev.pos)
        if gpu.mode != nvml.NVML_DEVICE_MIG_ENABLE:
            raise nvml.NVMLError_NotSupported()
        return dev, gpu

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: object) -> int:
        dev, gpu = self._mig_mode_on("nvmlDeviceGetMaxMigDeviceCount", handle)
        pos: int = dev.pos
        slices = [r.slices for r in self._mig_tables[pos] or ()]
        return max(7, *slices, len(self._mig_devices(gpu)))

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: object, index: int) -> MigHandle:
        dev, gpu = self._mig_mode_on("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        devices = self._mig_devices(gpu)
        if not 0 <= index < len(devices):
            raise nvml.NVMLError_NotFound()
        gi, ci = devices[index]
        return MigHandle(parent=dev, slot=index, gi=gi, ci=ci)

    def nvmlDeviceGetAttributes(self, handle: object) -> Any:
        mig, inst, ci = self._mig("nvmlDeviceGetAttributes", handle)
        row = next(r for r in self._mig_tables[mig.parent.pos] or () if r.id == inst.profileId)
        return nvml.c_nvmlDeviceAttributes(
            multiprocessorCount=row.multiprocessors * ci.slices // row.slices,
            sharedCopyEngineCount=row.copy_engines,
            sharedDecoderCount=row.decoders,
            sharedEncoderCount=row.encoders,
            sharedJpegCount=row.jpeg_engines,
            sharedOfaCount=row.ofa_engines,
            gpuInstanceSliceCount=row.slices,
            computeInstanceSliceCount=ci.slices,
            memorySizeMB=row.memory_mib,
        )

    def nvmlDeviceGetGpuInstanceId(self, handle: object) -> int:
        return self._mig("nvmlDeviceGetGpuInstanceId", handle)[1].id

    def nvmlDeviceGetComputeInstanceId(self, handle: object) -> int:
        return int(self._mig("nvmlDeviceGetComputeInstanceId", handle)[2].id)
