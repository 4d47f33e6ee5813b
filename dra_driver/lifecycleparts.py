"""The node agent's part in driver upgrades and GPU hot-plug: the driver watch, wired to the rest.

Why it exists apart from :mod:`dra_driver.driverwatch`: the watch only notices (the driver away,
back, GPUs changed); this module says what the agent then does, part by part, so ``app.run``
gains one call (docs/lifecycle.md):

* while the driver is away: prepares of new claims are refused with one retryable error
  (:data:`~dra_driver.driverwatch.DRIVER_GONE_MESSAGE`; claims already prepared still answer
  from their records), ``/readyz`` is false with the reason under ``nvidia_driver``, the health
  watcher is stopped (it holds NVML), the slices carry the outage's taint;
* when the GPUs change (the driver returned, a GPU vanished or was hot-added): the slices are
  rebuilt from the new devices, the preparable devices follow them (a device a prepared claim
  still holds on a vanished GPU stays known, refused to new claims, so unprepare works), the
  Node's labels and the health watcher restart on the new devices, and each prepared claim
  whose GPU vanished (or whose static MIG device an admin destroyed) is reported: a warning
  naming the claim, a ``Ready=False`` condition (reason ``GpuVanished``) in its
  ``status.devices`` and a Warning Event on it (:mod:`~dra_driver.driver.claimevents`). It is
  never re-prepared elsewhere.

On fake nodes it also answers the health socket's ``lifecycle`` op, through which
``dra-driver fake-event --driver-unload`` and friends change the fake driver and GPUs.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from dra_driver import driverwatch, health_server, logs, nodehealth
from dra_driver import metrics as metrics_mod
from dra_driver.devices import health, model, rediscovery
from dra_driver.driver import claimevents, claims, claimstatus, inventory, vanished
from dra_driver.driver import driver as driver_mod
from dra_driver.kube import api as kube
from dra_driver.pluginsettings import PluginSettings
from dra_driver.slices import nodepublisher, republish, serverfeatures, taints
from dra_driver.watcherparts import follow_outage as follow_outage
from dra_driver.watcherparts import restart_watcher as restart_watcher

READINESS_CONDITION = "nvidia_driver"
VANISHED_REASON = vanished.REASON


class DriverGone(claims.ClaimError):
    """A prepare refused while the NVIDIA driver is away (the kubelet retries it)."""


class Slot:
    """A part that is replaced when the GPUs change (the Node labeller); :meth:`stop` stops
    whichever is current."""

    def __init__(self, part: Any) -> None:
        self.part = part
        self._lock = threading.Lock()

    def replace(self, part: Any) -> None:
        with self._lock:
            old, self.part = self.part, part
        if old is not None:
            old.stop()

    def stop(self) -> None:
        with self._lock:
            part, self.part = self.part, None
        if part is not None:
            part.stop()


@dataclasses.dataclass
class Lifecycle:
    """The agent's reactions; :func:`start` builds it around a running :class:`DriverWatch`."""

    settings: PluginSettings
    board: health.HealthBoard
    driver: driver_mod.Driver
    node_health: nodehealth.NodeHealth
    publisher: nodepublisher.NodePublisher | None
    labels: Slot
    api: kube.KubeApi
    log: structlog.typing.FilteringBoundLogger
    metrics: metrics_mod.DriverMetrics
    start_labels: Any  # (devices) -> the new labeller or None
    features: serverfeatures.ServerFeatures | None = None
    watch: driverwatch.DriverWatch | None = None
    follow: Any = None  # the health stream and GPU metrics (inventoryfollow.Followers)
    vanished_reported: set[str] = dataclasses.field(default_factory=set)

    # --- the prepare gate ----------------------------------------------------------------------
    def gate(self, ref: claims.ClaimRef) -> None:
        watch = self.watch
        if watch is None or not watch.outage.gone:
            return
        if self.driver.state.store.get(ref.uid) is not None:
            return  # prepared already: its record answers, no NVML needed
        raise DriverGone(f"{ref}: {driverwatch.DRIVER_GONE_MESSAGE}; retry later")

    # --- the driver away and back ----------------------------------------------------------------
    def outage_changed(self, outage: driverwatch.Outage) -> None:
        follow_outage(
            self.node_health,
            outage,
            restart=lambda: self._start_watcher(self.watch.devices) if self.watch else None,
        )
        if self.follow is not None:
            self.follow.outage_changed(outage)

    # --- the GPUs changed ------------------------------------------------------------------------
    def devices_changed(
        self, devices: model.NodeDevices, changes: rediscovery.Changes, republish_now: bool
    ) -> None:
        before = self.driver.state.devices
        self._swap_inventory(devices, changes, before)
        if self.follow is not None:
            self.follow.devices_changed(devices)
        features = self.features
        if self.publisher is not None and self.publisher.follower is not None:
            self.publisher.follower.set_rebuild(
                republish.rebuilder(
                    devices,
                    node_name=self.settings.node_name,
                    driver_name=self.settings.driver_name,
                    dynamic_mig=self.settings.dynamic,
                    shareable=self.settings.shareable,
                    gpu_sets=self.settings.gpu_sets,
                    kept=(lambda: features.kept) if features is not None else None,
                ),
                observe=republish.gauges(devices, self.metrics),
                now=republish_now,
            )
        self.labels.replace(self.start_labels(devices))
        if self.node_health.watcher is not None or not (self.watch and self.watch.outage.gone):
            self._start_watcher(devices)
        self._report_vanished(changes, before)

    def _swap_inventory(
        self, devices: model.NodeDevices, changes: rediscovery.Changes, before: inventory.Inventory
    ) -> None:
        mig_minors = None if self.settings.fake else inventory.read_mig_minors()
        built = inventory.build(devices, mig_minors=mig_minors, dynamic=self.settings.dynamic)
        gone = {g.uuid for g in changes.vanished}
        destroyed = {m.uuid for m in changes.mig_destroyed}
        kept = dict(built.devices)
        for record in self.driver.state.store.records():
            for dev in record.devices:
                old = before.devices.get(dev.deviceName)
                if old is None or dev.deviceName in kept:
                    continue
                problem = f"its GPU vanished from this node ({old.uuid})"
                if old.uuid in destroyed:
                    problem = f"its MIG device was destroyed behind the driver's back ({old.uuid})"
                kept[dev.deviceName] = dataclasses.replace(old, problem=problem)
        for name, known in list(kept.items()):
            if known.uuid in gone and not known.problem:
                kept[name] = dataclasses.replace(known, problem="its GPU vanished from this node")
        now = dataclasses.replace(built, devices=kept)
        state = self.driver.state
        state.devices = now
        state.metadata.devices = now
        if self.driver.status is not None:
            self.driver.status.devices = now
            self.driver.status.gpus = claimstatus.gpu_facts(devices)
        uuids = taints.published_uuids(
            devices,
            node_name=self.settings.node_name,
            driver_name=self.settings.driver_name,
            dynamic_mig=self.settings.dynamic,
        )
        state.device_taints = taints.lookup(self.board, uuids, self.settings.driver_name)

    def _start_watcher(self, devices: model.NodeDevices) -> None:
        uuids = taints.published_uuids(
            devices,
            node_name=self.settings.node_name,
            driver_name=self.settings.driver_name,
            dynamic_mig=self.settings.dynamic,
        )
        restart_watcher(
            self.node_health,
            devices,
            published={u for each in uuids.values() for u in each},
            enabled=self.settings.health.enabled,
            nvml_api=self._nvml_api,
            metrics=self.metrics,
            log=self.log.bind(component="health"),
        )

    _nvml_api: Any = None

    def _report_vanished(self, changes: rediscovery.Changes, before: inventory.Inventory) -> None:
        if not changes.vanished and not changes.mig_destroyed:
            return
        events: list[tuple[claims.ClaimRef, list[claimevents.Loss]]] = []
        for record in self.driver.state.store.records():
            losses = vanished.losses(record, before, changes)
            if not losses or record.uid in self.vanished_reported:
                continue
            self.vanished_reported.add(record.uid)
            lost = [x.device for x in losses]
            ref = claims.ClaimRef(uid=record.uid, namespace=record.namespace, name=record.name)
            clog = logs.claim_logger(self.log, uid=ref.uid, namespace=ref.namespace, name=ref.name)
            if all(x.mig for x in losses):
                clog.warning(
                    "a prepared claim's MIG device was destroyed behind the driver's back; "
                    "the claim is not re-prepared elsewhere",
                    devices=lost,
                    uuids=[u for x in losses for u in x.uuids],
                )
            else:
                clog.warning(
                    "a prepared claim's GPU vanished; the claim is not re-prepared elsewhere",
                    devices=lost,
                )
            if self.driver.status is not None:  # queued behind its prepare's own status write
                self.driver.status.lost(ref, set(lost))
            else:
                vanished.report(
                    self.api, self.settings.driver_name, ref, record, set(lost), self.log
                )
            events.append((ref, losses))
        claimevents.emit_soon(  # in a thread: the driver watch never waits on the server
            self.api,
            events,
            driver_name=self.settings.driver_name,
            node_name=self.settings.node_name,
            action=claimevents.ACTION_RUNTIME,
            log=self.log,
        )

    def handle(self, req: Mapping[str, Any]) -> dict[str, Any]:
        rescan = self.watch.rescan_soon if self.watch is not None else None
        answer: dict[str, Any] = fake_lifecycle(self.node_health, self.log, rescan)(req)
        return answer


