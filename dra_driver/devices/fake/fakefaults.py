"""The health half of the NVML stand-in: fake GPUs that fail at run time, the way NVML shows it.

Why it exists: the health watcher (:mod:`dra_driver.devices.watcher`) must run the same code on
a laptop as on a GPU node, so fake GPUs fail through NVML's own interfaces: an event set
(``nvmlEventSetCreate`` / ``nvmlDeviceRegisterEvents`` / ``nvmlEventSetWait_v2``) that delivers
pynvml's own ``c_nvmlEventData_t`` and raises ``NVMLError_Timeout`` when nothing happened, a lost
GPU whose every call raises ``NVMLError_GpuIsLost`` (and whose loss wakes waiting event sets with
that error, as the driver does), pages pending retirement, row-remapping failures, a degraded
NVLink fabric and the driver's recovery-action field. :class:`FakeHealth` is mixed into
:class:`~dra_driver.devices.fake.fakenvml.FakeNvml`; tests and the fake-event control socket call
its ``inject_*`` / :meth:`FakeHealth.lose` / :meth:`FakeHealth.reset` methods from any thread.

Support follows the hardware: Volta and Turing retire pages (row remapping is NotSupported),
Ampere and newer remap rows (page retirement is NotSupported). Events are delivered only to event
sets that registered the GPU for that event type, like NVML.
"""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import threading
from typing import TYPE_CHECKING, Any

from dra_driver.devices import nvml
from dra_driver.devices.fake import profiles

_AMPERE = 7  # NVML_DEVICE_ARCH_AMPERE: first architecture with row remapping
_HANDLE_BASE = 0x6E760000  # fake addresses of device handles in event data (never dereferenced)
_SUPPORTED_EVENTS = nvml.EVENT_XID | nvml.EVENT_DBE | nvml.EVENT_SBE | nvml.EVENT_RECOVERY_ACTION


@dataclasses.dataclass(slots=True)
class GpuFaults:
    """What is wrong with one fake GPU right now (all false / none: healthy)."""

    lost: bool = False
    pages_pending: bool = False
    remap_pending: bool = False
    remap_failure: bool = False
    fabric_degraded: bool = False
    recovery_action: int = 0  # NVML_GPU_RECOVERY_ACTION_*


@dataclasses.dataclass(slots=True)
class _EventSet:
    registered: dict[int, int] = dataclasses.field(default_factory=dict)  # GPU position → mask
    queue: collections.deque[Any] = dataclasses.field(default_factory=collections.deque)
    freed: bool = False


