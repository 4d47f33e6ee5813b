"""Device health both agents report: a versioned set of unhealthy UUIDs.

Why: the device plugin's ListAndWatch and the DRA health stream (``NodeWatchResources``) must
resend the full device list whenever a GPU turns unhealthy *or* healthy again, and several
streams (one per resource or API version, a new one after every kubelet restart) watch the same
facts. A :class:`HealthSource` gives them a snapshot plus a blocking "wait until it changed";
whatever detects health (the fake backend's switch today, NVML XID events later) feeds a
:class:`HealthBoard`. Keyed by GPU or MIG UUID; a MIG device also follows its parent GPU
(:func:`device_keys`).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Protocol

from dra_driver.devices import model

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


@dataclasses.dataclass(frozen=True, slots=True)
class Snapshot:
    """The unhealthy UUIDs (with a reason each) at one version; versions only grow."""

    version: int
    unhealthy: Mapping[str, str]

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

    The fake backend's health switch is exactly this: tests and demos call
    :meth:`mark_unhealthy` / :meth:`mark_healthy`; a future NVML event watcher will do the same.
    Marking a device with the state it already has changes nothing (no spurious resend).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._version = 0
        self._unhealthy: dict[str, str] = {}
        self._closed = False

    def mark_unhealthy(self, uuid: str, reason: str = "marked unhealthy") -> bool:
        """Mark ``uuid`` unhealthy; returns whether anything changed."""
        with self._cond:
            if self._unhealthy.get(uuid) == reason:
                return False
            self._unhealthy[uuid] = reason
            self._bump()
            return True

    def mark_healthy(self, uuid: str) -> bool:
        """Mark ``uuid`` healthy again; returns whether anything changed."""
        with self._cond:
            if self._unhealthy.pop(uuid, None) is None:
                return False
            self._bump()
            return True

    def snapshot(self) -> Snapshot:
        with self._cond:
            return self._snap()

    def wait_changed(self, version: int, timeout: float) -> Snapshot:
        with self._cond:
            self._cond.wait_for(lambda: self._closed or self._version != version, timeout=timeout)
            return self._snap()

    def close(self) -> None:
        """Release every waiter now and from now on (shutdown: streams end promptly)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed

    def _bump(self) -> None:
        self._version += 1
        self._cond.notify_all()

    def _snap(self) -> Snapshot:
        return Snapshot(version=self._version, unhealthy=MappingProxyType(dict(self._unhealthy)))


def device_keys(node: model.NodeDevices) -> dict[str, tuple[str, ...]]:
    """Published device name → the UUIDs whose failure makes it unhealthy (own, then parent's)."""
    keys: dict[str, tuple[str, ...]] = {}
    for gpu in node.gpus:
        keys[gpu.name] = (gpu.uuid,)
        for mig in gpu.mig_devices:
            keys[model.mig_device_name(gpu, mig)] = (mig.uuid, gpu.uuid)
    return keys
