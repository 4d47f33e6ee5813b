"""What the API server keeps of the ResourceSlice fields we publish, and how publishing adapts.

Why it exists: a kube-apiserver with a DRA feature gate off stores a ResourceSlice without that
gate's fields and answers 201 as if all were well (:mod:`dra_driver.kube.features` probes it).
Publishing must then say less, never something false: with device taints dropped an unhealthy
GPU would stay schedulable, so it is **withdrawn** from the slices instead (with its MIG devices
and placements) until it recovers; devices that need shared counters (dynamic MIG) or consumable
capacity (GPU shares) would be allocated twice, so they are refused at start when asked for
explicitly (:func:`refusal`) and withdrawn when the server turns out to drop them later. Asked
for with ``auto:`` (``--shareable auto:all``, ``--dynamic-mig auto:H100``) they are off instead
where the server drops their fields, the selected GPUs published as plain full GPUs
(:func:`resolve` at start, :func:`publishable` for every build, re-probes included).

:class:`ServerFeatures` holds what the server keeps now (:class:`Kept`), learns it from a probe
callable at start (a failing probe: assume everything is kept, as before, and try again on the
next reconnect), re-probes when something suggests the server changed — the publisher reconnects
after an outage to a server of another version (a cheap ``GET /version`` tells; without that
callable every reconnect re-probes), the last probe failed, or a write is answered without
fields it sent — logs one line per feature found dropped, keeps the
``dra_driver_feature_enabled`` gauge and tells its subscribers (the node publisher rebuilds).
It imports no client: the composition root hands it the probe.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any, Protocol

import structlog

from dra_driver import metrics as metrics_mod
from dra_driver import records
from dra_driver.devices import migprofiles, model
from dra_driver.slices import migslices, shares

Obj = dict[str, Any]

# Feature (the gauge's label) → the kube-apiserver feature gate its fields need.
GATES: dict[str, str] = {
    "deviceTaints": "DRADeviceTaints",
    "sharedCounters": "DRAPartitionableDevices",
    "consumableCapacity": "DRAConsumableCapacity",
}
FEATURES = (*GATES, "setRanks")
DROPPED_EVENT = "API server drops the ResourceSlice fields of a feature"
KEPT_EVENT = "API server keeps the ResourceSlice fields of a feature again"
EFFECTS: dict[str, str] = {
    "deviceTaints": "unhealthy GPUs are withdrawn from the ResourceSlices instead of tainted",
    "sharedCounters": "devices that consume shared counters (dynamic MIG) are not published",
    "consumableCapacity": "shareable GPUs (consumable capacity) are not published",
}
# The effect where the flag says ``auto:``: that feature is off, nothing is withdrawn.
AUTO_EFFECTS: dict[str, str] = {
    "sharedCounters": "{flag}: dynamic MIG is off, its GPUs are published as full GPUs",
    "consumableCapacity": "{flag}: GPU shares are off, its GPUs are published as full GPUs",
}
DROPPED_RECHECK_S = 5.0  # re-probes for writes answered without fields: at most this often


class Found(Protocol):
    """What a probe reports (:class:`dra_driver.kube.features.Features`): True kept, False
    dropped, None not probed."""

    @property
    def device_taints(self) -> bool | None: ...

    @property
    def shared_counters(self) -> bool | None: ...

    @property
    def consumable_capacity(self) -> bool | None: ...


@records.record
class Kept:
    """Which gated fields the server keeps; ``probed`` false: assumed (never learnt)."""

    device_taints: bool = True
    shared_counters: bool = True
    consumable_capacity: bool = True
    probed: bool = False

    @classmethod
    def of(cls, found: Found) -> Kept:
        """From a probe; a feature not probed (None) is taken as kept."""
        return cls(
            device_taints=found.device_taints is not False,
            shared_counters=found.shared_counters is not False,
            consumable_capacity=found.consumable_capacity is not False,
            probed=True,
        )

    def keeps(self, feature: str) -> bool:
        return bool(
            {
                "deviceTaints": self.device_taints,
                "sharedCounters": self.shared_counters,
                "consumableCapacity": self.consumable_capacity,
            }.get(feature, True)
        )

    @property
    def dropped(self) -> tuple[str, ...]:
        return tuple(f for f in GATES if not self.keeps(f))


ALL_KEPT = Kept()


def refusal(
    kept: Kept,
    *,
    gpus: Collection[model.Gpu],
    dynamic_mig: migprofiles.DynamicMig,
    shareable: shares.Shareable,
    server: str = "",
) -> str:
    """Why the agent must not start with these settings on this server ("" = it may): dynamic
    MIG and GPU shares are explicit opt-ins whose fields the server would drop. An ``auto:``
    selection is never refused (:func:`resolve` turns it off)."""
    where = f"the API server {server}" if server else "the API server"
    if not kept.shared_counters and not dynamic_mig.auto and dynamic_mig.dynamic_gpus(gpus):
        return (
            f"--dynamic-mig {dynamic_mig.spec} needs shared counters, but {where} drops them "
            "(feature gate DRAPartitionableDevices is off): turn the gate on, run with "
            f"--dynamic-mig none, or with --dynamic-mig auto:{dynamic_mig.spec} (off where the "
            "server drops them)"
        )
    if (
        not kept.consumable_capacity
        and not shareable.auto
        and any(shareable.matches(g) for g in gpus)
    ):
        return (
            f"--shareable {shareable} needs consumable capacity, but {where} drops it "
            "(feature gate DRAConsumableCapacity is off): turn the gate on, run with "
            f"--shareable none, or with --shareable auto:{shareable.spec} (off where the "
            "server drops it)"
        )
    return ""


def resolve(
    kept: Kept, *, dynamic_mig: migprofiles.DynamicMig, shareable: shares.Shareable
) -> tuple[migprofiles.DynamicMig, shares.Shareable]:
    """The selections to run with on a server keeping ``kept``: an ``auto:`` one whose fields
    the server drops is off (none); every other as given (an explicit one is refused at start,
    :func:`refusal`, and withdrawn if the server drops its fields later, :func:`withdrawer`)."""
    if dynamic_mig.auto and not kept.shared_counters:
        dynamic_mig = migprofiles.STATIC
    if shareable.auto and not kept.consumable_capacity:
        shareable = shares.NONE
    return dynamic_mig, shareable


def publishable(
    kept: Kept,
    devices: model.NodeDevices,
    *,
    dynamic_mig: migprofiles.DynamicMig,
    shareable: shares.Shareable,
) -> tuple[model.NodeDevices, migprofiles.DynamicMig, shares.Shareable]:
    """What to build the slices from on a server keeping ``kept`` (every build: at start and
    after each re-probe): :func:`resolve`'s selections, and the GPUs an ``auto:`` dynamic MIG
    selection no longer applies to as whole GPUs (as the agent, which started with them
    dynamic, prepares them) instead of their MIG state at discovery."""
    dynamic, shareable = resolve(kept, dynamic_mig=dynamic_mig, shareable=shareable)
    if dynamic_mig.auto and not kept.shared_counters:
        devices = migslices.as_whole(devices, dynamic_mig)
    return devices, dynamic, shareable


def auto_flags(
    *, dynamic_mig: migprofiles.DynamicMig, shareable: shares.Shareable
) -> dict[str, str]:
    """Feature → the ``auto:`` flag that selects it (for the "drops the fields" line)."""
    flags: dict[str, str] = {}
    if dynamic_mig.auto:
        flags["sharedCounters"] = f"--dynamic-mig {dynamic_mig.text}"
    if shareable.auto:
        flags["consumableCapacity"] = f"--shareable {shareable}"
    return flags


def withdrawer(kept: Kept) -> Callable[[list[Obj]], None] | None:
    """A ``build(decorate=...)`` pass removing the devices whose fields the server drops
    (after the taint pass); None when it keeps them all."""
    if kept.shared_counters and kept.consumable_capacity:
        return None

    def apply(devices: list[Obj]) -> None:
        devices[:] = [
            d
            for d in devices
            if (kept.shared_counters or not d.get("consumesCounters"))
            and (kept.consumable_capacity or not d.get("allowMultipleAllocations"))
        ]

    return apply


class ServerFeatures:
    """What the server keeps now, learnt by ``probe`` (None: never probe, assume all kept)."""

    def __init__(
        self,
        *,
        probe: Callable[[], Found] | None,
        log: structlog.typing.FilteringBoundLogger,
        metrics: metrics_mod.DriverMetrics | None = None,
        gpu_sets: bool = True,
        auto: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        version: Callable[[], str] | None = None,
    ) -> None:
        """``auto``: feature → the ``auto:`` flag selecting it (:func:`auto_flags`), named in
        the line saying the server drops the feature's fields (the feature is off, not
        withdrawn); ``version``: the server's version now (``gitVersion``), asked on a
        reconnect: the same as at the last probe, no re-probe (a fleet of agents reconnecting
        after an API server restart would otherwise each send two dry-run creates)."""
        self._probe = probe
        self._version = version
        self._probed_version = ""  # the server's version at the last successful probe
        self._auto = dict(auto or {})
        self._log = log
        self._metrics = metrics
        self._clock = clock
        self._lock = threading.Lock()
        self._probing = threading.Lock()
        self._kept = ALL_KEPT
        self._last_dropped_probe: float | None = None
        self._subscribers: list[Callable[[Kept], None]] = []
        self.probes = 0  # probes run (tests)
        if metrics is not None:
            metrics.set_feature("setRanks", gpu_sets)
            for feature in GATES:
                metrics.set_feature(feature, True)

    @property
    def kept(self) -> Kept:
        with self._lock:
            return self._kept

    def subscribe(self, listener: Callable[[Kept], None]) -> None:
        """``listener(kept)`` on every change learnt by a re-probe."""
        with self._lock:
            self._subscribers.append(listener)

    def start(self) -> Kept:
        """The first probe (before the first publish); returns what the server keeps."""
        self.reprobe("start")
        return self.kept

    def reprobe(self, reason: str) -> None:
        """Probe again; log, count and tell the subscribers what changed. A failing probe
        changes nothing (logged)."""
        if self._probe is None:
            return
        with self._probing:
            try:
                found = self._probe()
            except Exception as exc:
                self._log.warning(
                    "cannot learn which ResourceSlice fields the API server keeps; "
                    "publishing as if it kept them all",
                    reason=reason,
                    error=str(exc),
                )
                return
            self.probes += 1
            self._probed_version = str(getattr(found, "server_version", "") or "")
            now = Kept.of(found)
            with self._lock:
                before, self._kept = self._kept, now
                listeners = list(self._subscribers)
        for feature in GATES:
            if self._metrics is not None:
                self._metrics.set_feature(feature, now.keeps(feature))
            if not now.keeps(feature) and (before.keeps(feature) or not before.probed):
                self._log.warning(
                    "API server drops the ResourceSlice fields of a feature",
                    feature=feature,
                    gate=GATES[feature],
                    effect=(
                        AUTO_EFFECTS[feature].format(flag=self._auto[feature])
                        if feature in self._auto
                        else EFFECTS[feature]
                    ),
                    reason=reason,
                )
            elif now.keeps(feature) and not before.keeps(feature):
                self._log.info(
                    "API server keeps the ResourceSlice fields of a feature again",
                    feature=feature,
                    gate=GATES[feature],
                    reason=reason,
                )
        if dataclasses.replace(now, probed=False) != dataclasses.replace(before, probed=False):
            for listener in listeners:
                try:
                    listener(now)
                except Exception as exc:  # a listener never stops the others
                    self._log.error("server feature listener failed", error=repr(exc))

    def reconnected(self) -> None:
        """The publisher reached the server again after an outage: it may be another one —
        unless it answers with the version the last probe saw."""
        if self._version is not None and self._probed_version and self.kept.probed:
            try:
                version = self._version()
            except Exception as exc:
                self._log.info("API server version unknown; not re-probing", error=str(exc))
                return  # unreachable again: the next reconnect asks again
            if version == self._probed_version:
                return
        self.reprobe("reconnect")

    def fields_dropped(self, slice_name: str, fields: list[str]) -> None:
        """A write was answered with an object lacking ``fields`` we sent."""
        self._log.warning(
            "API server stored a ResourceSlice without fields we sent",
            slice=slice_name,
            fields=fields,
        )
        now = self._clock()
        last = self._last_dropped_probe
        if last is not None and now - last < DROPPED_RECHECK_S:
            return
        self._last_dropped_probe = now
        self.reprobe("fields dropped")
