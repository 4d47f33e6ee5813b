"""Which full GPUs the claims prepared on this node hold: a versioned set of GPU names, watched.

Why it exists: every full GPU's device carries its set ranks (``setRanks``,
:mod:`dra_driver.slices.gpusets`), computed over the GPUs that are free, so the published slices
must follow the claims the node agent prepares and unprepares. The claim state
(:class:`~dra_driver.driver.state.ClaimState`) writes a :class:`HeldGpus` after every prepare,
unprepare and rollback and at start-up recovery; the slice republisher
(:mod:`dra_driver.slices.republish`) reads it. Writing sits on the prepare path, so it is cheap
and never waits for the API: a count per GPU, and a notification only when the *set* of held
GPUs changes (a second claim on a shared GPU, or a claim of a GPU already held, changes nothing).

Keys are full-GPU device names (``gpu-3``, :attr:`dra_driver.devices.model.Gpu.name`): a claim
of a MIG device holds its parent GPU, a claim of an old GPU-set device every member, a share of
a multi-allocatable GPU the GPU (while any share is prepared).

Change notification follows :class:`~dra_driver.devices.health.HealthBoard`: a subscriber is
called with the new :class:`Snapshot` after every change, in the thread that made it, outside
the lock; it must return at once (hand work to your own thread) and should not raise.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterable, Mapping

from dra_driver import logs, records

_log = logs.get("holdings")


@records.record
class Snapshot:
    """The GPUs prepared claims hold, at one version; versions only grow."""

    version: int
    held: frozenset[str]


class HeldGpus:
    """Thread-safe: which claim holds which full GPUs, and the union of them, versioned."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._claims: dict[str, frozenset[str]] = {}
        self._count: collections.Counter[str] = collections.Counter()
        self._snap = Snapshot(version=0, held=frozenset())
        self._subscribers: list[Callable[[Snapshot], None]] = []

    def hold(self, claim_uid: str, gpus: Iterable[str]) -> bool:
        """Claim ``claim_uid`` holds exactly ``gpus`` now (empty: nothing); returns whether the
        set of held GPUs changed."""
        wanted = frozenset(gpus)
        with self._lock:
            old = self._claims.get(claim_uid, frozenset())
            if old == wanted:
                return False
            if wanted:
                self._claims[claim_uid] = wanted
            else:
                self._claims.pop(claim_uid, None)
            self._count.subtract(old)
            self._count.update(wanted)
            snap = self._bump()
        return self._notify(snap)

    def release(self, claim_uid: str) -> bool:
        """Claim ``claim_uid`` holds nothing any more; returns whether the set changed."""
        return self.hold(claim_uid, ())

    def reset(self, claims: Mapping[str, Iterable[str]]) -> bool:
        """Replace everything with ``claims`` (claim UID → its GPUs; start-up recovery);
        returns whether the set of held GPUs changed."""
        fresh = {uid: frozenset(gpus) for uid, gpus in claims.items()}
        with self._lock:
            self._claims = {uid: gpus for uid, gpus in fresh.items() if gpus}
            self._count = collections.Counter(g for gpus in self._claims.values() for g in gpus)
            snap = self._bump()
        return self._notify(snap)

    def snapshot(self) -> Snapshot:
        with self._lock:
            return self._snap

    def claims(self) -> dict[str, frozenset[str]]:
        """Claim UID → the GPUs it holds, now."""
        with self._lock:
            return dict(self._claims)

    def subscribe(self, callback: Callable[[Snapshot], None]) -> Callable[[], None]:
        """Call ``callback(snapshot)`` after every change of the held set; returns a function
        that unsubscribes it."""
        with self._lock:
            self._subscribers.append(callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._subscribers:
                    self._subscribers.remove(callback)

        return unsubscribe

    def _bump(self) -> Snapshot | None:
        """A new snapshot when the held set changed (lock held); None when it did not."""
        self._count = +self._count  # drop the GPUs no claim holds any more
        held = frozenset(self._count)
        if held == self._snap.held:
            return None
        self._snap = Snapshot(version=self._snap.version + 1, held=held)
        return self._snap

    def _notify(self, snap: Snapshot | None) -> bool:
        if snap is None:
            return False
        with self._lock:
            subscribers = list(self._subscribers)
        for callback in subscribers:
            try:
                callback(snap)
            except Exception as exc:  # one consumer never breaks a prepare or the others
                _log.error(
                    "held GPUs subscriber failed", subscriber=repr(callback), error=repr(exc)
                )
        return True
