"""The ComputeDomain controller's reconciliation: what each domain needs, kept true.

Why it exists: a ComputeDomain is only a request; the controller turns it into the objects that
make it work (:mod:`.manifests`) and keeps its overall status true to what the nodes report.
Reconciliation is level-based and idempotent — every round reads the domains and makes the
world match, so a controller restarted half-way through (or one that was down while a domain was
deleted) finishes the job on its next round:

- a live domain gets the controller's finalizer, its workload ResourceClaimTemplate, its daemon
  ResourceClaimTemplate and its IMEX daemon DaemonSet (changed ones are replaced: a template's
  spec is immutable, a DaemonSet is updated), and ``status.status`` from ``status.nodes``
  (which the node agents write: their node, its clique and address, and whether its IMEX daemon
  is ready);
- a deleted domain (``deletionTimestamp``, held by the finalizer) loses its DaemonSet and
  templates, then the finalizer; the workload template would go with the domain anyway
  (owner reference);
- objects of ours whose domain no longer exists at all are deleted (the finalizer was removed
  by hand, or the domain went while no controller ran).

An object of the workload template's name that is not this domain's is left alone (logged).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import prometheus_client as prom
import structlog

from dra_driver import computedomain as cd
from dra_driver.computedomain import api as cdapi
from dra_driver.computedomain import manifests
from dra_driver.kube import api
from dra_driver.kube.objects import (
    COMPUTE_DOMAINS,
    DAEMON_SETS,
    RESOURCE_CLAIM_TEMPLATES,
    Kind,
    ObjectApi,
)

HASH = "resource.nvidia.com/spec-hash"
OURS = f"app.kubernetes.io/managed-by={manifests.MANAGED_BY}"


class ControllerMetrics:
    """The controller's series (docs/metrics.md), in their own registry."""

    def __init__(self) -> None:
        self.registry = prom.CollectorRegistry()
        self.leader = prom.Gauge(
            "dra_driver_controller_leader",
            "1 while this controller holds the leader lease, 0 otherwise",
            registry=self.registry,
        )
        self.reconciles = prom.Counter(
            "dra_driver_compute_domain_reconciles_total",
            "ComputeDomain reconciliations, by result",
            ["result"],
            registry=self.registry,
        )
        self.domains = prom.Gauge(
            "dra_driver_compute_domains",
            "ComputeDomains by status.status (as of the last round)",
            ["status"],
            registry=self.registry,
        )
        for result in ("success", "error"):
            self.reconciles.labels(result=result)
        for status in (cdapi.READY, cdapi.NOT_READY):
            self.domains.labels(status=status).set(0)


