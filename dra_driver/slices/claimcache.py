"""The claim a prepare needs, from the allocation watch when that copy is provably current
(as of the watch's position: see below).

Why it exists: every prepare used to GET its ResourceClaim, and on a busy node that GET is the
largest cost of a prepare burst, for the agent (TLS, a 2 KB body with managedFields) and for the
API server it shares the cores with (issue 46). The allocation watch
(:mod:`~dra_driver.slices.allocwatch`) has usually read the same claim moments before, when its
pod was bound to this node. :meth:`ClaimCache.current` hands that copy to prepare only when the
argument below shows it is the claim as the kubelet saw it; in every other case it answers None
and prepare GETs as before. Counted in ``hits`` and ``misses`` (by reason).

What prepare uses of the claim: its UID, its ``status.allocation`` (devices and configs), its
template name and, for metric labels only, ``status.reservedFor``. The copy is used when all of
these hold (checked at each call, under the watch's lock):

1. the request's UID, namespace and name are those of a claim the watch read (a claim deleted
   and re-created under the same name has another UID: the kubelet sends the new one, a miss);
2. that read showed an allocation with a result of this driver in this node's pool, and no
   ``deletionTimestamp``;
3. the watch is synced: it listed this node's pods and has followed them since without a failure
   (a failure means a gap: until the next list, every answer is None), and its stream answered
   within the last ``watch_timeout_s`` + :data:`SILENCE_S` seconds;
4. a *holder*: a pod named in that read's ``reservedFor`` (by UID) is, in the watch's current
   view, a live pod of this node (not terminal, no ``deletionTimestamp``) that names the claim.

Why that proves the allocation unchanged since the read, up to the watch's position: the API
server never changes a set ``status.allocation`` (it may only be cleared), and never lets
``reservedFor`` be non-empty without it. The resource-claim controller removes a pod from
``reservedFor`` only when the pod is gone, terminal, or not scheduled, and the scheduler adds a
pod only while scheduling it, before it is bound. The holder was reserved at the read and is
bound, and the watch, with no gap (3), would have delivered its end had it come before the
watch's position: so it stayed reserved from the read to that position, ``reservedFor`` was never
empty, the allocation was never cleared, and so it is the allocation read. A deallocated claim
(it has no holder any more) and a re-allocated one (deallocation needs every holder gone) both
fail 4 once the watch has delivered the holder's end, and a re-created one fails 1.

What it cannot prove: events the watch has not delivered yet. For a stale answer, the holder
must end, the controller clear the reservation and the allocation, the scheduler allocate the
same claim again for another pod of this node and bind it, and the kubelet see that pod and read
the claim, all before this agent's watch of the same pods delivers the first of those events
(the holder's end, earlier in the server's order than the new pod's binding the kubelet saw).
That needs the watch to lag the kubelet's own watch of the node's pods by a full scheduling
cycle; 3 bounds a silent stall. Nor does it cover a ``reservedFor`` edited by hand (not by the
controller or the scheduler). The GET has a window too (a claim deallocated just after it); the
kubelet unprepares such a claim in both cases.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Mapping
from typing import Any, Protocol

from dra_driver.kube import api
from dra_driver.slices import allocwatch

SILENCE_S = 10.0  # beyond the watch's own timeout: a stream silent longer is not trusted


class Ref(Protocol):
    """What the kubelet names a claim by (``dra_driver.driver.claims.ClaimRef``)."""

    @property
    def uid(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def name(self) -> str: ...


class ClaimCache:
    """``current(ref)``: the watched claim of ``ref`` when provably current, else None."""

    def __init__(self, *, watch: allocwatch.AllocationWatch, driver_name: str, pool: str) -> None:
        self._watch = watch
        self._driver = driver_name
        self._pool = pool
        self._count_lock = threading.Lock()
        self.hits = 0
        self.misses: collections.Counter[str] = collections.Counter()

    def current(self, ref: Ref) -> api.Obj | None:
        claim, why = self._check(ref)
        with self._count_lock:
            if claim is None:
                self.misses[why] += 1
            else:
                self.hits += 1
        return claim

    def _check(self, ref: Ref) -> tuple[api.Obj | None, str]:
        held, live, quiet = self._watch.snapshot(ref.uid, (ref.namespace, ref.name))
        if held is None:  # 1
            return None, "not read"
        if not self._ours(held.claim):  # 2
            return None, "not allocated here"
        if quiet > self._watch.watch_timeout_s + SILENCE_S:  # 3 (inf: not synced)
            return None, "not synced"
        reserved = (held.claim.get("status") or {}).get("reservedFor") or ()
        if not any(r.get("resource") == "pods" and r.get("uid") in live for r in reserved):  # 4
            return None, "no holder"
        return held.claim, ""

    def _ours(self, claim: Mapping[str, Any]) -> bool:
        """Condition 2: allocated (a result of this driver in this pool), not being deleted."""
        if (claim.get("metadata") or {}).get("deletionTimestamp"):
            return False
        allocation = (claim.get("status") or {}).get("allocation") or {}
        return any(
            r.get("driver") == self._driver and r.get("pool") == self._pool
            for r in (allocation.get("devices") or {}).get("results") or ()
        )
