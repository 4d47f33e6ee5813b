"""Creating and destroying MIG instances, and switching MIG mode, through NVML.

Why it exists: dynamic MIG turns an allocated placement into a real MIG device at prepare time
and takes it away at unprepare (and after a crash). This is the one seam between the driver core
and the card for that (:class:`MigControl`); :class:`NvmlMigControl` implements it over an
injected NVML module — pynvml on a node, the stand-in (:mod:`dra_driver.devices.fake.fakemig`) with
``--fake`` — so fake and real GPUs run the same calls:

* create: the GPU instance at exactly the allocated placement
  (``nvmlDeviceCreateGpuInstanceWithPlacement``), then one compute instance spanning it (the
  compute instance profile with the same slice count, shared engines), then the new MIG
  device's UUID (found among the GPU's MIG device handles by its instance ids). A failure after
  the GPU instance exists destroys what was made before the error is raised.
* destroy: compute instances first, then the GPU instance (NVML refuses the other order).
* MIG mode: only switched on an idle GPU. Running processes make it :class:`GpuBusy` with their
  pids; NVML's activation status ``IN_USE`` the same; a change left pending (a GPU that needs a
  reset) is an error saying so.

Every failure is a :class:`MigControlError` naming the GPU, the operation and NVML's reason.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator
from typing import Any, Protocol

from dra_driver import records
from dra_driver.devices import nvml


class MigControlError(Exception):
    """A MIG operation failed; the message names the GPU and the operation."""


class GpuBusy(MigControlError):
    """The GPU runs processes, so its MIG mode cannot change now."""


@records.record
class Placement:
    """A GPU instance to create: profile and place on its parent GPU."""

    parent_uuid: str
    profile: str  # "3g.40gb", for messages
    profile_id: int
    profile_slot: int  # NVML_GPU_INSTANCE_PROFILE_* (to read the profile's info)
    start: int
    size: int

    def describe(self) -> str:
        if self.size == 1:
            return f"{self.profile} at memory slice {self.start}"
        return f"{self.profile} at memory slices {self.start}-{self.start + self.size - 1}"


@records.record
class Instance:
    """A GPU instance that exists, with its compute instance (if any) and MIG device UUID."""

    parent_uuid: str
    profile_id: int
    start: int
    size: int
    gpu_instance_id: int
    compute_instance_id: int | None = None
    uuid: str | None = None


class MigControl(Protocol):
    """MIG operations on full GPUs addressed by UUID."""

    def mig_enabled(self, parent_uuid: str) -> bool: ...

    def set_mig_mode(self, parent_uuid: str, enabled: bool) -> None: ...

    def processes(self, parent_uuid: str) -> list[int]: ...

    def create(self, placement: Placement) -> Instance: ...

    def destroy(self, parent_uuid: str, *, profile_id: int, start: int) -> bool:
        """Destroy the GPU instance of ``profile_id`` at ``start``; False if there is none."""
        ...

    def instances(self, parent_uuid: str) -> list[Instance]: ...


def _error(what: str, exc: BaseException) -> MigControlError:
    if isinstance(exc, nvml.NVMLError_NoPermission):
        return MigControlError(f"{what}: {exc} (the plugin must run as root)")
    return MigControlError(f"{what}: {nvml.describe(exc)}")


class NvmlMigControl:
    """:class:`MigControl` over an NVML module (pynvml, or the stand-in)."""

    def __init__(self, *, nvml_api: nvml.NvmlApi) -> None:
        self._nvml = nvml_api

    @contextlib.contextmanager
    def _session(self, what: str) -> Iterator[Any]:
        try:
            self._nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise MigControlError(f"{what}: NVML initialisation failed: {exc}") from None
        try:
            yield self._nvml
        except nvml.NVMLError as exc:
            raise _error(what, exc) from None
        finally:
            with contextlib.suppress(nvml.NVMLError):
                self._nvml.nvmlShutdown()

    # ---- mode and processes --------------------------------------------------------------------

    def mig_enabled(self, parent_uuid: str) -> bool:
        with self._session(f"GPU {parent_uuid}: cannot read MIG mode") as api:
            handle = api.nvmlDeviceGetHandleByUUID(parent_uuid)
            return bool(api.nvmlDeviceGetMigMode(handle)[0] == nvml.NVML_DEVICE_MIG_ENABLE)

    def processes(self, parent_uuid: str) -> list[int]:
        with self._session(f"GPU {parent_uuid}: cannot list its processes") as api:
            return self._pids(api, api.nvmlDeviceGetHandleByUUID(parent_uuid))

    @staticmethod
    def _pids(api: Any, handle: Any) -> list[int]:
        return sorted(int(p.pid) for p in api.nvmlDeviceGetComputeRunningProcesses(handle))

    def set_mig_mode(self, parent_uuid: str, enabled: bool) -> None:
        word = "enable" if enabled else "disable"
        want = nvml.NVML_DEVICE_MIG_ENABLE if enabled else nvml.NVML_DEVICE_MIG_DISABLE
        what = f"GPU {parent_uuid}: cannot {word} MIG mode"
        with self._session(what) as api:
            handle = api.nvmlDeviceGetHandleByUUID(parent_uuid)
            if api.nvmlDeviceGetMigMode(handle)[0] == want:
                return
            pids = self._pids(api, handle)
            if pids:
                raise GpuBusy(
                    f"{what}: the GPU is busy with {len(pids)} process(es) "
                    f"(pid {', '.join(map(str, pids))}); MIG mode only changes on an idle GPU"
                )
            status = int(api.nvmlDeviceSetMigMode(handle, want))
            if status == nvml.NVML_ERROR_IN_USE:
                raise GpuBusy(f"{what}: the GPU is in use (NVML: {nvml.NVMLError(status)})")
            if status != nvml.NVML_SUCCESS:
                raise MigControlError(f"{what}: activation failed: {nvml.NVMLError(status)}")
            current, pending = api.nvmlDeviceGetMigMode(handle)
            if current != want:
                raise MigControlError(
                    f"{what}: the change is pending (current {current}, pending {pending}); "
                    "the GPU must be reset (nvidia-smi -r) before MIG mode takes effect"
                )

    # ---- instances -----------------------------------------------------------------------------

    def create(self, placement: Placement) -> Instance:
        what = f"GPU {placement.parent_uuid}: cannot create MIG {placement.describe()}"
        with self._session(what) as api:
            handle = api.nvmlDeviceGetHandleByUUID(placement.parent_uuid)
            if api.nvmlDeviceGetMigMode(handle)[0] != nvml.NVML_DEVICE_MIG_ENABLE:
                raise MigControlError(f"{what}: MIG mode is off")
            info = api.nvmlDeviceGetGpuInstanceProfileInfo(handle, placement.profile_slot)
            if int(info.id) != placement.profile_id:
                raise MigControlError(
                    f"{what}: NVML lists profile id {info.id} at slot {placement.profile_slot}, "
                    f"not {placement.profile_id}"
                )
            wanted = nvml.c_nvmlGpuInstancePlacement_t(start=placement.start, size=placement.size)
            try:
                gi = api.nvmlDeviceCreateGpuInstanceWithPlacement(
                    handle, placement.profile_id, ctypes.pointer(wanted)
                )
            except nvml.NVMLError_InsufficientResources:
                raise MigControlError(
                    f"{what}: the placement overlaps an existing instance or the GPU has no "
                    "room left (NVML: insufficient resources)"
                ) from None
            try:
                return self._finish(api, handle, gi, placement, int(info.sliceCount))
            except BaseException:
                with contextlib.suppress(nvml.NVMLError):
                    self._destroy_gi(api, gi)
                raise

    def _finish(
        self, api: Any, handle: Any, gi: Any, placement: Placement, slices: int
    ) -> Instance:
        profile = nvml.CI_PROFILE_BY_SLICES[slices]
        shared = nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
        ci_info = api.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, profile, shared)
        ci = api.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
        gi_id = int(api.nvmlGpuInstanceGetInfo(gi).id)
        ci_id = int(api.nvmlComputeInstanceGetInfo(ci).id)
        uuid = self._mig_uuid(api, handle, gi_id, ci_id)
        if uuid is None:
            raise MigControlError(
                f"GPU {placement.parent_uuid}: created GPU instance {gi_id} / compute instance "
                f"{ci_id} but NVML lists no MIG device for it"
            )
        return Instance(
            parent_uuid=placement.parent_uuid,
            profile_id=placement.profile_id,
            start=placement.start,
            size=placement.size,
            gpu_instance_id=gi_id,
            compute_instance_id=ci_id,
            uuid=uuid,
        )

    @staticmethod
    def _mig_uuid(api: Any, handle: Any, gi_id: int, ci_id: int) -> str | None:
        for index in range(int(api.nvmlDeviceGetMaxMigDeviceCount(handle))):
            try:
                mig = api.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
            except nvml.NVMLError_NotFound:
                continue
            if (
                int(api.nvmlDeviceGetGpuInstanceId(mig)) == gi_id
                and int(api.nvmlDeviceGetComputeInstanceId(mig)) == ci_id
            ):
                return str(api.nvmlDeviceGetUUID(mig))
        return None

    def destroy(self, parent_uuid: str, *, profile_id: int, start: int) -> bool:
        what = (
            f"GPU {parent_uuid}: cannot destroy the MIG instance of profile {profile_id} at {start}"
        )
        with self._session(what) as api:
            handle = api.nvmlDeviceGetHandleByUUID(parent_uuid)
            if api.nvmlDeviceGetMigMode(handle)[0] != nvml.NVML_DEVICE_MIG_ENABLE:
                return False
            for gi, info in self._gpu_instances(api, handle, profile_id):
                if int(info.placement.start) == start:
                    try:
                        self._destroy_gi(api, gi)
                    except nvml.NVMLError_InUse:
                        raise MigControlError(
                            f"{what}: it is in use (a process still runs on it)"
                        ) from None
                    return True
            return False

    def instances(self, parent_uuid: str) -> list[Instance]:
        with self._session(f"GPU {parent_uuid}: cannot list its MIG instances") as api:
            handle = api.nvmlDeviceGetHandleByUUID(parent_uuid)
            if api.nvmlDeviceGetMigMode(handle)[0] != nvml.NVML_DEVICE_MIG_ENABLE:
                return []
            found: list[Instance] = []
            for profile_id in self._profile_ids(api, handle):
                for gi, info in self._gpu_instances(api, handle, profile_id):
                    cis = [int(api.nvmlComputeInstanceGetInfo(ci).id) for ci in self._cis(api, gi)]
                    gi_id = int(info.id)
                    ci_id = min(cis) if cis else None
                    uuid = self._mig_uuid(api, handle, gi_id, ci_id) if ci_id is not None else None
                    found.append(
                        Instance(
                            parent_uuid=parent_uuid,
                            profile_id=profile_id,
                            start=int(info.placement.start),
                            size=int(info.placement.size),
                            gpu_instance_id=gi_id,
                            compute_instance_id=ci_id,
                            uuid=uuid,
                        )
                    )
            return sorted(found, key=lambda i: (i.start, i.gpu_instance_id))

    # ---- helpers -------------------------------------------------------------------------------

    @staticmethod
    def _profile_ids(api: Any, handle: Any) -> list[int]:
        ids: list[int] = []
        for slot in range(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                ids.append(int(api.nvmlDeviceGetGpuInstanceProfileInfo(handle, slot).id))
            except nvml.UNSUPPORTED:
                continue
        return ids

    @staticmethod
    def _gpu_instances(api: Any, handle: Any, profile_id: int) -> list[tuple[Any, Any]]:
        """(handle, info) of the GPU instances of one profile."""
        room = 64  # more than any GPU holds (7 on A100/H100)
        array = (nvml.c_nvmlGpuInstance_t * room)()
        count = ctypes.c_uint(0)
        try:
            api.nvmlDeviceGetGpuInstances(handle, profile_id, array, ctypes.pointer(count))
        except nvml.UNSUPPORTED:
            return []
        return [(gi, api.nvmlGpuInstanceGetInfo(gi)) for gi in array[: count.value]]

    @staticmethod
    def _cis(api: Any, gi: Any) -> list[Any]:
        found: list[Any] = []
        shared = nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
        for profile in sorted(set(nvml.CI_PROFILE_BY_SLICES.values())):
            try:
                info = api.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, profile, shared)
            except nvml.UNSUPPORTED:
                continue
            array = (nvml.c_nvmlComputeInstance_t * max(1, int(info.instanceCount)))()
            count = ctypes.c_uint(0)
            api.nvmlGpuInstanceGetComputeInstances(gi, info.id, array, ctypes.pointer(count))
            found += array[: count.value]
        return found

    def _destroy_gi(self, api: Any, gi: Any) -> None:
        for ci in self._cis(api, gi):
            api.nvmlComputeInstanceDestroy(ci)
        api.nvmlGpuInstanceDestroy(gi)
