"""Which full GPUs of this node the scheduler has allocated to claims the kubelet has not
prepared yet: a watch of the Pods bound to this node and the claims they name.

Why it exists: the set ranks on the GPU devices (:mod:`dra_driver.slices.gpusets`) rank the
*free* GPUs, but prepare tells the agent what a claim holds only when the kubelet starts the pod,
a second or more after the allocation; in a burst the next claims would meet ranks that still
offer the GPUs just allocated. kube-scheduler writes the claim's ``status.allocation`` in PreBind,
then binds the pod (``spec.nodeName``); the agent, watching the Pods of its node
(``fieldSelector=spec.nodeName=<node>``, as the kubelet does), reads each claim a pod names and
marks the GPUs its allocation names in this pool. A claim stops counting when no live Pod of the
node names it any more (deleted before it started, or finished): its GPUs are free again.

Whose identity reads the Pods: by default the node's (``acting_as_node``: ``Impersonate-User:
system:node:<node>``, :mod:`dra_driver.kube.impersonation`), so kube-apiserver 1.36 lets it list
and watch only this node's Pods, where its own ServiceAccount would need every Pod of the cluster
(RBAC cannot express the field selector; docs/security.md). A 403 is logged once as an error
naming what the cluster lacks; the ranks follow prepares until the watch is allowed. Not a watch
of ResourceClaims: they have no field selector for their node, so every agent would receive every
claim change of the cluster (``benchmarks/allocation_sources.py``, docs/security.md).

The claims it read are kept (:meth:`AllocationWatch.claim`, :meth:`~AllocationWatch.snapshot`);
prepare uses one only where :mod:`.claimcache` shows it current. Else allocations only steer the
ranks (``HeldGpus`` ``allocated``, read by :mod:`.republish`); prepare and the checkpoint stay the
truth for what is held. It never blocks prepare (its own threads) and survives errors: a 410 Gone
relists, others (unreachable, 5xx, 403) are logged and retried with capped exponential backoff
and jitter; a relist re-reads every claim.
"""

from __future__ import annotations

import heapq
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import structlog

from dra_driver import records
from dra_driver.devices import holdings
from dra_driver.kube import api
from dra_driver.kube.objects import PODS, ObjectApi
from dra_driver.slices.pubtypes import Backoff

ClaimKey = tuple[str, str]  # (namespace, name)
TERMINAL = ("Succeeded", "Failed")  # a finished pod's claims are released by the controller
RETRY_S = 0.25  # a claim not readable or not allocated yet is read again after this
RETRIES = 20  # ... this many times, then again at the next relist
RESYNC_S = 300.0  # a fresh list (every claim read again) at least this often


@records.record
class HeldClaim:
    """A claim allocated on this node as the watch last read it (do not modify ``claim``)."""

    claim: api.Obj
    resource_version: str


FORBIDDEN_HINT = (
    "needs Kubernetes 1.36+ (ConstrainedImpersonation, beta and on by default) with the Node "
    "authorizer, a service account token bound to this Pod (its node-name extra) and the "
    "chart's impersonate rules; or set kubeletPlugin.allocationSource=pods "
    "(--allocation-source=pods), which grants cluster-wide Pod reads (docs/security.md)"
)


def claims_of(pod: Mapping[str, Any]) -> tuple[ClaimKey, ...]:
    """The claims a live pod names: ``resourceClaimName`` entries, and those made from a
    template once ``status.resourceClaimStatuses`` names them; none for a finished pod."""
    status = pod.get("status") or {}
    if status.get("phase") in TERMINAL:
        return ()
    namespace = str((pod.get("metadata") or {}).get("namespace") or "")
    generated = {
        s.get("name"): s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or ()
    }
    found: list[ClaimKey] = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or ():
        name = entry.get("resourceClaimName") or generated.get(entry.get("name"))
        if name:
            found.append((namespace, str(name)))
    return tuple(sorted(set(found)))


