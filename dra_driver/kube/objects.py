"""Generic access to the API kinds the driver manages beside slices, claims and nodes.

Why it exists: the node agent's own port (:class:`~dra_driver.kube.api.KubeApi`) is shaped for
the hot path — a claim GET per prepare, the publisher's slice writes — and stays narrow. Some
parts of the product own whole objects of other kinds: the MPS daemon Pods of shared GPUs, and
the ComputeDomain controller's ResourceClaimTemplates, DaemonSets, Leases and ComputeDomains.
They all need the same handful of verbs with the server's semantics (``generateName``,
``resourceVersion`` preconditions, finalizers, label selectors, watches), so this module names
the kinds (:class:`Kind`) and the verbs (:class:`ObjectApi`) once. The real implementation is
:class:`dra_driver.kube.objectclient.ObjectClient`; the in-memory API server serves the same
(:mod:`dra_driver.testing.fakeapi.objects`).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator
from typing import Protocol

from dra_driver import records
from dra_driver.kube.api import Obj, WatchEvent


@records.record
class Kind:
    """An API resource: ``group`` ("" for the core group), ``version``, ``plural`` (the
    resource name in paths), ``kind``, and whether it is namespaced and has a status
    subresource (whose writes go to ``.../status``, and whose main writes leave status)."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    status: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def resource(self) -> str:
        """``plural.group``, as RBAC rules and server messages name it (``pods`` in core)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def path(self, namespace: str | None = None, name: str | None = None, sub: str = "") -> str:
        """The REST path of the collection, of one object, or of its subresource ``sub``."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced:
            if not namespace:
                raise ValueError(f"{self.kind} is namespaced: a namespace is needed")
            base += f"/namespaces/{_q(namespace)}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{_q(name)}"
            if sub:
                base += f"/{sub}"
        return base


PODS = Kind("", "v1", "pods", "Pod", status=True)
LEASES = Kind("coordination.k8s.io", "v1", "leases", "Lease")
DAEMON_SETS = Kind("apps", "v1", "daemonsets", "DaemonSet", status=True)
RESOURCE_CLAIM_TEMPLATES = Kind(
    "resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate"
)
COMPUTE_DOMAINS = Kind(
    "resource.nvidia.com", "v1beta1", "computedomains", "ComputeDomain", status=True
)
# Events (events.k8s.io/v1): the agent only creates them (a claim whose GPU vanished,
# :mod:`dra_driver.driver.claimevents`), through its own port's ``create_event``.
EVENTS = Kind("events.k8s.io", "v1", "events", "Event")
KINDS = (PODS, LEASES, DAEMON_SETS, RESOURCE_CLAIM_TEMPLATES, COMPUTE_DOMAINS, EVENTS)


class ObjectApi(Protocol):
    """The verbs, with the API server's semantics. Errors are the port's
    :class:`~dra_driver.kube.api.ApiError` family: NotFound (404), Conflict (409: a stale
    ``resourceVersion``, a UID precondition, or ``reason == "AlreadyExists"``), Invalid
    (400/422), ApiError (403 RBAC or admission, 0 unreachable, 5xx)."""

    def get(self, kind: Kind, name: str, *, namespace: str | None = None) -> Obj: ...

    def list(
        self,
        kind: Kind,
        *,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
    ) -> tuple[list[Obj], str]:
        """The matching objects (``namespace`` None: all namespaces) and the list's
        resourceVersion, to watch from."""
        ...

    def create(self, kind: Kind, obj: Obj) -> Obj:
        """Create (``metadata.generateName`` honoured; namespace from the object)."""
        ...

    def update(self, kind: Kind, obj: Obj) -> Obj:
        """Replace; ``metadata.resourceVersion`` must be current. Status is left as it is on
        kinds with a status subresource. Removing the last finalizer of an object being
        deleted removes it."""
        ...

    def update_status(self, kind: Kind, obj: Obj) -> Obj:
        """Replace the status only (``.../status``); ``resourceVersion`` must be current."""
        ...

    def patch(self, kind: Kind, name: str, patch: Obj, *, namespace: str | None = None) -> Obj:
        """JSON merge patch (RFC 7386) of the object (status untouched where a subresource)."""
        ...

    def delete(
        self,
        kind: Kind,
        name: str,
        *,
        namespace: str | None = None,
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> None:
        """Delete, optionally only that incarnation (``uid``) or version. An object with
        finalizers is only marked (``deletionTimestamp``) until they are removed; objects
        whose every owner is gone are collected."""
        ...

    def watch(
        self,
        kind: Kind,
        *,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
        resource_version: str,
        timeout_s: float,
    ) -> Iterator[WatchEvent]:
        """Events after ``resource_version`` until ``timeout_s`` passes (the iterator ends)."""
        ...


def owner_reference(owner: Obj, *, controller: bool = True) -> Obj:
    """An ownerReference to ``owner`` (apiVersion, kind, name, uid), for garbage collection."""
    meta = owner["metadata"]
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": controller,
        "blockOwnerDeletion": False,
    }


def _q(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")
