"""GPU health for one node agent (DRA or device plugin): watcher, tracker, metrics, health socket.

Why it exists: both agents need the same health machinery around their :class:`HealthBoard`, and
their composition roots (:mod:`dra_driver.app`, ``cli/device_plugin.py``) should only say *where*
it runs. :func:`start` builds the tracker (:mod:`dra_driver.devices.healthtracker`) and the NVML
watcher (:mod:`dra_driver.devices.watcher`) over the backend's NVML module — the real pynvml or
the fake node's stand-in — keeps ``dra_driver_device_health`` in step with the board, and serves
the health socket (:mod:`dra_driver.healthcontrol`) through which ``discover`` reads the health
and ``fake-event`` makes fake GPUs fail. :func:`probe` is the one-shot check ``discover`` runs
when no agent is asked.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from dra_driver import healthcontrol, logs
from dra_driver import metrics as metrics_mod
from dra_driver.devices import health, healthpolicy, healthtracker, model, watcher

if TYPE_CHECKING:  # the fake backend is loaded only where --fake asks for it (docs/fleet.md)
    from dra_driver.devices.fake import fakenvml

_FAKE_NVML = "dra_driver.devices.fake.fakenvml"

# What ``fake-event`` can do to a fake GPU (the "event" of an inject request).
FAKE_EVENTS = (
    "xid",
    "ecc-dbe",
    "lost",
    "recovered",
    "reset",
    "pages-pending",
    "remap-pending",
    "remap-failure",
    "fabric-degraded",
)
_FAULT_FIELDS = {
    "pages-pending": "pages_pending",
    "remap-pending": "remap_pending",
    "remap-failure": "remap_failure",
    "fabric-degraded": "fabric_degraded",
}
_ACTIONS = {name: code for code, name in healthpolicy.RECOVERY_ACTIONS.items()}


def device_names(devices: model.NodeDevices) -> dict[str, str]:
    """GPU and MIG UUID → published device name."""
    names = {}
    for gpu in devices.gpus:
        names[gpu.uuid] = gpu.name
        for mig in gpu.mig_devices:
            names[mig.uuid] = model.mig_device_name(gpu, mig)
    return names


@dataclasses.dataclass
class NodeHealth:
    """The running health machinery of one agent; :meth:`stop` it on shutdown."""

    board: health.HealthBoard
    devices: model.NodeDevices
    tracker: healthtracker.Tracker
    watcher: watcher.Watcher | None
    fake: fakenvml.FakeNvml | None
    control: healthcontrol.ControlServer | None = None
    log: structlog.typing.FilteringBoundLogger = dataclasses.field(
        default_factory=lambda: logs.get("health")
    )
    _unsubscribe: Any = None
    # Answers ``{"op": "lifecycle", ...}`` (the driver and GPUs of a fake node, driverwatch).
    lifecycle: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    # Answers ``nvml-release`` / ``nvml-resume`` (dra_driver.driverrelease).
    release: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None

    def stop(self) -> None:
        if self.control is not None:
            self.control.stop()
        if self.watcher is not None:
            self.watcher.stop()
        if self._unsubscribe is not None:
            self._unsubscribe()

    # --- the health socket ---------------------------------------------------------------------
    def handle(self, req: Mapping[str, Any]) -> dict[str, Any]:
        op = req.get("op")
        if op == "status":
            answer = {
                "ok": True,
                "fake": self.fake is not None,
                "watching": self.watcher is not None,
                "devices": [s.to_dict() for s in self.tracker.status()],
            }
            if self.fake is not None:  # what the fake kernel counts (rmmod needs 0)
                answer.update(nvmlInits=self.fake.open_inits, nvmlInitCalls=self.fake.init_calls)
            return answer
        if op == "inject":
            return self._inject(req)
        if op == "lifecycle" and self.lifecycle is not None:
            return self.lifecycle(req)
        if op in ("nvml-release", "nvml-resume") and self.release is not None:
            return self.release(req)
        return {"ok": False, "error": f"unknown op {op!r}: use status or inject"}

    def _inject(self, req: Mapping[str, Any]) -> dict[str, Any]:
        if self.fake is None:
            return _refuse("this node agent watches real GPUs: fake events are refused")
        if self.watcher is None:
            return _refuse("GPU health checks are off in this node agent (--health-checks off)")
        gpu, event = req.get("gpu"), req.get("event")
        indices = [g.index for g in self.devices.gpus]
        if not isinstance(gpu, int) or isinstance(gpu, bool) or gpu not in indices:
            return _refuse(f"no GPU {gpu!r} on this fake node (GPUs: {_ranges(indices)})")
        if event not in FAKE_EVENTS:
            return _refuse(f"unknown event {event!r}: one of {', '.join(FAKE_EVENTS)}")
        uuid = self.devices.gpu(gpu).uuid
        fake, done = self.fake, f"GPU {gpu} ({uuid}): {event}"
        delivered: int | None = None
        if event == "xid":
            xid, action = req.get("xid"), req.get("action")
            if not isinstance(xid, int) or isinstance(xid, bool) or xid <= 0:
                return _refuse(f"xid {xid!r}: a positive XID number is required")
            if action is not None and action not in _ACTIONS:
                return _refuse(f"action {action!r}: one of {', '.join(_ACTIONS)}")
            instances = _instances(req)
            if isinstance(instances, str):
                return _refuse(instances)
            delivered = fake.inject_xid(
                gpu,
                xid,
                gpu_instance=instances[0],
                compute_instance=instances[1],
                action=None if action is None else _ACTIONS[action],
            )
            done = f"GPU {gpu} ({uuid}): XID {xid}"
            done += f", recovery action {action}" if action else ""
        elif event == "ecc-dbe":
            instances = _instances(req)
            if isinstance(instances, str):
                return _refuse(instances)
            delivered = fake.inject_ecc_dbe(
                gpu, gpu_instance=instances[0], compute_instance=instances[1]
            )
        elif event == "lost":
            fake.lose(gpu)
        elif event == "recovered":
            fake.reset(gpu)
            self.watcher.recovered(uuid)
        elif event == "reset":
            fake.reset(gpu)
            self.watcher.check(uuid)  # as the next poll would, without waiting for it
        else:
            fake.set_faults(gpu, **{_FAULT_FIELDS[str(event)]: True})
            self.watcher.check(uuid)
        self.log.info("fake GPU event injected", gpu=gpu, uuid=uuid, fake_event=event)
        message = done
        if delivered == 0:
            message += " (no NVML event set watches this GPU: it is not published; ignored)"
        return {"ok": True, "message": message, "delivered": delivered}


def start(
    *,
    policy: healthpolicy.HealthPolicy,
    nvml_api: Any,
    devices: model.NodeDevices,
    published: Collection[str],
    board: health.HealthBoard,
    log: structlog.typing.FilteringBoundLogger,
    metrics: metrics_mod.DriverMetrics,
    socket: Path | None,
    paused: Callable[[str], bool] | None = None,
) -> NodeHealth:
    """Start watching ``published`` GPUs through ``nvml_api`` (None: no NVML, nothing watched)
    and serve the health socket at ``socket`` (None: no socket)."""
    names = device_names(devices)
    tracker = healthtracker.Tracker(
        board=board,
        policy=policy,
        names=names,
        log=log,
        on_recovered=lambda uuid: metrics.device_recovered(names.get(uuid, uuid)),
        paused=paused,  # GPUs passed through to VMs (dra_driver.devices.passedthrough)
    )
    watch = None
    if not policy.enabled:
        log.info("GPU health checks are off")
    elif nvml_api is None:
        log.warning("no NVML module: GPU health is not watched")
    else:
        watch = watcher.Watcher(
            api=nvml_api,
            gpus=watcher.watched_gpus(devices, published),
            tracker=tracker,
            log=log,
            observe=metrics.health_event,
            nvml_error=metrics.nvml_error,
        )
    fake = nvml_api if _is_fake(nvml_api) else None
    node = NodeHealth(
        board=board, devices=devices, tracker=tracker, watcher=watch, fake=fake, log=log
    )
    keys = health.device_keys(devices)

    def export(snap: health.Snapshot) -> None:
        for name, uuids in keys.items():
            conditions = [c for u in uuids for c in snap.conditions.get(u, ())]
            metrics.set_device_health(name, ",".join(f"{c.kind}={c.value}" for c in conditions))

    export(board.snapshot())
    node._unsubscribe = board.subscribe(export)
    if watch is not None:
        watch.start()
    if socket is not None:
        node.control = healthcontrol.ControlServer(socket, node.handle)
        try:
            node.control.start()
        except OSError as exc:
            log.error("cannot serve the health socket", socket=str(socket), error=str(exc))
            node.control = None
    return node


def _is_fake(nvml_api: Any) -> bool:
    """Whether ``nvml_api`` is the fake node's NVML stand-in: it cannot be unless the fake
    backend was loaded (by ``--fake``), so a real agent never imports it to ask."""
    loaded = sys.modules.get(_FAKE_NVML)
    return loaded is not None and isinstance(nvml_api, loaded.FakeNvml)


def probe(nvml_api: Any, devices: model.NodeDevices) -> dict[str, tuple[health.Condition, ...]]:
    """One poll of every GPU now (no events, no history): UUID → conditions NVML shows."""
    board = health.HealthBoard()
    tracker = healthtracker.Tracker(
        board=board,
        policy=healthpolicy.HealthPolicy(min_hold_s=0.0),
        names=device_names(devices),
        log=logs.get("discover"),
    )
    every = set(device_names(devices))
    watch = watcher.Watcher(
        api=nvml_api,
        gpus=watcher.watched_gpus(devices, every),
        tracker=tracker,
        log=logs.get("discover"),
    )
    nvml_api.nvmlInit()
    try:
        watch.poll()
    finally:
        nvml_api.nvmlShutdown()
    return dict(board.snapshot().conditions)


def _refuse(error: str) -> dict[str, Any]:
    return {"ok": False, "error": error}


def _instances(req: Mapping[str, Any]) -> tuple[int | None, int | None] | str:
    gi, ci = req.get("gpuInstance"), req.get("computeInstance")
    if (gi is None) != (ci is None):
        return "give both the GPU instance and the compute instance of a MIG device, or neither"
    for value in (gi, ci):
        if value is not None and (not isinstance(value, int) or value < 0):
            return f"instance id {value!r}: not a non-negative number"
    return gi, ci


def _ranges(indices: list[int]) -> str:
    return ", ".join(str(i) for i in sorted(indices))