def allocated_gpus(
    claim: Mapping[str, Any],
    *,
    driver_name: str,
    pool_name: str,
    gpus_of: Callable[[str], Iterable[str]],
) -> frozenset[str] | None:
    """The full GPUs of this pool that ``claim``'s allocation names (admin access holds none);
    None when the claim is not allocated."""
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        return None
    gpus: set[str] = set()
    for result in (allocation.get("devices") or {}).get("results") or ():
        if result.get("driver") != driver_name or result.get("pool") != pool_name:
            continue
        if result.get("adminAccess"):
            continue
        gpus.update(gpus_of(str(result.get("device") or "")))
    return frozenset(gpus)


class AllocationWatch:
    """Keeps ``allocated`` (claim UID → full GPUs) equal to the allocations of the claims the
    live Pods of ``node_name`` name. :meth:`start` runs it in two daemon threads (the watch,
    and the claim reader); :meth:`stop` ends them."""

    def __init__(
        self,
        *,
        objects: ObjectApi,
        get_claim: Callable[[str, str], api.Obj],
        node_name: str,
        driver_name: str,
        gpus_of: Callable[[str], Iterable[str]],
        allocated: holdings.HeldGpus,
        log: structlog.typing.FilteringBoundLogger,
        watch_timeout_s: float = 30.0,
        backoff: Backoff | None = None,
        retry_s: float = RETRY_S,
        resync_s: float = RESYNC_S,
        acting_as_node: bool = False,
    ) -> None:
        self._objects = objects
        self._get_claim = get_claim
        self._node = node_name
        self._driver = driver_name
        self._gpus_of = gpus_of
        self.allocated = allocated
        self._log = log
        self.watch_timeout_s = watch_timeout_s
        self._backoff = backoff or Backoff(initial_s=0.5, max_s=30.0)
        self._retry_s = retry_s
        self._resync_s = resync_s
        self._acting_as_node = acting_as_node
        self._refused = False  # the last failure was a 403 (logged as an error once a streak)
        self._stop = threading.Event()
        self._cond = threading.Condition()
        self._pods: dict[str, tuple[ClaimKey, ...]] = {}  # pod UID → the claims it names
        self._resolved: dict[ClaimKey, str] = {}  # claim → the UID its GPUs are held under
        self._claims: dict[str, HeldClaim] = {}  # claim UID → the claim as last read
        self._leaving: set[str] = set()  # pods of _pods with a deletionTimestamp
        self._synced = False  # listed, and followed since without a failure (claimcache)
        self._heard = 0.0  # when the server last answered the watch (monotonic)
        self._due: list[tuple[float, int, ClaimKey, int]] = []  # (when, seq, claim, attempt)
        self._seq = 0
        self._threads: list[threading.Thread] = []
        self.relists = 0  # list calls made (tests)
        self.failures = 0  # watch or list failures (tests)

    def claim(self, uid: str) -> HeldClaim | None:
        """The claim of ``uid`` as read when it was allocated on this node; None when the
        watch holds no such claim (not read yet, not allocated here, or released)."""
        with self._cond:
            return self._claims.get(uid)

    def snapshot(self, uid: str, key: ClaimKey) -> tuple[HeldClaim | None, frozenset[str], float]:
        """For :mod:`.claimcache`: ``uid``'s claim if read for ``key``; live pods naming ``key``
        (no deletionTimestamp); seconds since the watch last heard (inf: not synced)."""
        with self._cond:
            held = self._claims.get(uid) if self._resolved.get(key) == uid else None
            pods = (p for p, keys in self._pods.items() if key in keys and p not in self._leaving)
            quiet = time.monotonic() - self._heard if self._synced else math.inf
            return held, frozenset(pods), quiet

    # ------------------------------------------------------------------ control
    def start(self) -> None:
        for target, name in ((self._watch_loop, "allocation-watch"), (self._reader, "claim-read")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Stop; the watch thread ends with its current watch call (a daemon, not waited for
        beyond a moment)."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(0.05 if thread.name == "allocation-watch" else 2.0)

    # ------------------------------------------------------------------ the watch
    def _watch_loop(self) -> None:
        selector = f"spec.nodeName={self._node}"
        rv: str | None = None
        listed = time.monotonic()
        while not self._stop.is_set():
            try:
                if rv is None or time.monotonic() - listed > self._resync_s:
                    # a claim deleted or deallocated while its pod stays is seen here
                    items, rv = self._objects.list(PODS, field_selector=selector)
                    listed = time.monotonic()
                    self.relists += 1
                    self._reset(items)
                rv = self._follow(selector, rv)
                self._backoff.reset()
                self._refused = False
            except api.ApiError as exc:
                rv = None  # resync from a fresh list
                self._synced = False
                if exc.status == 410:
                    continue
                self.failures += 1
                delay = self._backoff.next_delay()
                if exc.status == 403 and not self._refused:
                    self._refused = True
                    self._log.error(
                        "not allowed to read this node's pods; set ranks follow prepares only",
                        acting_as_node=self._acting_as_node,
                        error=str(exc),
                        hint=FORBIDDEN_HINT if self._acting_as_node else "grant list/watch pods",
                        retry_in_s=round(delay, 3),
                    )
                    self._stop.wait(delay)
                    continue
                self._log.warning(
                    "watch of this node's pods failed; retrying",
                    status=exc.status,
                    error=str(exc),
                    retry_in_s=round(delay, 3),
                    attempt=self._backoff.step,
                )
                self._stop.wait(delay)
            except Exception as exc:  # never let the thread die: ranks would freeze
                self.failures += 1
                rv = None
                self._synced = False
                self._log.error("allocation watch failed", error=repr(exc))
                self._stop.wait(self._backoff.next_delay())

    def _follow(self, selector: str, rv: str) -> str | None:
        """One watch from ``rv``; returns where to go on (None: relist)."""
        events = self._objects.watch(
            PODS, field_selector=selector, resource_version=rv, timeout_s=self.watch_timeout_s
        )
        self._heard = time.monotonic()
        for event in events:
            self._heard = time.monotonic()
            if self._stop.is_set():
                return rv
            obj = event.object
            if event.type == "ERROR":
                code = int(obj.get("code") or 0)
                raise api.ApiError(code, str(obj.get("message") or "watch error"))
            rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
            if event.type == "BOOKMARK":
                continue
            uid = str(obj["metadata"].get("uid") or "")
            if event.type == "DELETED" or (obj.get("spec") or {}).get("nodeName") != self._node:
                self._set_pod(uid, ())
            else:
                self._set_pod(uid, claims_of(obj), bool(obj["metadata"].get("deletionTimestamp")))
        return rv

    def _reset(self, pods: list[api.Obj]) -> None:
        """After a list: the pods are these; every claim they name is read again."""
        table = {str(p["metadata"].get("uid") or ""): claims_of(p) for p in pods}
        with self._cond:
            self._pods = {uid: keys for uid, keys in table.items() if keys}
            leaving = (p["metadata"] for p in pods if p["metadata"].get("deletionTimestamp"))
            self._leaving = {str(meta.get("uid") or "") for meta in leaving}
            self._synced, self._heard = True, time.monotonic()
            wanted = self._wanted()
            stale = {k: u for k, u in self._resolved.items() if k not in wanted}
            self._resolved = {k: u for k, u in self._resolved.items() if k in wanted}
            for key in wanted:
                self._enqueue(key, 0, 0.0)
            for key, uid in stale.items():
                self._release(key, uid)

    def _set_pod(self, pod_uid: str, keys: tuple[ClaimKey, ...], leaving: bool = False) -> None:
        with self._cond:
            (self._leaving.add if leaving and keys else self._leaving.discard)(pod_uid)
            before = self._wanted()
            if keys:
                old = self._pods.get(pod_uid, ())
                self._pods[pod_uid] = keys
            else:
                old = self._pods.pop(pod_uid, ())
            after = self._wanted()
            for key in keys:
                if key not in self._resolved and key not in old:
                    self._enqueue(key, 0, 0.0)
            gone = {k: self._resolved.pop(k) for k in before - after if k in self._resolved}
            for key, uid in gone.items():
                self._release(key, uid)

    def _release(self, key: ClaimKey, claim_uid: str) -> None:
        """(lock held: a claim read meanwhile cannot hold after this) Free its GPUs."""
        self._claims.pop(claim_uid, None)
        if self.allocated.release(claim_uid):
            self._log.debug(
                "claim no longer allocated on this node; its GPUs are free in the set ranks",
                claim_uid=claim_uid,
                claim_namespace=key[0],
                claim_name=key[1],
            )

    def _wanted(self) -> set[ClaimKey]:
        return {k for keys in self._pods.values() for k in keys}

    def _enqueue(self, key: ClaimKey, attempt: int, delay: float) -> None:
        """(lock held) Read ``key`` after ``delay``."""
        self._seq += 1
        heapq.heappush(self._due, (time.monotonic() + delay, self._seq, key, attempt))
        self._cond.notify_all()

    # ------------------------------------------------------------------ reading claims
    def _reader(self) -> None:
        while not self._stop.is_set():
            with self._cond:
                while not self._stop.is_set():
                    wait = self._due[0][0] - time.monotonic() if self._due else None
                    if wait is not None and wait <= 0:
                        break
                    self._cond.wait(wait)
                if self._stop.is_set():
                    return
                _, _, key, attempt = heapq.heappop(self._due)
                if key not in self._wanted():
                    continue
            self._read(key, attempt)

    def _read(self, key: ClaimKey, attempt: int) -> None:
        namespace, name = key
        try:
            claim = self._get_claim(namespace, name)
            gpus = allocated_gpus(
                claim, driver_name=self._driver, pool_name=self._node, gpus_of=self._gpus_of
            )
        except api.NotFound:
            gpus, claim = None, {}
        except Exception as exc:  # unreachable, 5xx, 403, a malformed claim: read again
            self._log.warning(
                "cannot read a claim allocated on this node; retrying",
                claim_namespace=namespace,
                claim_name=name,
                error=str(exc),
            )
            gpus, claim = None, {}
        uid = str((claim.get("metadata") or {}).get("uid") or "")
        with self._cond:
            if key not in self._wanted():
                return
            if gpus is None or not uid:  # gone, or not (or no longer) allocated
                stale = self._resolved.pop(key, None)
                if stale is not None:
                    self._release(key, stale)
                if attempt + 1 < RETRIES:
                    self._enqueue(key, attempt + 1, self._retry_s)
                return
            previous = self._resolved.get(key)
            self._resolved[key] = uid
            if previous is not None and previous != uid:
                self.allocated.release(previous)
                self._claims.pop(previous, None)
            rv = str((claim.get("metadata") or {}).get("resourceVersion") or "")
            self._claims[uid] = HeldClaim(claim=claim, resource_version=rv)
            changed = self.allocated.hold(uid, gpus)  # cheap; under the lock, see _release
        if changed:
            self._log.debug(
                "claim allocated on this node; its GPUs leave the set ranks",
                claim_uid=uid,
                claim_namespace=namespace,
                claim_name=name,
                gpus=sorted(gpus),
            )


def start(
    *,
    objects: ObjectApi,
    get_claim: Callable[[str, str], api.Obj],
    node_name: str,
    driver_name: str,
    gpus_of: Callable[[str], Iterable[str]],
    log: structlog.typing.FilteringBoundLogger,
    watch_timeout_s: float = 30.0,
    acting_as_node: bool = False,
) -> AllocationWatch:
    """Start watching; ``.allocated`` is the set to hand to the republisher."""
    watch = AllocationWatch(
        objects=objects,
        get_claim=get_claim,
        node_name=node_name,
        driver_name=driver_name,
        gpus_of=gpus_of,
        allocated=holdings.HeldGpus(),
        log=log,
        watch_timeout_s=watch_timeout_s,
        acting_as_node=acting_as_node,
    )
    watch.start()
    return watch