class FakeHealth:
    """Mixin: NVML's health functions for the stand-in's GPUs, plus fault injection."""

    # Provided by FakeNvml.
    profile: profiles.Profile
    _pos: dict[int, int]
    _arch: list[int]
    _migs: list[list[profiles.MigSpec]]

    def _init_health(self, count: int) -> None:
        self._faults = [GpuFaults() for _ in range(count)]
        self._events = threading.Condition()
        self._sets: dict[int, _EventSet] = {}
        self.events_delivered = 0

    # --- injection (tests, the fake-event socket) ---------------------------------------------
    def faults(self, index: int) -> GpuFaults:
        """The live fault state of GPU ``index`` (KeyError for an index the profile lacks)."""
        return self._faults[self._position(index)]

    def inject_xid(
        self,
        index: int,
        xid: int,
        *,
        gpu_instance: int | None = None,
        compute_instance: int | None = None,
        action: int | None = None,
    ) -> int:
        """An XID on GPU ``index`` (on one MIG device when both instance ids are given); with
        ``action`` the driver also reports that NVML_GPU_RECOVERY_ACTION_*. Returns how many
        event sets received it."""
        pos = self._position(index)
        if action is not None:
            self._faults[pos].recovery_action = action
        return self._deliver(pos, nvml.EVENT_XID, xid, gpu_instance, compute_instance)

    def inject_ecc_dbe(
        self, index: int, *, gpu_instance: int | None = None, compute_instance: int | None = None
    ) -> int:
        """A double-bit (uncorrectable) ECC error on GPU ``index``."""
        return self._deliver(
            self._position(index), nvml.EVENT_DBE, 0, gpu_instance, compute_instance
        )

    def lose(self, index: int) -> None:
        """GPU ``index`` falls off the bus: its calls raise GpuIsLost, waiting sets wake with it."""
        pos = self._position(index)
        with self._events:
            self._faults[pos].lost = True
            for event_set in self._sets.values():
                if pos in event_set.registered:
                    event_set.queue.append(nvml.NVMLError_GpuIsLost)
            self._events.notify_all()

    def reset(self, index: int) -> None:
        """GPU ``index`` was reset (or the node rebooted): it answers again, nothing is pending,
        the recovery action is none. A GPU that was lost comes back as a new device: its event
        registrations are gone and must be made again."""
        pos = self._position(index)
        with self._events:
            if self._faults[pos].lost:
                for event_set in self._sets.values():
                    event_set.registered.pop(pos, None)
            self._faults[pos] = GpuFaults()

    def set_faults(self, index: int, **changes: Any) -> None:
        """Change fields of :class:`GpuFaults` (``pages_pending=True``, ``recovery_action=1``)."""
        faults = self._faults[self._position(index)]
        for name, value in changes.items():
            if not hasattr(faults, name):
                raise ValueError(f"GpuFaults has no field {name}")
            setattr(faults, name, value)

    def _position(self, index: int) -> int:
        if index not in self._pos:
            raise KeyError(f"no GPU with index {index} on this fake node")
        return self._pos[index]

    def _deliver(self, pos: int, kind: int, data: int, gi: int | None, ci: int | None) -> int:
        delivered = 0
        with self._events:
            for event_set in self._sets.values():
                if event_set.registered.get(pos, 0) & kind:
                    event = nvml.c_nvmlEventData_t()
                    event.device = self._pointer(pos)
                    event.eventType = kind
                    event.eventData = data
                    event.gpuInstanceId = nvml.INSTANCE_ID_ANY if gi is None else gi
                    event.computeInstanceId = nvml.INSTANCE_ID_ANY if ci is None else ci
                    event_set.queue.append(event)
                    delivered += 1
            self.events_delivered += delivered
            self._events.notify_all()
        return delivered

    # --- handles -------------------------------------------------------------------------------
    @staticmethod
    def _pointer(pos: int) -> Any:
        """The ``c_nvmlDevice_t`` an event carries for the GPU at ``pos``."""
        return ctypes.cast(ctypes.c_void_p(_HANDLE_BASE + 0x100 * (pos + 1)), nvml.c_nvmlDevice_t)

    @staticmethod
    def _pointer_pos(handle: object) -> int | None:
        """Position of an event's device pointer; None for anything else."""
        if not isinstance(handle, nvml.c_nvmlDevice_t):
            return None
        address = ctypes.cast(handle, ctypes.c_void_p).value or 0
        pos, rest = divmod(address - _HANDLE_BASE, 0x100)
        return pos - 1 if rest == 0 and pos >= 1 else None

    def _check_lost(self, pos: int) -> None:
        if self._faults[pos].lost:
            raise nvml.NVMLError_GpuIsLost()

    # --- NVML: handles -------------------------------------------------------------------------
    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> Any:
        self._enter("nvmlDeviceGetHandleByUUID")
        wanted = uuid.decode() if isinstance(uuid, bytes) else uuid
        for pos in range(len(self.profile.gpus)):
            index = self.profile.gpu_index(pos)
            if self.profile.gpu_uuid(pos) == wanted:
                return self.nvmlDeviceGetHandleByIndex(index)
            for slot, mig in enumerate(self._migs[pos]):
                if self.profile.mig_uuid(pos, mig) == wanted:
                    gpu = self.nvmlDeviceGetHandleByIndex(index)
                    return self.nvmlDeviceGetMigDeviceHandleByIndex(gpu, slot)
        raise nvml.NVMLError_NotFound()

    # --- NVML: events --------------------------------------------------------------------------
    def _event_set(self, name: str, handle: object) -> _EventSet:
        self._enter(name)
        address = (
            ctypes.cast(handle, ctypes.c_void_p).value
            if isinstance(handle, nvml.c_nvmlEventSet_t)
            else None
        )
        found = self._sets.get(address or 0)
        if found is None or found.freed:
            raise nvml.NVMLError_InvalidArgument()
        return found

    def nvmlEventSetCreate(self) -> Any:
        self._enter("nvmlEventSetCreate")
        with self._events:
            address = _HANDLE_BASE + 0x10000 + 0x100 * (len(self._sets) + 1)
            self._sets[address] = _EventSet()
        return ctypes.cast(ctypes.c_void_p(address), nvml.c_nvmlEventSet_t)

    def nvmlEventSetFree(self, event_set: object) -> None:
        found = self._event_set("nvmlEventSetFree", event_set)
        with self._events:
            found.freed = True
            self._events.notify_all()

    def nvmlDeviceGetSupportedEventTypes(self, handle: object) -> int:
        self._device("nvmlDeviceGetSupportedEventTypes", handle)
        return _SUPPORTED_EVENTS

    def nvmlDeviceRegisterEvents(self, handle: object, event_types: int, event_set: object) -> None:
        dev = self._device("nvmlDeviceRegisterEvents", handle)
        found = self._event_set("nvmlDeviceRegisterEvents", event_set)
        if event_types & ~_SUPPORTED_EVENTS:
            raise nvml.NVMLError_NotSupported()
        with self._events:
            found.registered[dev.pos] = found.registered.get(dev.pos, 0) | event_types

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> Any:
        found = self._event_set("nvmlEventSetWait_v2", event_set)
        with self._events:
            self._events.wait_for(lambda: bool(found.queue) or found.freed, timeout_ms / 1000)
            if found.freed:
                raise nvml.NVMLError_InvalidArgument()
            if not found.queue:
                raise nvml.NVMLError_Timeout()
            item = found.queue.popleft()
        if isinstance(item, type):
            raise item()
        return item

    def nvmlEventSetWait(self, event_set: object, timeout_ms: int) -> Any:
        return self.nvmlEventSetWait_v2(event_set, timeout_ms)

    # --- NVML: conditions the watcher polls ----------------------------------------------------
    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: object) -> int:
        dev = self._device("nvmlDeviceGetRetiredPagesPendingStatus", handle)
        if self._arch[dev.pos] >= _AMPERE:
            raise nvml.NVMLError_NotSupported()  # row remapping replaced page retirement
        pending = self._faults[dev.pos].pages_pending
        return nvml.NVML_FEATURE_ENABLED if pending else nvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetRemappedRows(self, handle: object) -> tuple[int, int, int, int]:
        dev = self._device("nvmlDeviceGetRemappedRows", handle)
        if self._arch[dev.pos] < _AMPERE:
            raise nvml.NVMLError_NotSupported()
        faults = self._faults[dev.pos]
        return (0, int(faults.remap_failure), int(faults.remap_pending), int(faults.remap_failure))

    def nvmlDeviceGetFieldValues(self, handle: object, field_ids: list[Any]) -> Any:
        dev = self._device("nvmlDeviceGetFieldValues", handle)
        values = (nvml.c_nvmlFieldValue_t * len(field_ids))()
        for i, field in enumerate(field_ids):
            values[i].fieldId = field
            if field == nvml.FI_RECOVERY_ACTION:
                values[i].valueType = nvml.NVML_VALUE_TYPE_UNSIGNED_INT
                values[i].value.uiVal = self._faults[dev.pos].recovery_action
                values[i].nvmlReturn = nvml.NVML_SUCCESS
            else:
                values[i].nvmlReturn = nvml.NVMLError_NotSupported().value
        return values

    def _fabric_health(self, pos: int, target: Any) -> None:
        """Fill the fabric health mask (structs that have one) from the fault state."""
        if hasattr(type(target), "healthMask"):
            unhealthy = self._faults[pos].fabric_degraded
            route = nvml.FABRIC_ROUTE_UNHEALTHY_TRUE if unhealthy else 2  # 2: ROUTE_UNHEALTHY_FALSE
            target.healthMask = route << nvml.FABRIC_ROUTE_UNHEALTHY_SHIFT

    if TYPE_CHECKING:  # provided by FakeNvml; declared here for the type checker only

        def _enter(self, name: str, handle: object = None) -> None: ...

        def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...

        def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: object, index: int) -> Any: ...

        def _device(self, name: str, handle: object) -> Any: ...
