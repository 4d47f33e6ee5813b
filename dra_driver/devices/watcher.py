"""The node agent's GPU health watcher: NVML events plus a periodic poll, over real or fake NVML.

Why it exists: a GPU that falls off the bus or reports a fatal XID must stop being handed out.
One :class:`Watcher` per agent registers the published GPUs in an NVML event set
(``nvmlEventSetCreate`` / ``nvmlDeviceRegisterEvents``) for critical XIDs, double-bit ECC errors
and recovery-action changes, waits on it (``nvmlEventSetWait_v2``) in its own thread, and every
``poll_interval_s`` checks what has no event: pages pending retirement, row-remapping pending or
failed, the NVLink fabric of GPUs that were in one (those three are :mod:`.healthchecks`),
NVML's recovery-action field, and whether the GPU answers at all (``NVML_ERROR_GPU_IS_LOST``
from any call marks it lost). What it sees goes, classified by :mod:`.healthpolicy`, into the
:class:`~.healthtracker.Tracker`.

The NVML module is injected like everywhere else (:mod:`dra_driver.devices.nvml`): the real
pynvml on a GPU node, :class:`~dra_driver.devices.fake.fakenvml.FakeNvml` on fake nodes, whose
injected failures arrive through these very calls. Events of GPUs or MIG devices we do not
publish are ignored; an event addressed to a MIG device (GPU and compute instance ids set) only
concerns that device, one for the whole GPU concerns its MIG devices too (they inherit it).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import structlog

from dra_driver import records
from dra_driver.devices import healthchecks, healthpolicy, healthtracker, model, nvml

Observer = Callable[[str, str, str], None]  # (kind, xid or "", outcome)


@records.record
class WatchedGpu:
    """A published GPU: its UUID and, per (GPU instance, compute instance), its MIG UUIDs."""

    index: int
    uuid: str
    name: str
    migs: Mapping[tuple[int, int], str] = dataclasses.field(default_factory=dict)
    fabric: bool = False  # was in a completed multi-node NVLink fabric at discovery


def watched_gpus(devices: model.NodeDevices, published: Collection[str]) -> list[WatchedGpu]:
    """The GPUs of ``devices`` whose UUID (or one of whose MIG UUIDs) is in ``published``."""
    out = []
    for gpu in devices.gpus:
        migs = {
            (m.gpu_instance_id, m.compute_instance_id): m.uuid
            for m in gpu.mig_devices
            if m.uuid in published
        }
        if gpu.uuid in published or migs:
            fabric = gpu.fabric is not None and gpu.fabric.state == "completed"
            out.append(
                WatchedGpu(index=gpu.index, uuid=gpu.uuid, name=gpu.name, migs=migs, fabric=fabric)
            )
    return out


@dataclasses.dataclass(slots=True)
class _Gpu:
    spec: WatchedGpu
    handle: Any = None
    registered: bool = False
    action: int = 0  # the last recovery action NVML reported
    explained: int = 0  # the action an XID / ECC condition already carries
    lost: bool = False


class Watcher:
    """Watches ``gpus`` through ``api`` and reports to ``tracker``; :meth:`start` / :meth:`stop`."""

    def __init__(
        self,
        *,
        api: nvml.NvmlApi,
        gpus: Sequence[WatchedGpu],
        tracker: healthtracker.Tracker,
        log: structlog.typing.FilteringBoundLogger,
        observe: Observer | None = None,
        nvml_error: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self._gpus = {g.uuid: _Gpu(spec=g) for g in gpus}
        self.tracker = tracker
        self.policy = tracker.policy
        self.log = log
        self._observe = observe or (lambda kind, xid, outcome: None)
        self._nvml_error = nvml_error or (lambda call: None)
        self._clock = clock
        self._event_set: Any = None
        self._opened = False
        self._stop = threading.Event()
        self._poll_due = 0.0
        self._poll_now = threading.Event()
        self._thread: threading.Thread | None = None
        self._wait_failing = False
        self._lock = threading.RLock()  # one poll of a GPU at a time (watcher, health socket)

    # --- life cycle -----------------------------------------------------------------------------
    def open(self) -> None:
        """Initialise NVML, create the event set and register every GPU (failures are logged:
        a GPU whose events cannot be registered is still polled)."""
        try:
            self._api.nvmlInit()
        except nvml.NVMLError as exc:
            self._nvml_error("health")
            self.log.error("GPU health watching disabled: NVML init failed", error=str(exc))
            return
        self._opened = True
        try:
            self._event_set = self._api.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            self._nvml_error("health")
            self.log.error("no NVML event set; GPU health is polled only", error=str(exc))
        for gpu in self._gpus.values():
            self._register(gpu)
        self.poll()
        self._poll_due = self._clock() + self.policy.poll_interval_s
        self.log.info(
            "GPU health watcher started",
            gpus=[g.spec.name for g in self._gpus.values()],
            events=[g.spec.name for g in self._gpus.values() if g.registered],
            poll_interval_s=self.policy.poll_interval_s,
        )

    def start(self) -> None:
        self.open()
        if not self._opened:
            return
        self._thread = threading.Thread(target=self._run, name="gpu-health", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self._event_set is not None:
            self._quiet_call("nvmlEventSetFree", self._event_set)
            self._event_set = None
        if self._opened:
            self._quiet_call("nvmlShutdown")
            self._opened = False

    def poll_soon(self) -> None:
        """Run the poll at the next turn of the loop (after an injected change, say)."""
        self._poll_now.set()

    def recovered(self, uuid: str) -> None:
        """An explicit recovered event for a GPU (or MIG) UUID, applied before this returns:
        the GPU is checked at once and its conditions end together (after the hold time) unless
        a check still fails; the GPU's events are registered again (a reset drops them)."""
        gpu = self._gpus.get(uuid) or next(
            (g for g in self._gpus.values() if uuid in g.spec.migs.values()), None
        )
        if gpu is None:
            self.tracker.update(uuid, explicit=True)
            return
        with self._lock:
            if gpu.spec.uuid != uuid:  # one MIG device
                self.tracker.update(uuid, explicit=True)
                return
            gpu.registered, gpu.handle = False, None
            self._poll_gpu(gpu, explicit=True)

    # --- the loop -------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception as exc:  # never let the watcher die silently
                self._nvml_error("health")
                self.log.error("GPU health watcher step failed", error=repr(exc))
                self._stop.wait(1.0)

    def step(self) -> None:
        """One turn: wait for an event (at most ``wait_ms``), poll when due, end what may end."""
        if self._event_set is not None:
            self._wait()
        else:
            self._poll_now.wait(self.policy.wait_ms / 1000)
        now = self._clock()
        if self._poll_now.is_set() or now >= self._poll_due:
            self._poll_now.clear()
            self._poll_due = now + self.policy.poll_interval_s
            self.poll()
        self.tracker.tick()

    def _wait(self) -> None:
        try:
            event = self._api.nvmlEventSetWait_v2(self._event_set, self.policy.wait_ms)
        except nvml.NVMLError_Timeout:
            self._wait_failing = False
            return
        except nvml.NVMLError_GpuIsLost:
            self._observe(healthpolicy.LOST, "", "poll")
            self.log.warning("NVML event wait: a GPU is lost; checking every GPU")
            self.poll_soon()
            return
        except nvml.NVMLError as exc:
            self._nvml_error("health")
            if not self._wait_failing:
                self.log.error("NVML event wait failed; retrying", error=nvml.describe(exc))
            self._wait_failing = True
            self._stop.wait(1.0)
            return
        self._wait_failing = False
        with self._lock:
            self.handle_event(event)

    def handle_event(self, event: Any) -> None:
        """One ``c_nvmlEventData_t``: find the device it concerns, classify, report."""
        kind = int(event.eventType)
        label = _event_kind(kind)
        xid = str(int(event.eventData)) if kind & nvml.EVENT_XID else ""
        try:
            uuid = str(self._api.nvmlDeviceGetUUID(event.device))
        except nvml.NVMLError_GpuIsLost:
            self._observe(label, xid, "poll")
            self.poll_soon()  # the poll finds out which GPU is lost
            return
        except nvml.NVMLError as exc:
            self._nvml_error("health")
            self.log.warning("NVML event of an unknown device", error=nvml.describe(exc))
            self._observe(label, xid, "unknown-device")
            return
        gpu = self._gpus.get(uuid)
        target = uuid
        gi, ci = int(event.gpuInstanceId), int(event.computeInstanceId)
        if gpu is not None and gi != nvml.INSTANCE_ID_ANY and ci != nvml.INSTANCE_ID_ANY:
            target = gpu.spec.migs.get((gi, ci), "")
        if gpu is None or not target:
            self.log.debug("event of a device we do not publish", uuid=uuid, gi=gi, ci=ci)
            self._observe(label, xid, "unpublished")
            return
        findings = self._classify(gpu, event, kind)
        if not findings:
            self.log.info("ignored XID", gpu=gpu.spec.name, uuid=uuid, xid=int(event.eventData))
            self._observe(label, xid, "ignored")
            return
        self._observe(label, xid, "unhealthy")
        self.tracker.update(target, found=findings)  # MIG devices inherit their GPU's health

    def _classify(self, gpu: _Gpu, event: Any, kind: int) -> list[healthpolicy.Finding]:
        action = None
        if kind & (nvml.EVENT_XID | nvml.EVENT_DBE):
            action = self._action(gpu)
            if action:  # the condition names the action: the poll adds no second one, and
                gpu.explained = gpu.action = action  # its end is a reset observed
        found: list[healthpolicy.Finding] = []
        if kind & nvml.EVENT_XID:
            finding = self.policy.xid(int(event.eventData), action or None)
            if finding is not None:
                found.append(finding)
        if kind & nvml.EVENT_DBE:
            found.append(self.policy.ecc_dbe(action or None))
        if kind & nvml.EVENT_RECOVERY_ACTION:
            self.poll_soon()  # the poll reads the action and notices when it ends
        return found

    # --- the poll -------------------------------------------------------------------------------
    def check(self, uuid: str) -> None:
        """Poll one GPU now, in the caller's thread (after a change injected into it)."""
        gpu = self._gpus.get(uuid)
        if gpu is not None:
            with self._lock:
                self._poll_gpu(gpu)

    def poll(self) -> None:
        """Check every GPU now (what has no NVML event)."""
        for gpu in self._gpus.values():
            with self._lock:
                self._poll_gpu(gpu)

    def _poll_gpu(self, gpu: _Gpu, *, explicit: bool = False) -> None:
        found: list[healthpolicy.Finding] = []
        passed: set[str] = set()
        try:
            if gpu.handle is None:
                gpu.handle = self._api.nvmlDeviceGetHandleByUUID(gpu.spec.uuid)
            found += healthchecks.retired_pages(self._api, self.policy, gpu.handle, passed)
            found += healthchecks.remapped_rows(self._api, self.policy, gpu.handle, passed)
            if gpu.spec.fabric:
                found += healthchecks.fabric(self._api, self.policy, gpu.handle, passed)
            action = self._action(gpu, strict=True)
        except nvml.NVMLError_GpuIsLost as exc:
            gpu.lost = True
            self.tracker.update(gpu.spec.uuid, found=[self.policy.lost(nvml.describe(exc))])
            return
        except nvml.NVMLError as exc:
            self._nvml_error("health")
            self.log.warning("GPU health check failed", gpu=gpu.spec.name, error=nvml.describe(exc))
            return
        reset = gpu.lost or (gpu.action != 0 and action == 0)
        passed.add(healthpolicy.LOST)
        if action and action != gpu.explained:
            found.append(self.policy.recovery_action(action))
        elif not action:
            passed.add(healthpolicy.ACTION)
            gpu.explained = 0
        if reset:
            self.log.info("GPU reset observed through NVML", gpu=gpu.spec.name, uuid=gpu.spec.uuid)
            gpu.registered = False
        gpu.lost, gpu.action = False, action
        if not gpu.registered:
            self._register(gpu)
        recovering = reset or explicit
        self.tracker.update(
            gpu.spec.uuid, found=found, passed=passed, reset=reset, explicit=explicit
        )
        if recovering:
            for mig in gpu.spec.migs.values():
                self.tracker.update(mig, reset=reset, explicit=explicit)

    def _action(self, gpu: _Gpu, *, strict: bool = False) -> int:
        """NVML's recovery action for the GPU (0 = none or not reported)."""
        try:
            handle = gpu.handle or self._api.nvmlDeviceGetHandleByUUID(gpu.spec.uuid)
            gpu.handle = handle
            values = self._optional("nvmlDeviceGetFieldValues", handle, [nvml.FI_RECOVERY_ACTION])
        except nvml.NVMLError:
            if strict:
                raise
            return 0
        if not values or int(values[0].nvmlReturn) != nvml.NVML_SUCCESS:
            return 0
        return int(values[0].value.uiVal)

    # --- helpers ------------------------------------------------------------------------------
    def _register(self, gpu: _Gpu) -> None:
        if self._event_set is None:
            return
        try:
            gpu.handle = self._api.nvmlDeviceGetHandleByUUID(gpu.spec.uuid)
            supported = int(self._api.nvmlDeviceGetSupportedEventTypes(gpu.handle))
            wanted = nvml.EVENT_XID | nvml.EVENT_DBE | nvml.EVENT_RECOVERY_ACTION
            self._api.nvmlDeviceRegisterEvents(gpu.handle, wanted & supported, self._event_set)
            gpu.registered = True
        except nvml.NVMLError_GpuIsLost as exc:
            gpu.lost = True
            self.tracker.update(gpu.spec.uuid, found=[self.policy.lost(nvml.describe(exc))])
        except nvml.NVMLError as exc:
            self._nvml_error("health")
            self.log.warning(
                "GPU events cannot be registered; it is polled only",
                gpu=gpu.spec.name,
                error=nvml.describe(exc),
            )

    def _optional(self, name: str, *args: Any) -> Any:
        return nvml.optional(self._api, name, *args)

    def _quiet_call(self, name: str, *args: Any) -> None:
        try:
            getattr(self._api, name)(*args)
        except nvml.NVMLError as exc:
            self.log.debug(f"{name} failed", error=nvml.describe(exc))


def _event_kind(kind: int) -> str:
    if kind & nvml.EVENT_XID:
        return healthpolicy.XID
    if kind & nvml.EVENT_DBE:
        return healthpolicy.ECC
    return healthpolicy.ACTION
