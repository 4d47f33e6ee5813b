"""Between what the watcher sees and what the board says: hold times, quiet periods, recoveries.

Why it exists: raw signals flap — an XID storm, a GPU that answers between two failures, a reset
that is followed by the same fault. The board (and with it the slices' taints, the kubelet's
health streams and the node labels) must change only when the state really changed. For each
GPU or MIG UUID this keeps the current conditions (:class:`~.healthpolicy.Finding`) and applies
the rules of docs/health.md:

* A condition ends only as its finding allows: a polled check passing again, an observed reset,
  an explicit recovered event, or the quiet period of a recoverable XID.
* Once unhealthy, a UUID stays unhealthy for at least the hold time, which doubles with each
  earlier recovery of that UUID (the recovery counter), up to the maximum: an ending that comes
  earlier is deferred, not dropped, and a new finding cancels it.
* A repeated finding refreshes the condition (and its quiet period) without a board change.

Every board change is logged once, naming the device, UUID, XID and what it means (taint or
untaint, NVML's recovery action). All entry points are thread-safe; time is injectable.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

import structlog

from dra_driver import records
from dra_driver.devices import health, healthpolicy

Clock = Callable[[], float]


@dataclasses.dataclass(slots=True)
class _Held:
    finding: healthpolicy.Finding
    last_seen: float


@dataclasses.dataclass(slots=True)
class _Entry:
    since: float
    hold_until: float
    held: dict[str, _Held] = dataclasses.field(default_factory=dict)
    ending: dict[str, str] = dataclasses.field(default_factory=dict)  # kind → why it may end


@records.record
class Status:
    """One UUID's health as the tracker sees it (``discover`` and the control socket show it)."""

    uuid: str
    name: str
    healthy: bool
    conditions: tuple[health.Condition, ...]
    recoveries: int
    unhealthy_for_s: float = 0.0
    hold_left_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "uuid": self.uuid,
            "device": self.name,
            "health": health.HEALTHY if self.healthy else health.UNHEALTHY,
            "conditions": [dataclasses.asdict(c) for c in self.conditions],
            "recoveries": self.recoveries,
            "unhealthyForSeconds": round(self.unhealthy_for_s, 1),
            "holdLeftSeconds": round(self.hold_left_s, 1),
        }