def fake_lifecycle(
    node_health: nodehealth.NodeHealth,
    log: structlog.typing.FilteringBoundLogger,
    rescan: Callable[[], None] | None = None,
) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    """The health socket's ``lifecycle`` op: the fake node's driver and GPUs change (what
    ``dra-driver fake-event --driver-unload`` and friends send); refused on real GPUs."""

    def handle(req: Mapping[str, Any]) -> dict[str, Any]:
        fake = node_health.fake
        if fake is None:
            return {
                "ok": False,
                "error": "this node agent runs real GPUs: lifecycle events refused",
            }
        action = req.get("action")
        try:
            if action == "driver-unload":
                fake.unload(str(req.get("mode") or "not-loaded"), rmmod=bool(req.get("rmmod")))
                message = f"NVIDIA driver unloaded ({req.get('mode') or 'not-loaded'})"
            elif action == "driver-load":
                version = req.get("driverVersion")
                fake.load(driver_version=str(version) if version else None)
                message = f"NVIDIA driver loaded ({fake.profile.driver_version})"
            elif action == "gpu-remove":
                gpu = req.get("gpu")
                if not isinstance(gpu, int) or isinstance(gpu, bool):
                    return {"ok": False, "error": f"gpu {gpu!r}: an NVML index is required"}
                message = f"GPU {gpu} ({fake.remove_gpu(gpu)}) removed from the bus"
            elif action == "gpu-add":
                like = req.get("like")
                index, uuid = fake.add_gpu(
                    like=like if isinstance(like, int) else None,
                    uuid=str(req["uuid"]) if req.get("uuid") else None,
                    pci_bus_id=str(req["pciBusId"]) if req.get("pciBusId") else None,
                )
                message = f"GPU {index} ({uuid}) added to the bus"
            elif action == "mig-destroy":
                gpu, gi = req.get("gpu"), req.get("gpuInstance")
                if not all(isinstance(v, int) and not isinstance(v, bool) for v in (gpu, gi)):
                    return {"ok": False, "error": "mig-destroy needs gpu and gpuInstance numbers"}
                gone = fake.destroy_mig(int(str(gpu)), int(str(gi)))
                message = f"GPU {gpu}: GPU instance {gi} destroyed ({', '.join(gone)})"
                if rescan is not None:  # no count changes: the fake asks for the rescan
                    rescan()  # a GPU node finds it at the periodic one (docs/lifecycle.md)
            else:
                return {"ok": False, "error": f"unknown lifecycle action {action!r}"}
        except (ValueError, KeyError) as exc:
            return {"ok": False, "error": str(exc)}
        # Not waking the watch: the agent finds the change as on a GPU node, at its next poll.
        log.info("fake driver lifecycle event", action=str(action), detail=message)
        return {"ok": True, "message": message}

    return handle