class Controller:
    """Reconciles every ComputeDomain of the cluster (call :meth:`reconcile_all` as leader)."""

    def __init__(
        self,
        objects: ObjectApi,
        *,
        settings: manifests.Settings,
        log: structlog.typing.FilteringBoundLogger,
        metrics: ControllerMetrics | None = None,
    ) -> None:
        self._objects = objects
        self.settings = settings
        self._log = log
        self.metrics = metrics or ControllerMetrics()
        self._foreign: set[tuple[str, str]] = set()  # templates in the way, logged once

    def reconcile_all(self) -> None:
        """One round over every domain, then the orphans of domains that no longer exist."""
        items, _ = self._objects.list(COMPUTE_DOMAINS)
        counts = {cdapi.READY: 0, cdapi.NOT_READY: 0}
        for obj in items:
            domain = cdapi.Domain.from_obj(obj)
            log = self._log.bind(domain=f"{domain.namespace}/{domain.name}", domain_uid=domain.uid)
            try:
                status = self.reconcile(obj, log=log)
            except api.ApiError as exc:
                self.metrics.reconciles.labels(result="error").inc()
                log.warning("ComputeDomain reconciliation failed; will retry", error=str(exc))
                continue
            self.metrics.reconciles.labels(result="success").inc()
            if status:
                counts[status] += 1
        for status, count in counts.items():
            self.metrics.domains.labels(status=status).set(count)
        self.sweep_orphans({cdapi.Domain.from_obj(o).uid for o in items})

    def reconcile(self, obj: api.Obj, *, log: structlog.typing.FilteringBoundLogger) -> str:
        """Make one domain's objects and status right; its status ("" once torn down)."""
        domain = cdapi.Domain.from_obj(obj)
        if domain.deleting:
            self._tear_down(obj, domain, log)
            return ""
        if cd.FINALIZER not in domain.finalizers:
            obj = self._objects.update(
                COMPUTE_DOMAINS,
                {
                    **obj,
                    "metadata": {
                        **obj["metadata"],
                        "finalizers": [*domain.finalizers, cd.FINALIZER],
                    },
                },
            )
        self._ensure(
            RESOURCE_CLAIM_TEMPLATES,
            manifests.workload_template(domain, obj),
            domain,
            log,
            replace=True,
        )
        self._ensure(
            RESOURCE_CLAIM_TEMPLATES,
            manifests.daemon_template(domain, self.settings),
            domain,
            log,
            replace=True,
        )
        self._ensure(
            DAEMON_SETS, manifests.daemon_set(domain, self.settings), domain, log, replace=False
        )
        return self._status(obj, domain, log)

    # ------------------------------------------------------------------ the pieces
    def _ensure(
        self,
        kind: Kind,
        desired: dict[str, Any],
        domain: cdapi.Domain,
        log: structlog.typing.FilteringBoundLogger,
        *,
        replace: bool,
    ) -> None:
        meta = desired["metadata"]
        meta.setdefault("annotations", {})[HASH] = _hash(desired["spec"])
        name, namespace = meta["name"], meta["namespace"]
        try:
            existing = self._objects.get(kind, name, namespace=namespace)
        except api.NotFound:
            try:
                self._objects.create(kind, desired)
            except api.Conflict as exc:
                if exc.reason != "AlreadyExists":
                    raise
                return  # created under our feet (another round): the next round checks it
            log.info(
                "created an object of the ComputeDomain",
                kind=kind.kind,
                name=name,
                namespace=namespace,
            )
            return
        emeta = existing["metadata"]
        if (emeta.get("labels") or {}).get(cd.NODE_LABEL) != domain.uid:
            if (namespace, name) not in self._foreign:
                self._foreign.add((namespace, name))
                log.error(
                    "an object of that name exists and is not this ComputeDomain's; left alone",
                    kind=kind.kind,
                    name=name,
                    namespace=namespace,
                )
            return
        self._foreign.discard((namespace, name))
        if (emeta.get("annotations") or {}).get(HASH) == meta["annotations"][HASH]:
            return
        if replace:  # a claim template's spec is immutable: delete, the next round creates it
            self._objects.delete(kind, name, namespace=namespace, uid=emeta["uid"])
        else:
            self._objects.update(
                kind, {**desired, "metadata": {**meta, "resourceVersion": emeta["resourceVersion"]}}
            )
        log.info(
            "replaced an outdated object of the ComputeDomain",
            kind=kind.kind,
            name=name,
            namespace=namespace,
        )

    def _status(
        self, obj: api.Obj, domain: cdapi.Domain, log: structlog.typing.FilteringBoundLogger
    ) -> str:
        wanted = domain.overall_status()
        current = (obj.get("status") or {}).get("status")
        if current == wanted:
            return wanted
        new = cdapi.with_nodes(obj, domain.nodes)
        new["status"]["status"] = wanted
        try:
            self._objects.update_status(COMPUTE_DOMAINS, new)
        except api.Conflict:  # a node agent wrote its entry meanwhile: next round
            return current or cdapi.NOT_READY
        ready = sum(1 for n in domain.nodes if n.status == cdapi.READY)
        log.info(
            "ComputeDomain status changed",
            status=wanted,
            ready_nodes=ready,
            num_nodes=domain.num_nodes,
        )
        return wanted

    def _tear_down(
        self, obj: api.Obj, domain: cdapi.Domain, log: structlog.typing.FilteringBoundLogger
    ) -> None:
        if cd.FINALIZER not in domain.finalizers:
            return  # not ours to finish (another finalizer holds it)
        left = self._delete_ours(f"{cd.NODE_LABEL}={domain.uid}", log)
        try:
            template = self._objects.get(
                RESOURCE_CLAIM_TEMPLATES, domain.template_name, namespace=domain.namespace
            )
        except api.NotFound:
            pass
        else:
            if (template["metadata"].get("labels") or {}).get(cd.NODE_LABEL) == domain.uid:
                self._delete(RESOURCE_CLAIM_TEMPLATES, template, log)
                left += 1
        if left:
            return  # deleted this round; the finalizer goes once a round finds nothing left
        finalizers = [f for f in domain.finalizers if f != cd.FINALIZER]
        self._objects.update(
            COMPUTE_DOMAINS, {**obj, "metadata": {**obj["metadata"], "finalizers": finalizers}}
        )
        log.info("ComputeDomain cleaned up; finalizer removed")

    def sweep_orphans(self, live: set[str]) -> None:
        """Delete our DaemonSets and daemon templates whose domain UID is gone."""
        for kind in (DAEMON_SETS, RESOURCE_CLAIM_TEMPLATES):
            items, _ = self._objects.list(
                kind, namespace=self.settings.namespace, label_selector=OURS
            )
            for item in items:
                uid = (item["metadata"].get("labels") or {}).get(cd.NODE_LABEL)
                if uid and uid not in live:
                    self._delete(kind, item, self._log.bind(domain_uid=uid))

    def _delete_ours(self, selector: str, log: structlog.typing.FilteringBoundLogger) -> int:
        found = 0
        for kind in (DAEMON_SETS, RESOURCE_CLAIM_TEMPLATES):
            items, _ = self._objects.list(
                kind, namespace=self.settings.namespace, label_selector=selector
            )
            for item in items:
                self._delete(kind, item, log)
                found += 1
        return found

    def _delete(self, kind: Kind, obj: api.Obj, log: structlog.typing.FilteringBoundLogger) -> None:
        meta = obj["metadata"]
        try:
            self._objects.delete(
                kind, meta["name"], namespace=meta.get("namespace"), uid=meta.get("uid")
            )
        except api.NotFound:
            return
        log.info(
            "deleted an object of the ComputeDomain",
            kind=kind.kind,
            name=meta["name"],
            namespace=meta.get("namespace"),
        )


def _hash(spec: Any) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
