"""The real :class:`~dra_driver.kube.objects.ObjectApi`: generic verbs over the REST paths.

Why it exists apart from :mod:`dra_driver.kube.client`: that module is the agent's hot-path
port and its HTTP plumbing; this one adds the few generic verbs that owners of whole objects
(MPS daemon Pods, the ComputeDomain controller) need, reusing the same connection, credentials
and error mapping (every failure is the port's :class:`~dra_driver.kube.api.ApiError` family).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

from dra_driver.kube import api
from dra_driver.kube.client import KubeClient
from dra_driver.kube.objects import Kind, ObjectApi

MERGE_PATCH = "application/merge-patch+json"


class ObjectClient:
    """:class:`~dra_driver.kube.objects.ObjectApi` over a :class:`KubeClient`'s connection."""

    def __init__(self, client: KubeClient) -> None:
        self._client = client

    def get(self, kind: Kind, name: str, *, namespace: str | None = None) -> api.Obj:
        return self._client._json("GET", kind.path(namespace, name))

    def list(
        self,
        kind: Kind,
        *,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
    ) -> tuple[list[api.Obj], str]:
        body = self._client._json(
            "GET", _collection(kind, namespace), query=_selectors(label_selector, field_selector)
        )
        rv = str((body.get("metadata") or {}).get("resourceVersion") or "")
        return list(body.get("items") or []), rv

    def create(self, kind: Kind, obj: api.Obj) -> api.Obj:
        namespace = (obj.get("metadata") or {}).get("namespace")
        return self._client._json("POST", kind.path(namespace), body=_typed(kind, obj))

    def update(self, kind: Kind, obj: api.Obj) -> api.Obj:
        meta = obj["metadata"]
        path = kind.path(meta.get("namespace"), meta["name"])
        return self._client._json("PUT", path, body=_typed(kind, obj))

    def update_status(self, kind: Kind, obj: api.Obj) -> api.Obj:
        meta = obj["metadata"]
        path = kind.path(meta.get("namespace"), meta["name"], "status")
        return self._client._json("PUT", path, body=_typed(kind, obj))

    def patch(
        self, kind: Kind, name: str, patch: api.Obj, *, namespace: str | None = None
    ) -> api.Obj:
        return self._client._patch(kind.path(namespace, name), patch, MERGE_PATCH)

    def delete(
        self,
        kind: Kind,
        name: str,
        *,
        namespace: str | None = None,
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> None:
        options: api.Obj = {"kind": "DeleteOptions", "apiVersion": "v1"}
        preconditions = {
            k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v
        }
        if preconditions:
            options["preconditions"] = preconditions
        self._client._json("DELETE", kind.path(namespace, name), body=options)

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
        return self._client._watch(
            _collection(kind, namespace),
            _selectors(label_selector, field_selector),
            resource_version,
            timeout_s,
        )


def objects_for(api: object) -> ObjectApi:
    """The generic object verbs over an agent's API connection: an :class:`ObjectClient` over a
    :class:`KubeClient`, or the in-memory API's own store (``.objects``) when the agent runs
    in-process against it. Raises ValueError for a connection that offers neither."""
    store = getattr(api, "objects", None)
    if store is not None:
        return cast(ObjectApi, store)
    if not isinstance(api, KubeClient):
        raise ValueError(f"{type(api).__name__} gives no generic object access")
    return ObjectClient(api)


def _collection(kind: Kind, namespace: str | None) -> str:
    if kind.namespaced and not namespace:  # every namespace
        return Kind(kind.group, kind.version, kind.plural, kind.kind, False).path()
    return kind.path(namespace)


def _selectors(label_selector: str, field_selector: str) -> list[tuple[str, str]]:
    query = []
    if label_selector:
        query.append(("labelSelector", label_selector))
    if field_selector:
        query.append(("fieldSelector", field_selector))
    return query


def _typed(kind: Kind, obj: api.Obj) -> api.Obj:
    return {"apiVersion": kind.api_version, "kind": kind.kind, **obj}
