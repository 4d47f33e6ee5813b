"""The REST paths of the in-memory API's generic kinds (:mod:`.objects`).

Why it exists apart from :mod:`.resthandler`: the slice/claim/node routes there are hand-made for
the agent's hot path; every other kind is served the same generic way — collection and object
paths, the status subresource, list or watch by selectors, ``dryRun``, DeleteOptions
preconditions — and this module maps those requests onto the store's verbs.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

from dra_driver.kube import api
from dra_driver.kube.objects import Kind
from dra_driver.testing.fakeapi.objects import ObjectStore

_PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[a-z0-9]+)"
    r"(?:/(?P<name>[^/]+)(?:/(?P<sub>status))?)?$"
)


class Handler(Protocol):
    def _json(self, code: int, obj: Any) -> None: ...
    def _stream(self, events: Any) -> None: ...
    def _patch_body(self, body: Any) -> Any: ...


def serve(
    store: ObjectStore,
    handler: Handler,
    method: str,
    path: str,
    query: dict[str, str],
    body: Any,
) -> bool:
    """Answer the request if ``path`` names a served kind; False when it names none."""
    found = _PATH.match(path)
    if not found:
        return False
    group, version = ("", "v1") if found["core"] else (found["group"], found["version"])
    try:
        kind = store.kind_for(group, version, found["plural"])
    except api.NotFound:
        return False
    namespace, name, sub = found["ns"], found["name"], found["sub"]
    if kind.namespaced is False and namespace:
        return False
    dry_run = query.get("dryRun") == "All"
    if name is None:
        _collection(store, handler, kind, method, namespace, query, body, dry_run)
    elif method == "GET" and not sub:
        handler._json(200, store.get(kind, name, namespace=namespace))
    elif method == "PUT":
        _same_name(body, name)
        _same_namespace(kind, body, namespace)
        handler._json(200, store.update(kind, body, status=sub == "status"))
    elif method == "PATCH" and not sub:
        handler._json(200, store.patch(kind, name, handler._patch_body(body), namespace=namespace))
    elif method == "DELETE" and not sub:
        pre = (body or {}).get("preconditions") or {}
        store.delete(
            kind,
            name,
            namespace=namespace,
            uid=pre.get("uid"),
            resource_version=pre.get("resourceVersion"),
        )
        details = {"name": name, "group": kind.group, "kind": kind.plural}
        handler._json(
            200, {"kind": "Status", "apiVersion": "v1", "status": "Success", "details": details}
        )
    else:
        raise api.ApiError(405, f"method {method} not allowed here", reason="MethodNotAllowed")
    return True


def _collection(
    store: ObjectStore,
    handler: Handler,
    kind: Kind,
    method: str,
    namespace: str | None,
    query: dict[str, str],
    body: Any,
    dry_run: bool,
) -> None:
    labels, fields = query.get("labelSelector", ""), query.get("fieldSelector", "")
    if method == "POST":
        if not isinstance(body, dict):
            raise api.Invalid("the body must be a JSON object", status=400)
        _same_namespace(kind, body, namespace)
        handler._json(201, store.create(kind, body, dry_run=dry_run))
    elif method == "GET" and query.get("watch") not in (None, "", "0", "false"):
        events = store.watch(
            kind,
            namespace=namespace,
            label_selector=labels,
            field_selector=fields,
            resource_version=query.get("resourceVersion", ""),
            timeout_s=float(query.get("timeoutSeconds") or 1800),
        )
        handler._stream(events)
    elif method == "GET":
        items, rv = store.list(
            kind, namespace=namespace, label_selector=labels, field_selector=fields
        )
        listed = {"kind": f"{kind.kind}List", "apiVersion": kind.api_version}
        handler._json(200, {**listed, "metadata": {"resourceVersion": rv}, "items": items})
    else:
        raise api.ApiError(405, f"method {method} not allowed here", reason="MethodNotAllowed")


def _same_name(body: Any, name: str) -> None:
    if ((body or {}).get("metadata") or {}).get("name") != name:
        raise api.Invalid(
            "metadata.name: Invalid value: the name of the object does not match the name on "
            "the URL",
            status=400,
        )


def _same_namespace(kind: Kind, body: dict[str, Any], namespace: str | None) -> None:
    if not kind.namespaced:
        return
    meta = body.setdefault("metadata", {})
    if meta.get("namespace") and meta["namespace"] != namespace:
        raise api.Invalid(
            "the namespace of the provided object does not match the namespace sent on the request",
            status=400,
        )
    meta["namespace"] = namespace
