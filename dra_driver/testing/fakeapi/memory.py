"""An in-memory Kubernetes API implementing the driver's :class:`~dra_driver.kube.api.KubeApi`.

Why it exists: no API server can be installed here, so this is the API every test and the demo
talk to, and it is only worth what it agrees with the real server on. It keeps the server's
behaviour where the driver depends on it: one global ``resourceVersion`` counter, 409 on a stale
update or delete precondition and on creating an existing name, 404, ``generateName``,
``metadata.generation`` bumped on spec changes, no-op updates that change nothing, watch events
from a given resourceVersion (410 when it is too old), field-selector filtering, strict decoding,
validation and defaulting (tests hold it to recorded server verdicts), the fields a server with
a DRA feature gate off drops (:mod:`.featuregates`), dry-run creates (nothing stored),
owner-reference garbage collection when a Node goes, and injected failures (5xx, 409,
0 = unreachable). Test helpers (``put_*``, ``calls``, ``writes``) are outside the port.
Thread-safe: one lock.
"""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Iterator

from dra_driver.apimachinery import strictdecode
from dra_driver.kube import api
from dra_driver.kube.objects import EVENTS
from dra_driver.slices import validate as slice_validate
from dra_driver.testing.fakeapi import featuregates, memstate, serverbits
from dra_driver.testing.fakeapi.memstate import WRITE_METHODS, Call

Obj = api.Obj
_SLICES = serverbits.SLICES
__all__ = ["WRITE_METHODS", "Call", "InMemoryApi"]


