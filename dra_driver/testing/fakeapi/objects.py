"""The in-memory API's generic object store: Pods, Leases, DaemonSets, claim templates, CRDs.

Why it exists: the MPS daemon Pods and the ComputeDomain controller own objects of kinds the
slice/claim store does not model. What the driver depends on is the generic machinery of the
API server, the same for every kind, so it is kept once: ``generateName``, uid /
``resourceVersion`` / ``creationTimestamp`` / ``generation``, 409 AlreadyExists and stale
``resourceVersion``, UID preconditions, the status subresource (main writes keep status, status
writes keep the rest), finalizers (a delete only marks ``deletionTimestamp`` until the last one
goes), owner-reference garbage collection (an object whose every owner is gone — in this store
or a Node of the cluster — is collected, as the garbage collector would), label and field
selectors, watches with 410 when history is gone, ``dryRun``, injected failures (the store's
``fail_next`` names ``create_pods``, ``delete_leases``, ...), and strict schema validation:
built-in kinds against the Kubernetes 1.36 schemas (``kubernetes-validate``; Events also by
the server's own rules, :mod:`.events`), custom kinds
through a validator registered with :meth:`ObjectStore.register`. Admission rules (what an agent
may create) are hooks added by the tests or the rig (:meth:`ObjectStore.add_admission`).
A Pod is removed at once on delete (grace period 0: no kubelet here confirms its end).
"""

from __future__ import annotations

import builtins
import copy
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from dra_driver.kube import api
from dra_driver.kube.objects import EVENTS, KINDS, Kind
from dra_driver.testing.fakeapi import eventlog, events, nodes, selectors, serverbits

Obj = api.Obj
Validator = serverbits.Validator
# (verb, kind, new object or None, old object or None) -> raise ApiError to refuse
Admission = Callable[[str, Kind, Obj | None, Obj | None], None]


class Cluster(Protocol):
    """What the store shares with the cluster state (:class:`~.memstate.ClusterState`): one
    lock, one resourceVersion counter, the call log and injected failures, input decoding."""

    _lock: threading.Condition
    _rv: int
    _rng: random.Random

    def _enter(self, method: str, name: str) -> None: ...
    def _fail(self, method: str, name: str, status: int, message: str) -> api.ApiError: ...
    def _ok(self, method: str, name: str, obj: Obj, status: int = 200) -> Obj: ...
    def _record(self, method: str, name: str, status: int = 200) -> None: ...
    def _decode_input(self, method: str, obj: Obj, kind: str) -> Obj: ...
    def _new_meta(self, obj: Obj, *, keep_uid: bool = False) -> None: ...
    def _next_rv(self) -> str: ...
    def owner_uids(self) -> set[str]: ...


