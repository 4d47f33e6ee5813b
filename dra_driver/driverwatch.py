"""The node agent's watch on the NVIDIA driver itself: outages (an upgrade), its return, and GPUs
that appear or vanish while it runs.

Why it exists: operators upgrade the driver on live nodes (the kernel module is unloaded and a
new one loaded), GPUs fall off the bus or are hot-added, and the agent discovers at start only.
:class:`DriverWatch` runs one thread over the agent's NVML module (the real pynvml, or the fake
node's stand-in, which fails the same way, :mod:`dra_driver.devices.fake.fakelifecycle`):

* **Up**: every ``poll_s`` it asks NVML for the driver version and the GPU count. An error that
  means the driver is away (:data:`DRIVER_GONE`: NVML uninitialised, driver not loaded,
  library/kernel version mismatch, GPU lost) starts an *outage*; a changed count, and every
  ``rescan_s`` anyway, rediscovers (hot-plug, MIG re-partitioned behind our back).
* **Outage**: every GPU of the node gets the condition :data:`CONDITION_KIND` on the health
  board — a ``NoSchedule`` device taint ``<driver>/driver-unavailable`` in the published slices,
  or withdrawal on servers that drop taints (:mod:`dra_driver.slices.taints`), never
  ``NoExecute``: running containers keep their device nodes. ``on_outage`` hears it (readiness,
  the prepare gate). It retries ``nvmlInit`` with backoff (``backoff_s``, doubling to
  ``max_backoff_s``).
* **Return**: NVML initialises again; the node is rediscovered, compared with what was known
  (:mod:`dra_driver.devices.rediscovery`: by UUID and PCI address) and handed to ``on_devices``
  *before* the outage's conditions are cleared, so the republish that follows builds the new
  facts (a new driver version) and the cleared taints in one rebuild: one write per changed
  slice, none for a slice that did not change.

Everything it learns is logged once per change; the callbacks run in its thread and must not
block for long. Errors in them are logged and retried at the next turn.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import prometheus_client as prom
import structlog

from dra_driver import records
from dra_driver.devices import backend, health, model, nvml, rediscovery

CONDITION_KIND = "driver-unavailable"
DRIVER_GONE_MESSAGE = "the NVIDIA driver is not loaded on this node (upgrade in progress?)"
# NVML errors that mean the driver (not one GPU) is away, and the taint value each gives.
DRIVER_GONE: dict[type[Exception], str] = {
    nvml.NVMLError_Uninitialized: "uninitialized",
    nvml.NVMLError_DriverNotLoaded: "not-loaded",
    nvml.NVMLError_LibRmVersionMismatch: "version-mismatch",
    nvml.NVMLError_GpuIsLost: "gpu-lost",
}


RELEASED = "released"  # the outage reason of an NVML release (dra_driver.driverrelease)


def driver_gone(exc: BaseException) -> str | None:
    """The outage reason ``exc`` stands for (a :data:`DRIVER_GONE` value), None otherwise."""
    for kind, reason in DRIVER_GONE.items():
        if isinstance(exc, kind):
            return reason
    return None


@records.record
class Outage:
    """The driver's state as the agent sees it."""

    gone: bool = False
    reason: str = ""  # a DRIVER_GONE value while gone
    detail: str = ""  # NVML's words
    since: float = 0.0  # monotonic

    def message(self) -> str:
        if not self.gone:
            return ""
        if self.reason == RELEASED:  # asked for (driverrelease): the detail says why
            return self.detail
        text = DRIVER_GONE_MESSAGE
        if self.reason == "version-mismatch":
            text += (
                " — NVML library and kernel driver versions differ: restart this agent's "
                "container if it persists after the upgrade"
            )
        return f"{text} (NVML: {self.detail})"


class Metrics:
    """``dra_driver_nvidia_driver_available``, outages, rediscoveries (in the agent's registry)."""

    def __init__(self, registry: prom.CollectorRegistry) -> None:
        self.available = prom.Gauge(
            "dra_driver_nvidia_driver_available",
            "1 while NVML answers on this node, 0 while the NVIDIA driver is away (upgrade)",
            registry=registry,
        )
        self.outages = prom.Counter(
            "dra_driver_nvidia_driver_outages",
            "Times the NVIDIA driver went away under the running agent",
            ["reason"],
            registry=registry,
        )
        self.rediscoveries = prom.Counter(
            "dra_driver_rediscoveries",
            "Rediscoveries of the node's GPUs at run time, by what they found",
            ["result"],
            registry=registry,
        )
        self.available.set(1)
        for reason in DRIVER_GONE.values():
            self.outages.labels(reason)
        for result in ("unchanged", "changed", "failed"):
            self.rediscoveries.labels(result)