class InMemoryApi(memstate.ClusterState):
    """The API server's ResourceSlices, ResourceClaims, DeviceClasses, Nodes and Namespaces."""

    # ------------------------------------------------------------------ the KubeApi port
    def list_resource_slices(self, *, driver: str, node_name: str) -> tuple[list[Obj], str]:
        with self._lock:
            self._enter("list_resource_slices", node_name)
            items = [
                copy.deepcopy(s)
                for _, s in sorted(self._slices.items())
                if serverbits.slice_selected(s, driver, node_name)
            ]
            self.calls.append(Call("list_resource_slices", node_name, 200))
            return items, str(self._rv)

    def create_resource_slice(self, obj: Obj, *, dry_run: bool = False) -> Obj:
        """``dry_run`` (``?dryRun=All``): decoded, dropped, validated and answered as stored,
        without ``resourceVersion``, but nothing is stored, logged or counted as a write."""
        method = "dry_run_create_resource_slice" if dry_run else "create_resource_slice"
        with self._lock:
            new = self._decode_input(method, obj, "ResourceSlice")
            meta = new["metadata"]
            self._enter(method, meta.get("name") or meta.get("generateName") or "")
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = serverbits.generate_name(
                    meta["generateName"], self._slices, self._rng
                )
            new = self._drop_disabled(method, new, None)
            meta = new["metadata"]
            self._check(method, slice_validate.validate(new), "ResourceSlice", meta)
            name = meta["name"]
            if name in self._slices:
                raise self._fail(method, name, 409, f'{_SLICES} "{name}" already exists')
            serverbits.fill_taint_times(new)
            new = strictdecode.storage_form("ResourceSlice", new)
            meta = new["metadata"]
            if dry_run:
                meta.update(uid=str(uuid.uuid4()), creationTimestamp=serverbits.now(), generation=1)
                return self._ok(method, name, new, 201)
            self._new_meta(new)
            self._slices[name] = new
            self._log.append("ADDED", new)
            return self._ok(method, name, new, 201)

    def update_resource_slice(self, obj: Obj) -> Obj:
        method = "update_resource_slice"
        with self._lock:
            new = self._decode_input(method, obj, "ResourceSlice")
            meta = new["metadata"]
            name = meta.get("name") or ""
            self._enter(method, name)
            old = self._slices.get(name)
            if old is None:
                raise self._fail(method, name, 404, f'{_SLICES} "{name}" not found')
            self._precondition(method, name, old, meta.get("resourceVersion"), meta.get("uid"))
            sent = new
            new = self._drop_disabled(method, sent, old)
            meta = new["metadata"]
            self._check(method, slice_validate.validate_update(old, new), "ResourceSlice", meta)
            serverbits.fill_taint_times(new, old)
            new = strictdecode.storage_form("ResourceSlice", new)
            meta = new["metadata"]
            for key in ("uid", "creationTimestamp", "generation"):
                meta[key] = old["metadata"].get(key)
            meta["resourceVersion"] = old["metadata"]["resourceVersion"]
            changed = new.get("spec") != old.get("spec")
            if not changed and sent is not new:
                # The server bumps the generation by the spec it was sent, before dropping the
                # fields of gates that are off: resending them is a write, not a no-op.
                serverbits.fill_taint_times(sent, old)
                sent_spec = strictdecode.storage_form("ResourceSlice", sent).get("spec")
                changed = sent_spec != old.get("spec")
            if new == old and not changed:  # an update that changes nothing is a no-op
                return self._ok(method, name, old)
            if changed:
                meta["generation"] = int(meta.get("generation") or 0) + 1
            meta["resourceVersion"] = self._next_rv()
            self._slices[name] = new
            self._log.append("MODIFIED", new)
            return self._ok(method, name, new)

    def delete_resource_slice(self, name: str, *, resource_version: str | None = None) -> None:
        method = "delete_resource_slice"
        with self._lock:
            self._enter(method, name)
            old = self._slices.get(name)
            if old is None:
                raise self._fail(method, name, 404, f'{_SLICES} "{name}" not found')
            self._precondition(method, name, old, resource_version, None, deleting=True)
            self._remove_slice(name)
            self.calls.append(Call(method, name, 200))

    def watch_resource_slices(
        self, *, driver: str, node_name: str, resource_version: str, timeout_s: float
    ) -> Iterator[api.WatchEvent]:
        with self._lock:
            self._enter("watch_resource_slices", node_name)
            self.calls.append(Call("watch_resource_slices", node_name, 200))
            start = int(resource_version) if resource_version not in ("", "0") else None
            initial = (
                []
                if start is not None
                else [
                    copy.deepcopy(s)
                    for s in self._slices.values()
                    if serverbits.slice_selected(s, driver, node_name)
                ]
            )
            return self._log.watch(
                position=start if start is not None else self._rv,
                initial=initial,
                deadline=time.monotonic() + timeout_s,
                selected=lambda obj: serverbits.slice_selected(obj, driver, node_name),
            )

    def create_event(self, namespace: str, event: Obj) -> Obj:
        """An ``events.k8s.io/v1`` Event, as the server stores it (its rules: :mod:`.events`);
        the namespace in the object, if any, must be ``namespace`` (400, as over HTTP)."""
        meta = event.get("metadata") if isinstance(event, dict) else None
        if isinstance(meta, dict) and meta.get("namespace") not in (None, "", namespace):
            raise api.Invalid(
                "the namespace of the provided object does not match the namespace sent on the "
                "request",
                status=400,
            )
        new = copy.deepcopy(event)
        new.setdefault("metadata", {})["namespace"] = namespace
        return self.objects.create(EVENTS, new)

    # ------------------------------------------------------------------ beyond the port
    def list_events(self, namespace: str, *, field_selector: str = "") -> list[Obj]:
        """Test helper: the Events of ``namespace`` (``regarding.uid=...`` and friends)."""
        return self.objects.list(EVENTS, namespace=namespace, field_selector=field_selector)[0]

    def get_resource_slice(self, name: str) -> Obj:
        with self._lock:
            found = self._slices.get(name)
            if found is None:
                raise api.NotFound(f'{_SLICES} "{name}" not found')
            return copy.deepcopy(found)

    def all_resource_slices(self) -> list[Obj]:
        """Every slice of every driver and node, sorted by name (no call recorded)."""
        with self._lock:
            return [copy.deepcopy(s) for _, s in sorted(self._slices.items())]

    def put_resource_slice(self, obj: Obj) -> Obj:
        """Test helper: write a slice as another client would (validated, not counted)."""
        with self._lock:
            name = obj["metadata"]["name"]
            saved, faults = list(self.calls), self._faults
            self._faults = []
            try:
                if name in self._slices:
                    new = copy.deepcopy(obj)
                    new["metadata"].pop("resourceVersion", None)
                    return self.update_resource_slice(new)
                return self.create_resource_slice(obj)
            finally:
                self.calls, self._faults = saved, faults

    def remove_resource_slice(self, name: str) -> None:
        """Test helper: delete a slice as another client would (not counted)."""
        with self._lock:
            if name not in self._slices:
                raise api.NotFound(f'{_SLICES} "{name}" not found')
            self._remove_slice(name)

    def end_watches(self) -> None:
        """Close every open watch stream (as a server restart or timeout would)."""
        with self._lock:
            self._log.end_watches()
            self.objects.end_watches()

    def close(self) -> None:
        with self._lock:
            self._log.close()
            self.objects.close()

    @property
    def writes(self) -> int:
        """Create/update/delete calls on ResourceSlices so far, failed ones included."""
        with self._lock:
            return sum(1 for c in self.calls if c.method in WRITE_METHODS)

    @property
    def resource_version(self) -> str:
        with self._lock:
            return str(self._rv)

    # ------------------------------------------------------------------ internals
    def _drop_disabled(self, method: str, new: Obj, old: Obj | None) -> Obj:
        """``new`` without the fields of the gates that are off (:mod:`.featuregates`): after
        strict decoding (a malformed dropped field is still a 400), before validation."""
        if not self.disabled_gates:
            return new
        errors = strictdecode.decode_errors("ResourceSlice", new)
        self._check(method, errors, "ResourceSlice", new["metadata"])
        return featuregates.drop_disabled_fields(new, old, self.disabled_gates)

    def _precondition(
        self,
        method: str,
        name: str,
        old: Obj,
        rv: str | None,
        uid: str | None,
        *,
        deleting: bool = False,
    ) -> None:
        message = serverbits.precondition_failure(name, old["metadata"], rv, uid, deleting=deleting)
        if message is not None:
            raise self._fail(method, name, 409, message)
