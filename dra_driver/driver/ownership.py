"""Who holds what on this node, in memory: a lock per claim, and which claims hold which device.

Why its own module: both are small, thread-safe structures with their own rules — a claim's
lock exists only while someone holds or waits for it (no lock entries leak), and a device goes
to a second claim only when one of them has admin access or both hold distinct shares of a
multi-allocatable device. :mod:`~dra_driver.driver.state` uses them as its last line of defence
against handing one GPU to two claims.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence

from dra_driver import records
from dra_driver.driver import claims


class DeviceBusy(claims.ClaimError):
    """A device is already prepared for another claim."""


class ClaimLocks:
    """One lock per claim UID, created on demand and dropped when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, tuple[threading.Lock, int]] = {}

    @contextlib.contextmanager
    def hold(self, uid: str) -> Iterator[None]:
        with self._guard:
            lock, users = self._locks.get(uid, (threading.Lock(), 0))
            self._locks[uid] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._guard:
                lock, users = self._locks[uid]
                if users == 1:
                    del self._locks[uid]
                else:
                    self._locks[uid] = (lock, users - 1)

    def busy(self, uid: str) -> bool:
        """Whether a thread holds or waits for ``uid``'s lock now."""
        with self._guard:
            return uid in self._locks


@records.record
class _Use:
    uid: str
    admin: bool
    share_id: str | None


class Ownership:
    """Which claims hold which (pool, device); reserve-or-fail is atomic."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._uses: dict[tuple[str, str], list[_Use]] = {}

    def reserve(self, ref: claims.ClaimRef, devices: Sequence[claims.AllocatedDevice]) -> None:
        with self._guard:
            for dev in devices:
                for use in self._uses.get((dev.pool, dev.device), []):
                    if use.uid == ref.uid or use.admin or dev.admin_access:
                        continue
                    if use.share_id and dev.share_id and use.share_id != dev.share_id:
                        continue
                    raise DeviceBusy(
                        f"{ref}: device {dev.pool}/{dev.device} is already prepared for claim "
                        f"uid {use.uid}; refusing to hand it to a second claim"
                    )
            for dev in devices:
                uses = self._uses.setdefault((dev.pool, dev.device), [])
                uses[:] = [u for u in uses if u.uid != ref.uid]
                uses.append(_Use(ref.uid, dev.admin_access, dev.share_id))

    def holders(self) -> set[str]:
        """UIDs of the claims holding any device."""
        with self._guard:
            return {u.uid for uses in self._uses.values() for u in uses}

    def release(self, uid: str) -> None:
        with self._guard:
            for key in list(self._uses):
                remaining = [u for u in self._uses[key] if u.uid != uid]
                if remaining:
                    self._uses[key] = remaining
                else:
                    del self._uses[key]