# (the devices now, what changed, whether to republish at once): swap them in everywhere.
DevicesChanged = Callable[[model.NodeDevices, rediscovery.Changes, bool], None]


class DriverWatch:
    """See the module docstring; :meth:`start` / :meth:`stop`."""

    def __init__(
        self,
        *,
        api: Any,
        discover: Callable[[], model.NodeDevices],
        devices: model.NodeDevices,
        board: health.HealthBoard,
        log: structlog.typing.FilteringBoundLogger,
        on_devices: DevicesChanged,
        on_outage: Callable[[Outage], None] | None = None,
        metrics: Metrics | None = None,
        hidden: rediscovery.Hidden = rediscovery.never_hidden,
        poll_s: float = 0.5,
        rescan_s: float = 10.0,
        backoff_s: float = 0.2,
        max_backoff_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self._discover = discover
        self.devices = devices
        self._board = board
        self._log = log
        self._on_devices = on_devices
        self._on_outage = on_outage or (lambda outage: None)
        self._metrics = metrics
        self._hidden = hidden
        self._poll_s = poll_s
        self._rescan_s = rescan_s
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._clock = clock
        self._lock = threading.Lock()
        self._outage = Outage()
        self._marked: set[str] = set()
        self._count = len(devices.gpus)
        self._rescan_due = clock() + rescan_s
        self._delay = backoff_s
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="driver-watch", daemon=True)
        self._initialised = False

    # --- what others read -------------------------------------------------------------------------
    @property
    def outage(self) -> Outage:
        with self._lock:
            return self._outage

    def available(self) -> bool:
        """Readiness check: the driver answers."""
        return not self.outage.gone

    def rescan_soon(self) -> None:
        """Rediscover at the next turn (a fake GPU added or removed, a MIG change)."""
        self._rescan_due = 0.0
        self._wake.set()

    # --- life cycle -------------------------------------------------------------------------------
    def start(self) -> None:
        try:
            self._api.nvmlInit()  # our own reference: released during an outage
            self._initialised = True
        except nvml.NVMLError as exc:
            self._enter(exc)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(5.0)
        if self._initialised:
            self._quiet("nvmlShutdown")
            self._initialised = False

    def _run(self) -> None:
        while not self._stop.is_set():
            gone = self.outage.gone
            self._wake.wait(self._delay if gone else self._poll_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.step()
            except Exception as exc:  # never let the watch die silently
                self._log.error("driver watch step failed", error=repr(exc))

    def step(self) -> None:
        """One turn: check the driver (or try to bring NVML back), rediscover when due."""
        if self.outage.gone:
            self._try_return()
            return
        try:
            self._api.nvmlSystemGetDriverVersion()
            count = int(self._api.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            if driver_gone(exc) is not None:
                self._enter(exc)
            else:
                self._log.warning("NVML driver check failed", error=nvml.describe(exc))
            return
        if count != self._count or self._clock() >= self._rescan_due:
            self._rescan()

    # --- outage -----------------------------------------------------------------------------------
    def _enter(self, exc: BaseException, reason: str = "") -> None:
        reason = reason or driver_gone(exc) or "not-loaded"
        detail = str(exc) if reason == RELEASED else nvml.describe(exc)
        outage = Outage(gone=True, reason=reason, detail=detail, since=self._clock())
        with self._lock:
            self._outage = outage
        self._delay = self._backoff_s
        if self._initialised:  # let go of the driver: the module can be unloaded
            self._quiet("nvmlShutdown")
            self._initialised = False
        condition = health.Condition(
            kind=CONDITION_KIND, value=reason, effect="NoSchedule", message=outage.message()
        )
        uuids = _uuids(self.devices)
        _mark(self._board, uuids, condition)
        self._marked |= set(uuids)
        if self._metrics is not None:
            self._metrics.available.set(0)
            self._metrics.outages.labels(reason).inc()
        self._log.warning(
            "NVIDIA driver went away; GPUs unschedulable until it returns",
            reason=reason,
            error=outage.detail,
            gpus=len(self.devices.gpus),
        )
        self._tell(outage)

    def _try_return(self) -> None:
        try:
            self._api.nvmlInit()
        except nvml.NVMLError as exc:
            reason = driver_gone(exc) or "not-loaded"
            if reason != self.outage.reason:
                with self._lock:
                    self._outage = Outage(
                        gone=True,
                        reason=reason,
                        detail=nvml.describe(exc),
                        since=self._outage.since,
                    )
            self._delay = min(self._delay * 2, self._max_backoff_s)
            return
        self._initialised = True
        try:
            found = self._discover()
        except (backend.DiscoveryError, nvml.NVMLError) as exc:
            self._log.warning("NVIDIA driver answers but discovery failed", error=str(exc))
            self._quiet("nvmlShutdown")
            self._initialised = False
            return
        away = self._clock() - self.outage.since
        changes = self._apply(found, republish=False)
        if changes is None:
            return
        _unmark(self._board, sorted(self._marked), CONDITION_KIND)  # the one republish
        self._marked.clear()
        with self._lock:
            self._outage = Outage()
        self._delay = self._backoff_s
        if self._metrics is not None:
            self._metrics.available.set(1)
        self._log.info(
            "NVIDIA driver is back; GPUs schedulable again",
            away_s=round(away, 2),
            driver_version=_version(found),
            vanished=[g.uuid for g in changes.vanished],
            added=[g.uuid for g in changes.added],
        )
        self._tell(self.outage)

    # --- rediscovery ------------------------------------------------------------------------------
    def _rescan(self) -> None:
        self._rescan_due = self._clock() + self._rescan_s
        try:
            found = self._discover()
        except (backend.DiscoveryError, nvml.NVMLError) as exc:
            reason = driver_gone(exc.__cause__ or exc)
            if reason is not None:
                self._enter(exc.__cause__ or exc)
                return
            self._log.warning("GPU rediscovery failed", error=str(exc))
            if self._metrics is not None:
                self._metrics.rediscoveries.labels("failed").inc()
            return
        self._apply(found)

    def _apply(
        self, found: model.NodeDevices, *, republish: bool = True
    ) -> rediscovery.Changes | None:
        """Hand over what changed (``republish``: and have it published now; else a board
        change follows that republishes); None when the handler failed (retried later)."""
        changes = rediscovery.compare(self.devices, found, hidden=self._hidden)
        now = rediscovery.merged(self.devices, found, changes)
        if self._metrics is not None:
            self._metrics.rediscoveries.labels("changed" if changes.any else "unchanged").inc()
        if changes.any:
            self._log.info(
                "GPUs changed under the running agent",
                vanished=[g.uuid for g in changes.vanished],
                added=[g.uuid for g in changes.added],
                changed=list(changes.changed),
                driver_version=list(changes.driver_version or ()),
            )
            try:
                self._on_devices(now, changes, republish)
            except Exception as exc:
                self._log.error("cannot apply the rediscovered GPUs", error=repr(exc))
                return None
        self.devices = now
        self._count = len(found.gpus)
        return changes

    def _tell(self, outage: Outage) -> None:
        try:
            self._on_outage(outage)
        except Exception as exc:
            self._log.error("driver outage handler failed", error=repr(exc))

    def _quiet(self, name: str) -> None:
        try:
            getattr(self._api, name)()
        except nvml.NVMLError as exc:
            self._log.debug(f"{name} failed", error=nvml.describe(exc))


def _uuids(devices: model.NodeDevices) -> list[str]:
    return [g.uuid for g in devices.gpus]


def _version(devices: model.NodeDevices) -> str:
    return next((g.driver_version for g in devices.gpus if g.driver_version), "")


def _mark(board: health.HealthBoard, uuids: Iterable[str], condition: health.Condition) -> None:
    """Add ``condition`` to what each UUID has (the health watcher's conditions stay), in one
    board change: one republish for the whole node."""
    wanted = tuple(uuids)

    def change(
        now: Mapping[str, tuple[health.Condition, ...]],
    ) -> dict[str, list[health.Condition]]:
        return {
            u: [*(c for c in now.get(u, ()) if c.kind != condition.kind), condition] for u in wanted
        }

    board.update_many(change)


def _unmark(board: health.HealthBoard, uuids: Iterable[str], kind: str) -> None:
    wanted = tuple(uuids)

    def change(
        now: Mapping[str, tuple[health.Condition, ...]],
    ) -> dict[str, list[health.Condition]]:
        return {u: [c for c in now.get(u, ()) if c.kind != kind] for u in wanted}

    board.update_many(change)


def marked(board: health.HealthBoard, uuids: Iterable[str]) -> list[str]:
    """The ``uuids`` the board has the driver condition on (tests, ``discover``)."""
    snap = board.snapshot()
    return [u for u in uuids if any(c.kind == CONDITION_KIND for c in snap.conditions.get(u, ()))]