def start(
    settings: PluginSettings,
    *,
    backend: Any,
    devices: model.NodeDevices,
    board: health.HealthBoard,
    driver: driver_mod.Driver,
    node_health: nodehealth.NodeHealth,
    publisher: nodepublisher.NodePublisher | None,
    labels: Slot,
    start_labels: Any,
    readiness: health_server.Readiness,
    api: kube.KubeApi,
    log: structlog.typing.FilteringBoundLogger,
    metrics: metrics_mod.DriverMetrics,
    features: serverfeatures.ServerFeatures | None = None,
    discover: Callable[[], model.NodeDevices] | None = None,
    hidden: rediscovery.Hidden = rediscovery.never_hidden,
    follow: Any = None,
    make_watch: Callable[..., driverwatch.DriverWatch] = driverwatch.DriverWatch,
) -> driverwatch.DriverWatch | None:
    """Start watching the driver (None: the backend has no NVML module to watch).

    ``discover`` rediscovers the node as the agent models it (default: the backend's own; the
    agent marks the GPUs it offers for passthrough on top); ``hidden(uuid)``: a GPU NVML does
    not see on purpose (on vfio-pci for a VM claim), kept as it was, never withdrawn as gone.
    """
    nvml_api = getattr(backend, "nvml_api", None)
    if nvml_api is None:
        return None
    parts = Lifecycle(
        settings=settings,
        board=board,
        driver=driver,
        node_health=node_health,
        publisher=publisher,
        labels=labels,
        api=api,
        log=log.bind(component="driver-watch"),
        metrics=metrics,
        start_labels=start_labels,
        features=features,
        follow=follow,
    )
    parts._nvml_api = nvml_api
    watch = make_watch(  # driverrelease.Release.make_watch: one that can release NVML
        api=nvml_api,
        discover=discover or backend.discover,
        devices=devices,
        hidden=hidden,
        board=board,
        log=parts.log,
        on_devices=parts.devices_changed,
        on_outage=parts.outage_changed,
        metrics=driverwatch.Metrics(metrics.registry),
        poll_s=settings_value(settings, "driver_poll_s", 0.5),
        rescan_s=settings_value(settings, "rescan_s", 30.0),
    )
    parts.watch = watch
    driver.gate = parts.gate
    node_health.lifecycle = parts.handle
    readiness.add_condition(
        READINESS_CONDITION, watch.available, reason=lambda: watch.outage.message()
    )
    watch.start()
    return watch


def settings_value(settings: PluginSettings, name: str, default: float) -> float:
    """A lifecycle setting when the settings carry it (new fields), else its default."""
    value = getattr(settings, name, None)
    return float(value) if value is not None else default