class Tracker:
    """Turns findings and recoveries into board changes; see the module docstring."""

    def __init__(
        self,
        *,
        board: health.HealthBoard,
        policy: healthpolicy.HealthPolicy,
        names: Mapping[str, str],
        log: structlog.typing.FilteringBoundLogger,
        clock: Clock = time.monotonic,
        on_recovered: Callable[[str], None] | None = None,
        paused: Callable[[str], bool] | None = None,
    ) -> None:
        """``names``: UUID → published device name (``gpu-3``), for logs and status;
        ``paused(uuid)``: what is seen about that GPU now is ignored (passed through to a VM:
        NVML cannot see it, :mod:`dra_driver.devices.passedthrough`)."""
        self.board = board
        self.policy = policy
        self.names = dict(names)
        self.log = log
        self.clock = clock
        self._on_recovered = on_recovered
        self._paused = paused
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._recoveries: dict[str, int] = {}

    def update(
        self,
        uuid: str,
        *,
        found: Iterable[healthpolicy.Finding] = (),
        passed: Collection[str] = (),
        reset: bool = False,
        explicit: bool = False,
    ) -> None:
        """Apply what was just seen about ``uuid``: new or repeated ``found`` conditions,
        polled checks that ``passed``, an observed ``reset``, an ``explicit`` recovered event."""
        if self._paused is not None and self._paused(uuid):
            return  # on vfio-pci for a VM: NVML's silence or errors say nothing about it
        with self._lock:
            now = self.clock()
            entry = self._entries.get(uuid)
            fresh = list(found)
            for finding in fresh:
                if entry is None:
                    hold = self.policy.hold_s(self._recoveries.get(uuid, 0))
                    entry = self._entries[uuid] = _Entry(since=now, hold_until=now + hold)
                old = entry.held.get(finding.kind)
                merged = finding if old is None else _merge(old.finding, finding)
                entry.held[finding.kind] = _Held(finding=merged, last_seen=now)
                entry.ending.pop(finding.kind, None)
            if entry is None:
                return
            kinds = {f.kind for f in fresh}
            for kind, held in entry.held.items():
                check = held.finding.check
                if kind in kinds:
                    continue
                if check is not None and check in passed:
                    entry.ending[kind] = f"{check} check passed"
                elif check is None and (reset or explicit):
                    entry.ending[kind] = "explicit recovered event" if explicit else "GPU reset"
            self._settle(uuid, entry, now)

    def tick(self) -> None:
        """End what the quiet period or the hold time allows by now (call it every second)."""
        with self._lock:
            now = self.clock()
            for uuid, entry in list(self._entries.items()):
                for kind, held in entry.held.items():
                    quiet = self.policy.quiet_period_s
                    if held.finding.quiet and now - held.last_seen >= quiet:
                        entry.ending.setdefault(kind, f"quiet for {quiet:g}s")
                if entry.ending:
                    self._settle(uuid, entry, now)

    def status(self) -> list[Status]:
        """Every UUID this tracker knows a name for, in name order."""
        with self._lock:
            now = self.clock()
            out = []
            for uuid, name in self.names.items():
                entry = self._entries.get(uuid)
                conditions = _conditions(entry) if entry else ()
                out.append(
                    Status(
                        uuid=uuid,
                        name=name,
                        healthy=not conditions,
                        conditions=conditions,
                        recoveries=self._recoveries.get(uuid, 0),
                        unhealthy_for_s=now - entry.since if entry else 0.0,
                        hold_left_s=max(0.0, entry.hold_until - now) if entry else 0.0,
                    )
                )
            return sorted(out, key=lambda s: s.name)

    def recoveries(self, uuid: str) -> int:
        with self._lock:
            return self._recoveries.get(uuid, 0)

    # --- internals (lock held) -------------------------------------------------------------------
    def _settle(self, uuid: str, entry: _Entry, now: float) -> None:
        before = self.board.snapshot().conditions.get(uuid, ())
        ended: dict[str, str] = {}
        gone: list[healthpolicy.Finding] = []
        if entry.ending and now >= entry.hold_until:
            ended, entry.ending = dict(entry.ending), {}
            gone = [entry.held.pop(kind).finding for kind in ended if kind in entry.held]
        elif entry.ending:
            self.log.debug(
                "GPU recovery held",
                gpu=self.names.get(uuid, uuid),
                uuid=uuid,
                ending=sorted(entry.ending),
                hold_left_s=round(entry.hold_until - now, 3),
            )
        conditions = _conditions(entry)
        if not conditions:
            del self._entries[uuid]
            self._recoveries[uuid] = self._recoveries.get(uuid, 0) + 1
        if not self.board.set_conditions(uuid, conditions):
            return
        self._log_change(uuid, entry, before, conditions, ended, gone, now)
        if not conditions and self._on_recovered is not None:
            self._on_recovered(uuid)

    def _log_change(
        self,
        uuid: str,
        entry: _Entry,
        before: tuple[health.Condition, ...],
        after: tuple[health.Condition, ...],
        ended: Mapping[str, str],
        gone: list[healthpolicy.Finding],
        now: float,
    ) -> None:
        findings = [h.finding for h in entry.held.values()] or gone
        xid = next((f.xid for f in findings if f.xid is not None), None)
        fields: dict[str, Any] = {
            "gpu": self.names.get(uuid, uuid),
            "uuid": uuid,
            "xid": xid,
            "nvml_action": next((f.action for f in findings if f.action), "") or None,
        }
        if not after:
            self.log.info(
                "device healthy again",
                **fields,
                action="untaint",
                cause=", ".join(sorted(set(ended.values()))),
                recoveries=self._recoveries.get(uuid, 0),
                unhealthy_s=round(now - entry.since, 3),
            )
            return
        effect = healthpolicy.NONE
        for condition in after:
            effect = healthpolicy.stronger(effect, condition.effect)
        self.log.warning(
            "device unhealthy" if not before else "device health changed",
            **fields,
            action=f"taint {effect}",
            conditions=[f"{c.kind}={c.value}" for c in after],
            reason="; ".join(c.message for c in after),
            ended=sorted(ended) or None,
            hold_s=round(entry.hold_until - entry.since, 3),
        )


def _merge(old: healthpolicy.Finding, new: healthpolicy.Finding) -> healthpolicy.Finding:
    """A repeat or a new value of the same kind: the latest value, the strongest effect, and
    the quiet period only if every occurrence allowed it."""
    effect = healthpolicy.stronger(old.condition.effect, new.condition.effect)
    return dataclasses.replace(
        new,
        condition=dataclasses.replace(new.condition, effect=effect),
        quiet=old.quiet and new.quiet,
        action=new.action or old.action,
        xid=new.xid if new.xid is not None else old.xid,
    )


def _conditions(entry: _Entry) -> tuple[health.Condition, ...]:
    return tuple(entry.held[k].finding.condition for k in sorted(entry.held))