class ObjectStore:
    """Objects by (kind, namespace, name); shares the cluster's lock and resourceVersion."""

    def __init__(self, cluster: Cluster) -> None:
        """``cluster``: the :class:`~.memstate.ClusterState` (lock, counter, rng, faults)."""
        self._cluster = cluster
        self._lock = cluster._lock
        self._kinds: dict[tuple[str, str, str], Kind] = {}
        self._validators: dict[Kind, Validator | None] = {}
        self._objects: dict[tuple[Kind, str, str], Obj] = {}
        self._admission: list[Admission] = []
        self._log = eventlog.EventLog(self._lock)
        for kind in KINDS:
            self.register(kind)
        self.register(EVENTS, events.validate)  # the server's Event rules, then the schema

    # ------------------------------------------------------------------ set-up
    def register(self, kind: Kind, validator: Validator | None = None) -> None:
        """Serve ``kind``; ``validator`` (custom kinds: their CRD schema) returns errors."""
        with self._lock:
            self._kinds[(kind.group, kind.version, kind.plural)] = kind
            self._validators[kind] = validator

    def add_admission(self, hook: Admission) -> None:
        with self._lock:
            self._admission.append(hook)

    def kind_for(self, group: str, version: str, plural: str) -> Kind:
        found = self._kinds.get((group, version, plural))
        if found is None:
            raise api.NotFound("the server could not find the requested resource")
        return found

    # ------------------------------------------------------------------ the verbs
    def get(self, kind: Kind, name: str, *, namespace: str | None = None) -> Obj:
        with self._lock:
            self._cluster._enter(f"get_{kind.plural}", name)
            return self._ok(f"get_{kind.plural}", name, self._find(kind, namespace, name))

    def list(
        self,
        kind: Kind,
        *,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
    ) -> tuple[list[Obj], str]:
        match = selectors.matcher(label_selector, field_selector, kind=kind.kind)
        with self._lock:
            self._cluster._enter(f"list_{kind.plural}", namespace or "")
            items = [
                copy.deepcopy(o)
                for (k, ns, _), o in sorted(self._objects.items(), key=lambda i: i[0][1:])
                if k == kind and (not namespace or ns == namespace) and match(o)
            ]
            self._cluster._record(f"list_{kind.plural}", namespace or "")
            return items, str(self._cluster._rv)

    def create(self, kind: Kind, obj: Obj, *, dry_run: bool = False) -> Obj:
        method = f"create_{kind.plural}"
        with self._lock:
            new = self._decode(method, kind, obj)
            meta = new["metadata"]
            self._cluster._enter(method, meta.get("name") or meta.get("generateName") or "")
            namespace = self._namespace(method, kind, meta)
            if not meta.get("name") and meta.get("generateName"):
                taken = {n for k, ns, n in self._objects if k == kind and ns == namespace}
                meta["name"] = serverbits.generate_name(
                    meta["generateName"], taken, self._cluster._rng
                )
            name = str(meta.get("name") or "")
            if not name:
                raise self._cluster._fail(method, "", 422, "metadata.name: Required value")
            for key in ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp"):
                meta.pop(key, None)
            if kind.status:
                new.pop("status", None)
            self._admit(method, "create", kind, new, None)
            self._validate(method, kind, new)
            if (kind, namespace, name) in self._objects:
                self._cluster._record(method, name, 409)
                raise api.Conflict(
                    f'{kind.resource} "{name}" already exists', reason="AlreadyExists"
                )
            if dry_run:
                return self._ok(method, name, new, 201)
            self._cluster._new_meta(new)
            self._objects[(kind, namespace, name)] = new
            self._log.append("ADDED", new)
            return self._ok(method, name, new, 201)

    def update(self, kind: Kind, obj: Obj, *, status: bool = False) -> Obj:
        method = f"update_{kind.plural}{'_status' if status else ''}"
        with self._lock:
            new = self._decode(method, kind, obj)
            meta = new["metadata"]
            name = str(meta.get("name") or "")
            self._cluster._enter(method, name)
            namespace = self._namespace(method, kind, meta)
            old = self._find(kind, namespace, name)
            if not meta.get("resourceVersion"):
                raise self._cluster._fail(
                    method,
                    name,
                    422,
                    f'{kind.kind} "{name}" is invalid: metadata.resourceVersion: Invalid '
                    "value: 0: must be specified for an update",
                )
            self._precondition(method, old, meta.get("resourceVersion"), meta.get("uid"))
            if status:  # the status subresource: everything but status stays
                new = {**copy.deepcopy(old), "status": new.get("status") or {}}
            else:
                for key in ("uid", "creationTimestamp", "deletionTimestamp", "generation"):
                    if key in old["metadata"]:
                        meta[key] = old["metadata"][key]
                    else:
                        meta.pop(key, None)
                if kind.status:
                    new["status"] = copy.deepcopy(old.get("status"))
                    if new["status"] is None:
                        new.pop("status")
            return self._replace(method, kind, namespace, old, new)

    def update_status(self, kind: Kind, obj: Obj) -> Obj:
        return self.update(kind, obj, status=True)

    def patch(self, kind: Kind, name: str, patch: Obj, *, namespace: str | None = None) -> Obj:
        method = f"patch_{kind.plural}"
        with self._lock:
            self._cluster._enter(method, name)
            old = self._find(kind, namespace, name)
            if not isinstance(patch, dict):
                raise self._cluster._fail(method, name, 400, "a merge patch is a JSON object")
            patch = copy.deepcopy(patch)
            meta = patch.get("metadata") or {}
            if isinstance(meta, dict) and meta.get("resourceVersion"):
                self._precondition(method, old, meta["resourceVersion"], None)
            if kind.status:
                patch.pop("status", None)
            new = nodes.merge_patch(copy.deepcopy(old), patch)
            return self._replace(method, kind, old["metadata"].get("namespace") or "", old, new)

    def delete(
        self,
        kind: Kind,
        name: str,
        *,
        namespace: str | None = None,
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> None:
        method = f"delete_{kind.plural}"
        with self._lock:
            self._cluster._enter(method, name)
            old = self._find(kind, namespace, name)
            self._precondition(method, old, resource_version, uid, deleting=True)
            self._admit(method, "delete", kind, None, old)
            self._cluster._record(method, name)
            self._delete(kind, old)
            self.collect_garbage()

    def watch(
        self,
        kind: Kind,
        *,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
        resource_version: str,
        timeout_s: float,
    ) -> Iterator[api.WatchEvent]:
        match = selectors.matcher(label_selector, field_selector, kind=kind.kind)

        def selected(obj: Obj) -> bool:
            meta = obj["metadata"]
            return (
                obj.get("kind") == kind.kind
                and obj.get("apiVersion") == kind.api_version
                and (not namespace or meta.get("namespace") == namespace)
                and match(obj)
            )

        with self._lock:
            self._cluster._enter(f"watch_{kind.plural}", namespace or "")
            initial: builtins.list[Obj] = []
            if resource_version in ("", "0"):
                initial = [copy.deepcopy(o) for o in self._objects.values() if selected(o)]
                position = self._cluster._rv
            else:
                position = int(resource_version)
            return self._log.watch(
                position=position,
                initial=initial,
                deadline=time.monotonic() + timeout_s,
                selected=selected,
            )

    # ------------------------------------------------------------------ helpers for tests
    def all(self, kind: Kind) -> builtins.list[Obj]:
        """Every object of ``kind`` (no call recorded, no faults)."""
        with self._lock:
            return [copy.deepcopy(o) for (k, _, _), o in self._objects.items() if k == kind]

    def collect_garbage(self) -> None:
        """Collect every object whose owners are all gone (the garbage collector's job)."""
        with self._lock:
            while True:
                alive = {o["metadata"]["uid"] for o in self._objects.values()}
                alive |= self._cluster.owner_uids()
                orphans = [
                    (k, o)
                    for (k, _, _), o in self._objects.items()
                    if (refs := o["metadata"].get("ownerReferences"))
                    and not any(r.get("uid") in alive for r in refs)
                    and not o["metadata"].get("deletionTimestamp")
                ]
                if not orphans:
                    return
                for kind, obj in orphans:
                    self._delete(kind, obj)

    def end_watches(self) -> None:
        with self._lock:
            self._log.end_watches()

    def close(self) -> None:
        with self._lock:
            self._log.close()

    # ------------------------------------------------------------------ internals
    def _find(self, kind: Kind, namespace: str | None, name: str) -> Obj:
        found = self._objects.get((kind, (namespace or "") if kind.namespaced else "", name))
        if found is None:
            raise self._cluster._fail(
                f"get_{kind.plural}", name, 404, f'{kind.resource} "{name}" not found'
            )
        return found

    def _namespace(self, method: str, kind: Kind, meta: dict[str, Any]) -> str:
        if not kind.namespaced:
            meta.pop("namespace", None)
            return ""
        namespace = str(meta.get("namespace") or "")
        if not namespace:
            raise self._cluster._fail(method, "", 400, "the namespace of the object is missing")
        return namespace

    def _decode(self, method: str, kind: Kind, obj: Obj) -> Obj:
        new = self._cluster._decode_input(method, obj, kind.kind)
        if new.get("apiVersion") != kind.api_version or new.get("kind") != kind.kind:
            raise self._cluster._fail(
                method,
                "",
                400,
                f"the body is a {new.get('kind')} of {new.get('apiVersion')}, not a {kind.kind} "
                f"of {kind.api_version}",
            )
        return new

    def _validate(self, method: str, kind: Kind, obj: Obj) -> None:
        errors = serverbits.schema_errors(kind, obj, self._validators.get(kind))
        if errors:
            name = obj["metadata"].get("name") or ""
            qualified = f"{kind.kind}.{kind.group}" if kind.group else kind.kind  # as the server
            message = f'{qualified} "{name}" is invalid: ' + "; ".join(errors)
            raise self._cluster._fail(method, name, 422, message)

    def _admit(self, method: str, verb: str, kind: Kind, new: Obj | None, old: Obj | None) -> None:
        for hook in self._admission:
            try:
                hook(verb, kind, new, old)
            except api.ApiError as exc:
                name = ((new or old or {}).get("metadata") or {}).get("name") or ""
                raise self._cluster._fail(method, name, exc.status, str(exc)) from exc

    def _precondition(
        self,
        method: str,
        old: Obj,
        rv: str | None,
        uid: str | None,
        *,
        deleting: bool = False,
    ) -> None:
        name = old["metadata"]["name"]
        message = serverbits.precondition_failure(name, old["metadata"], rv, uid, deleting=deleting)
        if message is not None:
            raise self._cluster._fail(method, name, 409, message)

    def _replace(self, method: str, kind: Kind, namespace: str, old: Obj, new: Obj) -> Obj:
        name = old["metadata"]["name"]
        meta = new["metadata"]
        meta["resourceVersion"] = old["metadata"]["resourceVersion"]
        if new == old:  # a no-op write changes nothing, not even the resourceVersion
            return self._ok(method, name, old)
        self._admit(method, "update", kind, new, old)
        self._validate(method, kind, new)
        if {k: v for k, v in new.items() if k not in ("metadata", "status")} != {
            k: v for k, v in old.items() if k not in ("metadata", "status")
        }:
            meta["generation"] = int(old["metadata"].get("generation") or 1) + 1
        meta["resourceVersion"] = self._cluster._next_rv()
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            del self._objects[(kind, namespace, name)]
            self._log.append("DELETED", new)
            self.collect_garbage()
            return self._ok(method, name, new)
        self._objects[(kind, namespace, name)] = new
        self._log.append("MODIFIED", new)
        return self._ok(method, name, new)

    def _delete(self, kind: Kind, old: Obj) -> None:
        meta = old["metadata"]
        key = (kind, meta.get("namespace") or "", meta["name"])
        if meta.get("finalizers"):
            if not meta.get("deletionTimestamp"):
                meta["deletionTimestamp"] = serverbits.now()
                meta["deletionGracePeriodSeconds"] = 0
                meta["resourceVersion"] = self._cluster._next_rv()
                self._log.append("MODIFIED", old)
            return
        del self._objects[key]
        meta["resourceVersion"] = self._cluster._next_rv()
        self._log.append("DELETED", old)

    def _ok(self, method: str, name: str, obj: Obj, status: int = 200) -> Obj:
        return self._cluster._ok(method, name, obj, status)
