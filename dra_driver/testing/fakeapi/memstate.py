"""State and bookkeeping of the in-memory Kubernetes API, and its cluster objects.

Why it exists: :mod:`dra_driver.testing.fakeapi.memory` is the in-memory API server; this is its
lower half — the lock, the global ``resourceVersion`` counter, the call log and injected failures,
metadata stamping, and the objects other than ResourceSlices (ResourceClaims with the server's
defaulting and validation, DeviceClasses, Nodes with owner-reference garbage collection and
label patches (:mod:`.nodes`), Namespaces with the labels admission checks read). Split out to
keep each module readable.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import random
import threading
import uuid
from collections.abc import Iterable
from typing import Any

from dra_driver.apimachinery import fielderrors, strictdecode
from dra_driver.kube import api
from dra_driver.testing.fakeapi import (
    admission,
    claimstatus,
    eventlog,
    featuregates,
    nodes,
    objects,
    serverbits,
)

Obj = api.Obj
WRITE_METHODS = frozenset(
    {"create_resource_slice", "update_resource_slice", "delete_resource_slice"}
)
_CLAIMS = "resourceclaims.resource.k8s.io"


@dataclasses.dataclass(slots=True)
class Call:
    """One port call as the tests see it: method, object name, HTTP-like outcome."""

    method: str
    name: str
    status: int  # 200/201 on success, else the error status


@dataclasses.dataclass(slots=True)
class _Fault:
    method: str
    status: int
    remaining: int
    message: str


class ClusterState:
    """Everything but the ResourceSlice operations; see :class:`~.memory.InMemoryApi`."""

    def __init__(
        self,
        *,
        cel: admission.CelCompiler | None = None,
        use_default_cel: bool = True,
        seed: int = 0,
        history: int = 10_000,
        disabled_gates: Iterable[str] = (),
    ) -> None:
        """``disabled_gates``: DRA feature gates off, whose ResourceSlice fields are dropped as
        a real server with them off drops them (:mod:`.featuregates`); none: all on."""
        self.disabled_gates = featuregates.checked(disabled_gates)
        self._lock = threading.Condition(threading.RLock())
        self._rv = 0
        self._rng = random.Random(seed)
        self._cel = (
            cel if cel is not None or not use_default_cel else (admission.default_cel_compiler())
        )
        self._slices: dict[str, Obj] = {}  # served by the subclass
        self._claims: dict[tuple[str, str], Obj] = {}
        # Who owns which status.devices entry of a claim (server-side apply, :mod:`.claimstatus`).
        self._status_owners: dict[tuple[str, str], claimstatus.Owners] = {}
        self._classes: dict[str, Obj] = {}
        self._nodes: dict[str, Obj] = {}
        self._namespaces: dict[str, dict[str, str]] = {"default": {}, "kube-system": {}}
        self._log = eventlog.EventLog(self._lock, history=history)
        self._faults: list[_Fault] = []
        self.calls: list[Call] = []
        # Every other kind (Pods, Leases, DaemonSets, claim templates, custom kinds).
        self.objects = objects.ObjectStore(self)

    def get_resource_claim(self, namespace: str, name: str) -> Obj:
        with self._lock:
            self._enter("get_resource_claim", name)
            claim = self._claims.get((namespace, name))
            if claim is None:
                raise self._fail("get_resource_claim", name, 404, f'{_CLAIMS} "{name}" not found')
            return self._ok("get_resource_claim", name, claim)

    def list_resource_claims(self, namespace: str | None = None) -> tuple[list[Obj], str]:
        """The claims of ``namespace`` (None: of all), sorted by namespace and name."""
        with self._lock:
            self._enter("list_resource_claims", namespace or "")
            items = [
                copy.deepcopy(c)
                for key, c in sorted(self._claims.items())
                if namespace is None or key[0] == namespace
            ]
            self._record("list_resource_claims", namespace or "")
            return items, str(self._rv)

    def get_node(self, name: str) -> Obj:
        with self._lock:
            self._enter("get_node", name)
            node = self._nodes.get(name)
            if node is None:
                raise self._fail("get_node", name, 404, f'nodes "{name}" not found')
            return self._ok("get_node", name, node)

    def patch_node(self, name: str, patch: Obj) -> Obj:
        """JSON merge patch of a Node, as the server applies it (:mod:`.nodes`)."""
        with self._lock:
            self._enter("patch_node", name)
            try:
                return self._ok("patch_node", name, self._patch_node(name, patch))
            except api.ApiError as exc:
                self.calls.append(Call("patch_node", name, exc.status))
                raise

    def label_node(self, name: str, labels: dict[str, str | None]) -> Obj:
        """Test helper: change a Node's labels as another client would (``None`` removes)."""
        with self._lock:
            return copy.deepcopy(self._patch_node(name, {"metadata": {"labels": labels}}))

    def _patch_node(self, name: str, patch: Obj) -> Obj:
        old = self._nodes.get(name)
        if old is None:
            raise api.NotFound(f'nodes "{name}" not found')
        new = nodes.apply(name, old, json.loads(json.dumps(patch)))
        if new != old:  # a patch that changes nothing is a no-op: same resourceVersion
            new["metadata"]["resourceVersion"] = self._next_rv()
            self._nodes[name] = new
        return self._nodes[name]

    def apply_resource_claim_status(
        self, namespace: str, name: str, patch: Obj, field_manager: str, *, force: bool = True
    ) -> Obj:
        """Server-side apply of ``status.devices`` by ``field_manager`` (:mod:`.claimstatus`:
        validation and per-manager ownership of the entries); a change bumps resourceVersion.
        With DRAResourceClaimDeviceStatus off the entries are dropped, as the real server does."""
        method = "apply_resource_claim_status"
        if "DRAResourceClaimDeviceStatus" in self.disabled_gates:
            patch = {**patch, "status": {**(patch.get("status") or {}), "devices": []}}
        with self._lock:
            self._enter(method, name)
            key = (namespace, name)
            old = self._claims.get(key)
            if old is None:
                raise self._fail(method, name, 404, f'{_CLAIMS} "{name}" not found')
            try:
                new, owners = claimstatus.apply(
                    old,
                    json.loads(json.dumps(patch)),
                    manager=field_manager,
                    force=force,
                    owners=self._status_owners.get(key, {}),
                )
            except claimstatus.ApplyError as exc:
                raise self._fail(method, name, exc.status, str(exc)) from None
            self._status_owners[key] = owners
            if new != old:
                new["metadata"]["resourceVersion"] = self._next_rv()
                self._claims[key] = new
            return self._ok(method, name, self._claims[key])

    def status_owners(self, namespace: str, name: str) -> claimstatus.Owners:
        """Test helper: which manager owns which ``status.devices`` entry."""
        with self._lock:
            return copy.deepcopy(self._status_owners.get((namespace, name), {}))

    def create_resource_claim(self, obj: Obj) -> Obj:
        """POST a ResourceClaim with the server's defaulting and validation."""
        with self._lock:
            new = self._decode_input("create_resource_claim", obj, "ResourceClaim")
            new.pop("status", None)
            meta = new["metadata"]
            namespace = meta.get("namespace") or "default"
            meta["namespace"] = namespace
            if namespace not in self._namespaces:
                raise self._fail(
                    "create_resource_claim",
                    meta.get("name") or "",
                    404,
                    f'namespaces "{namespace}" not found',
                )
            if not meta.get("name") and meta.get("generateName"):
                taken = {n for (ns, n) in self._claims if ns == namespace}
                meta["name"] = serverbits.generate_name(meta["generateName"], taken, self._rng)
            admission.default_claim(new)
            errors = admission.validate_claim(
                new, namespace_labels=self._namespaces[namespace], cel=self._cel
            )
            self._check("create_resource_claim", errors, "ResourceClaim", meta)
            key = (namespace, meta["name"])
            if key in self._claims:
                message = f'{_CLAIMS} "{key[1]}" already exists'
                raise self._fail("create_resource_claim", key[1], 409, message)
            new = strictdecode.storage_form("ResourceClaim", new)
            self._new_meta(new)
            self._claims[key] = new
            return self._ok("create_resource_claim", key[1], new, 201)

    def create_device_class(self, obj: Obj) -> Obj:
        """POST a DeviceClass with the server's validation."""
        with self._lock:
            new = self._decode_input("create_device_class", obj, "DeviceClass")
            meta = new["metadata"]
            errors = admission.validate_device_class(new, cel=self._cel)
            self._check("create_device_class", errors, "DeviceClass", meta)
            name = meta["name"]
            if name in self._classes:
                raise self._fail(
                    "create_device_class",
                    name,
                    409,
                    f'deviceclasses.resource.k8s.io "{name}" already exists',
                )
            new = strictdecode.storage_form("DeviceClass", new)
            self._new_meta(new)
            self._classes[name] = new
            return self._ok("create_device_class", name, new, 201)

    def get_device_class(self, name: str) -> Obj:
        with self._lock:
            found = self._classes.get(name)
            if found is None:
                raise api.NotFound(f'deviceclasses.resource.k8s.io "{name}" not found')
            return copy.deepcopy(found)

    def put_resource_claim(self, obj: Obj) -> Obj:
        """Test helper: store a claim (status included) as given plus server defaults."""
        with self._lock:
            new = copy.deepcopy(obj)
            new.setdefault("apiVersion", "resource.k8s.io/v1")
            new.setdefault("kind", "ResourceClaim")
            meta = new.setdefault("metadata", {})
            meta.setdefault("namespace", "default")
            self._namespaces.setdefault(meta["namespace"], {})
            admission.default_claim(new)
            old = self._claims.get((meta["namespace"], meta["name"]))
            if old is not None:
                meta.setdefault("uid", old["metadata"]["uid"])
            self._new_meta(new, keep_uid=True)
            self._claims[(meta["namespace"], meta["name"])] = new
            if old is None or old["metadata"]["uid"] != meta["uid"]:  # a new claim: no owners
                self._status_owners.pop((meta["namespace"], meta["name"]), None)
            return copy.deepcopy(new)

    def delete_resource_claim(self, namespace: str, name: str) -> None:
        """Test helper: remove a claim (NotFound when absent)."""
        with self._lock:
            self._status_owners.pop((namespace, name), None)
            if self._claims.pop((namespace, name), None) is None:
                raise api.NotFound(f'{_CLAIMS} "{name}" not found')

    def put_node(
        self, name: str, *, uid: str | None = None, labels: dict[str, str] | None = None
    ) -> Obj:
        """Test helper: create or replace a Node."""
        with self._lock:
            node: Obj = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": dict(labels or {})},
            }
            if uid is not None:
                node["metadata"]["uid"] = uid
            self._new_meta(node, keep_uid=True)
            self._nodes[name] = node
            return copy.deepcopy(node)

    def delete_node(self, name: str) -> None:
        """Test helper: delete a Node; its owned ResourceSlices are garbage-collected."""
        with self._lock:
            node = self._nodes.pop(name)
            uid = node["metadata"]["uid"]
            for slice_name, obj in list(self._slices.items()):
                refs = obj["metadata"].get("ownerReferences") or ()
                if any(r.get("uid") == uid for r in refs):
                    self._remove_slice(slice_name)
            self.objects.collect_garbage()

    def restart_with_gates(self, disabled_gates: Iterable[str]) -> None:
        """Test helper: the server back with other DRA gates off; stored objects stay, as in
        etcd (how a slice written with a gate on meets a server with it off); watches end."""
        with self._lock:
            self.disabled_gates = featuregates.checked(disabled_gates)
            self._log.end_watches()

    def put_namespace(self, name: str, labels: dict[str, str] | None = None) -> None:
        with self._lock:
            self._namespaces[name] = dict(labels or {})

    def fail_next(self, method: str, status: int = 500, times: int = 1, message: str = "") -> None:
        """Make the next ``times`` calls of ``method`` ("*" = any) fail with ``status``."""
        with self._lock:
            text = message or (
                "connection refused" if status == 0 else f"injected failure {status} for {method}"
            )
            self._faults.append(_Fault(method, status, times, text))

    def clear_faults(self) -> None:
        """Forget every failure :meth:`fail_next` injected that has not happened yet."""
        with self._lock:
            self._faults = []

    def reset_calls(self) -> None:
        with self._lock:
            self.calls.clear()

    # ------------------------------------------------------------------ internals
    def _enter(self, method: str, name: str) -> None:
        for fault in self._faults:
            if fault.method in (method, "*") and fault.remaining > 0:
                fault.remaining -= 1
                self._faults = [f for f in self._faults if f.remaining > 0]
                raise self._fail(method, name, fault.status, fault.message)

    def _fail(self, method: str, name: str, status: int, message: str) -> api.ApiError:
        self.calls.append(Call(method, name, status))
        return serverbits.error_for(status, message)

    def _record(self, method: str, name: str, status: int = 200) -> None:
        self.calls.append(Call(method, name, status))

    def owner_uids(self) -> set[str]:
        """The uids of the objects of this store that may own others (garbage collection)."""
        with self._lock:
            found = {o["metadata"]["uid"] for o in self._nodes.values()}
            found |= {o["metadata"]["uid"] for o in self._claims.values()}
            return found | {o["metadata"]["uid"] for o in self._slices.values()}

    def _ok(self, method: str, name: str, obj: Obj, status: int = 200) -> Obj:
        self.calls.append(Call(method, name, status))
        return copy.deepcopy(obj)

    def _decode_input(self, method: str, obj: Obj, kind: str) -> Obj:
        try:
            new: Obj = json.loads(json.dumps(obj))
        except (TypeError, ValueError) as exc:
            raise self._fail(method, "", 400, f"{kind} is not JSON: {exc}") from exc
        if not isinstance(new, dict):
            raise self._fail(method, "", 400, f"{kind} must be a JSON object")
        new.setdefault("apiVersion", "resource.k8s.io/v1")
        new.setdefault("kind", kind)
        if not isinstance(new.get("metadata"), dict):
            new["metadata"] = {}
        return new

    def _check(
        self, method: str, errors: list[fielderrors.FieldError], kind: str, meta: dict[str, Any]
    ) -> None:
        if errors:
            status, message = fielderrors.status_message(
                kind, str(meta.get("name") or meta.get("generateName") or ""), errors
            )
            raise self._fail(method, str(meta.get("name") or ""), status, message)

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _new_meta(self, obj: Obj, *, keep_uid: bool = False) -> None:
        meta = obj["metadata"]
        if not (keep_uid and meta.get("uid")):
            meta["uid"] = str(uuid.UUID(int=self._rng.getrandbits(128), version=4))
        meta["creationTimestamp"] = serverbits.now()
        meta["generation"] = 1
        meta["resourceVersion"] = self._next_rv()

    def _remove_slice(self, name: str) -> None:
        gone = self._slices.pop(name)
        gone["metadata"]["resourceVersion"] = self._next_rv()
        self._log.append("DELETED", gone)
