"""Device health both agents report: a versioned set of unhealthy UUIDs and why.

Why: the device plugin's ListAndWatch and the DRA health stream (``NodeWatchResources``) must
resend the full device list whenever a GPU turns unhealthy *or* healthy again, the slice
publisher must re-publish with device taints, and several streams (one per resource or API
version, a new one after every kubelet restart) watch the same facts. A :class:`HealthSource`
gives them a snapshot plus a blocking "wait until it changed"; whatever detects health (the NVML
watcher, :mod:`dra_driver.devices.watcher`, over real or fake GPUs) writes a :class:`HealthBoard`.
Keyed by GPU or MIG UUID; a MIG device also follows its parent GPU (:func:`device_keys`).

Change notification, for consumers that react rather than poll (slice re-publishing, node
labels): :meth:`HealthBoard.subscribe` registers a callback that is called with the new
:class:`Snapshot` after every change, in the thread that made the change, outside the board's
lock. It must return quickly (hand work to your own thread) and should not raise (exceptions are
logged and ignored). :meth:`HealthBoard.wait_changed` is the blocking alternative.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Protocol

from dra_driver import logs, records
from dra_driver.devices import model

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
_log = logs.get("health")


@records.record
class Condition:
    """One reason a GPU or MIG device is unhealthy; also what its device taint says.

    ``kind`` names the taint key under the driver's domain (``gpu.nvidia.com/<kind>``),
    ``value`` the taint value (an XID, or a short reason), ``effect`` the taint effect.
    """

    kind: str  # "xid", "ecc", "gpu-lost", "retired-pages", "row-remap", "fabric", ...
    value: str  # "79", "double-bit", "pending", ...
    effect: str  # "NoSchedule" | "NoExecute" | "None"
    message: str  # for people: the health stream's message, logs, discover


@records.record
class Snapshot:
    """The unhealthy UUIDs (with a reason each) at one version; versions only grow."""

    version: int
    unhealthy: Mapping[str, str]
    conditions: Mapping[str, tuple[Condition, ...]] = dataclasses.field(
        default_factory=lambda: MappingProxyType({})
    )

    def is_healthy(self, keys: Iterable[str]) -> bool:
        return not any(k in self.unhealthy for k in keys)

    def reason(self, keys: Iterable[str]) -> str | None:
        for key in keys:
            if key in self.unhealthy:
                return f"{key}: {self.unhealthy[key]}"
        return None


class HealthSource(Protocol):
    """What the device plugin and the DRA health service read health from."""

    def snapshot(self) -> Snapshot:
        """The current state."""
        ...

    def wait_changed(self, version: int, timeout: float) -> Snapshot:
        """Block until the version differs from ``version`` or ``timeout`` passes; return state."""
        ...


class HealthBoard:
    """A thread-safe :class:`HealthSource` that producers mark devices on.

    The NVML watcher sets each UUID's conditions (:meth:`set_conditions`); tests and tools may
    use the simpler :meth:`mark_unhealthy` / :meth:`mark_healthy`. Setting what is already
    there changes nothing (no version bump, no notification, no spurious resend).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._version = 0
        self._conditions: dict[str, tuple[Condition, ...]] = {}
        self._closed = False
        self._subscribers: list[Callable[[Snapshot], None]] = []

    def set_conditions(self, uuid: str, conditions: Sequence[Condition]) -> bool:
        """Make ``conditions`` the reasons ``uuid`` is unhealthy (empty: healthy again);
        returns whether anything changed."""
        wanted = tuple(conditions)
        with self._cond:
            if self._conditions.get(uuid, ()) == wanted:
                return False
            if wanted:
                self._conditions[uuid] = wanted
            else:
                del self._conditions[uuid]
            snap = self._bump()
        self._notify(snap)
        return True

    def update_many(
        self,
        change: Callable[[Mapping[str, tuple[Condition, ...]]], Mapping[str, Sequence[Condition]]],
    ) -> bool:
        """Set the conditions of several UUIDs in one change (one version, one notification):
        ``change`` gets the current conditions and returns the new ones of the UUIDs it
        changes (empty: healthy). Used for what concerns every GPU at once (the driver going
        away and coming back, :mod:`dra_driver.driverwatch`); returns whether anything changed."""
        with self._cond:
            wanted = {u: tuple(c) for u, c in change(MappingProxyType(self._conditions)).items()}
            wanted = {u: c for u, c in wanted.items() if self._conditions.get(u, ()) != c}
            if not wanted:
                return False
            for uuid, conditions in wanted.items():
                if conditions:
                    self._conditions[uuid] = conditions
                else:
                    self._conditions.pop(uuid, None)
            snap = self._bump()
        self._notify(snap)
        return True

    def mark_unhealthy(self, uuid: str, reason: str = "marked unhealthy") -> bool:
        """Mark ``uuid`` unhealthy for ``reason``; returns whether anything changed."""
        return self.set_conditions(
            uuid, [Condition(kind="unhealthy", value="", effect="NoSchedule", message=reason)]
        )

    def mark_healthy(self, uuid: str) -> bool:
        """Mark ``uuid`` healthy again; returns whether anything changed."""
        return self.set_conditions(uuid, ())

    def snapshot(self) -> Snapshot:
        with self._cond:
            return self._snap()

    def wait_changed(self, version: int, timeout: float) -> Snapshot:
        with self._cond:
            self._cond.wait_for(lambda: self._closed or self._version != version, timeout=timeout)
            return self._snap()

    def subscribe(self, callback: Callable[[Snapshot], None]) -> Callable[[], None]:
        """Call ``callback(snapshot)`` after every change (see the module docstring for the
        rules); returns a function that unsubscribes it."""
        with self._cond:
            self._subscribers.append(callback)

        def unsubscribe() -> None:
            with self._cond:
                if callback in self._subscribers:
                    self._subscribers.remove(callback)

        return unsubscribe

    def close(self) -> None:
        """Release every waiter now and from now on (shutdown: streams end promptly)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed

    def _bump(self) -> Snapshot:
        self._version += 1
        self._cond.notify_all()
        return self._snap()

    def _notify(self, snap: Snapshot) -> None:
        with self._cond:
            subscribers = list(self._subscribers)
        for callback in subscribers:
            try:
                callback(snap)
            except Exception as exc:  # one consumer never breaks the producer or the others
                _log.error("health subscriber failed", subscriber=repr(callback), error=repr(exc))

    def _snap(self) -> Snapshot:
        return Snapshot(
            version=self._version,
            unhealthy=MappingProxyType(
                {
                    uuid: "; ".join(c.message for c in conds)
                    for uuid, conds in self._conditions.items()
                }
            ),
            conditions=MappingProxyType(dict(self._conditions)),
        )


def device_keys(node: model.NodeDevices) -> dict[str, tuple[str, ...]]:
    """Published device name → the UUIDs whose failure makes it unhealthy (own, then parent's)."""
    keys: dict[str, tuple[str, ...]] = {}
    for gpu in node.gpus:
        keys[gpu.name] = (gpu.uuid,)
        for mig in gpu.mig_devices:
            keys[model.mig_device_name(gpu, mig)] = (mig.uuid, gpu.uuid)
    return keys
