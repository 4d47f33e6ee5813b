"""Leader election on a ``coordination.k8s.io`` Lease: one controller acts, the others wait.

Why it exists: the chart may run several controller replicas (or an old and a new one overlap in
a rolling update), and two controllers reconciling the same domains would fight over the same
objects. The rule is client-go's: the holder renews ``spec.renewTime`` every ``renew_s``; a
candidate takes the Lease only when its record has not changed for ``lease_s`` *as this
candidate observed it* (its own monotonic clock, so clock skew between machines does not
matter); every write carries the ``resourceVersion`` it read, so of two candidates only one
wins. A leader that cannot renew for ``lease_s`` stops acting before another can take over.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from typing import Any

import structlog

from dra_driver.kube import api
from dra_driver.kube.objects import LEASES, ObjectApi


def micro_time(when: float) -> str:
    """A ``MicroTime`` as the API server writes it."""
    moment = datetime.datetime.fromtimestamp(when, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Try :meth:`step` every ``renew_s``: it acquires or renews, and says whether we lead."""

    def __init__(
        self,
        objects: ObjectApi,
        *,
        namespace: str,
        name: str,
        identity: str,
        log: structlog.typing.FilteringBoundLogger,
        lease_s: float = 15.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._objects = objects
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self._log = log
        self.lease_s = lease_s
        self._clock = clock
        self._wall = wall
        self._observed: tuple[Any, float] | None = None  # (the lease's spec, when we saw it)
        self._renewed_at: float | None = None  # our last successful write, as leader
        self.reachable = False  # whether the last step reached the API server

    def is_leader(self) -> bool:
        """Whether we hold the lease now: renewed less than ``lease_s`` ago."""
        return self._renewed_at is not None and self._clock() - self._renewed_at < self.lease_s

    def step(self) -> bool:
        """Acquire the lease if free or expired, renew it if ours; whether we lead after it."""
        was = self.is_leader()
        try:
            leading = self._step()
            self.reachable = True
        except api.ApiError as exc:
            self.reachable = exc.status != 0
            self._log.warning("leader election step failed", lease=self.name, error=str(exc))
            leading = self.is_leader()
        if leading != was:
            if leading:
                self._log.info("became the leader", lease=self.name, identity=self.identity)
            else:
                self._log.warning("lost the leadership", lease=self.name, identity=self.identity)
        return leading

    def release(self) -> None:
        """Give the lease up (on shutdown) so another candidate need not wait it out."""
        if not self.is_leader():
            return
        try:
            lease = self._objects.get(LEASES, self.name, namespace=self.namespace)
            if (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                del lease["spec"]["holderIdentity"]
                self._objects.update(LEASES, lease)
        except api.ApiError as exc:
            self._log.warning("leader election step failed", lease=self.name, error=str(exc))
        self._renewed_at = None

    def _step(self) -> bool:
        now = self._clock()
        try:
            lease = self._objects.get(LEASES, self.name, namespace=self.namespace)
        except api.NotFound:
            self._objects.create(LEASES, self._lease(None, transitions=0, acquired=True))
            self._renewed_at = now
            return True
        spec = lease.get("spec") or {}
        if self._observed is None or self._observed[0] != spec:
            self._observed = (spec, now)
        holder = spec.get("holderIdentity")
        duration = float(spec.get("leaseDurationSeconds") or self.lease_s)
        ours = holder == self.identity
        expired = not holder or now - self._observed[1] >= duration
        if not ours and not expired:
            self._renewed_at = None
            return False
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if ours else 1)
        updated = self._lease(lease, transitions=transitions, acquired=not ours)
        try:
            written = self._objects.update(LEASES, updated)
        except api.Conflict:  # another candidate wrote first: it leads (or renewed)
            self._renewed_at = None
            return False
        self._observed = (written.get("spec") or {}, now)
        self._renewed_at = now
        return True

    def _lease(self, old: dict[str, Any] | None, *, transitions: int, acquired: bool) -> Any:
        stamp = micro_time(self._wall())
        spec = dict((old or {}).get("spec") or {})
        spec.update(
            holderIdentity=self.identity,
            leaseDurationSeconds=int(self.lease_s),
            renewTime=stamp,
            leaseTransitions=transitions,
        )
        if acquired:
            spec["acquireTime"] = stamp
        meta = {"name": self.name, "namespace": self.namespace}
        if old is not None:
            meta = {**old["metadata"]}
        return {
            "apiVersion": LEASES.api_version,
            "kind": LEASES.kind,
            "metadata": meta,
            "spec": spec,
        }
