"""The real :class:`~dra_driver.kube.api.KubeApi` adapter: the only module that imports the
``kubernetes`` client library, and only when it must.

Why it exists: the driver talks to the API server through a narrow port of plain dicts; this
is its production implementation. It speaks the REST paths itself over
:mod:`dra_driver.kube.transport`, a lean HTTP/1.1 client that costs a fifth of the library's
CPU per request — JSON requests, the Node label and claim status patches, and watches (a
streamed response on a connection of its own) — and response bodies are decoded by
:mod:`dra_driver.kube.replies`.
The configuration (in-cluster service account; kubeconfig with a token, token file or client
certificates) is chosen by :mod:`dra_driver.kube.clientconfig` and read by
:mod:`dra_driver.kube.kubeconfig`, so the node agent never imports the
``kubernetes`` package (~10 MiB of memory and ~0.2 s of CPU per agent, one agent per node). The
library is imported, lazily, only for what the transport does not do — exec credential plugins,
auth providers, basic auth and proxies — or when asked for (``lean=False``); then every request
goes through its ``ApiClient``. Every failure becomes the port's
:class:`~dra_driver.kube.api.ApiError` family, with status 0 when the server could not be
reached at all. Beyond the port it answers what ``dra-driver doctor`` asks (``/version``, API
discovery, dry-run creates, access reviews: :mod:`dra_driver.kube.features`).

A watch asks the server to end it after ``timeout_s``; a watch connection that has stayed
silent for ``watch_silence_s`` past that is dead (a proxy or NAT that dropped it without a
reset) and is ended with an error, so the caller re-opens it instead of waiting for TCP to
notice.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dra_driver.kube import api, clientconfig, library, replies, transport
from dra_driver.kube.clientconfig import ConfigError as ConfigError

_GROUP = "/apis/resource.k8s.io/v1"
WATCH_SILENCE_S = 5.0
_APPLY = "application/apply-patch+yaml"


class KubeClient:
    """The port over HTTP. Thread-safe: the transport's (or library's) pool is shared."""

    def __init__(
        self,
        api_client: Any,
        *,
        timeout_s: float = 10.0,
        lean: bool = True,
        connections: int = 0,
        max_connections: int = 32,
        keepalive_s: float = 0.0,
        warm_connections: int | None = None,
        watch_silence_s: float = WATCH_SILENCE_S,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> None:
        """``api_client``: the library's ``ApiClient``, or a lean configuration's stand-in
        (:meth:`connect` picks); ``lean=False`` sends every request through the library (as
        with a proxy).

        ``connections``: open that many connections to the server at once, in the background
        (one per thread that may GET a claim at the same time, e.g. the gRPC workers), and with
        ``keepalive_s`` keep ``warm_connections`` of them (default: all) open (see
        :class:`~dra_driver.kube.transport.Transport`);
        ``max_connections``: how many idle ones to keep at most (never fewer than
        ``connections``); ``watch_silence_s``: how long past its end a watch may stay silent
        before its connection counts as dead."""
        self._client = api_client
        self._timeout = (min(5.0, timeout_s), timeout_s)
        self._watch_silence_s = watch_silence_s
        self._headers = headers  # on every request (:meth:`with_headers`)
        configuration = api_client.configuration
        self._transport = (
            transport.from_configuration(
                configuration,
                timeouts=self._timeout,
                proxied=library.proxied(configuration),
                max_idle=max(connections, max_connections),
                headers=headers,
            )
            if lean
            else None
        )
        if self._transport is not None and connections > 0:
            self._transport.start_pool(connections, keepalive_s=keepalive_s, warm=warm_connections)

    @classmethod
    def connect(
        cls,
        kubeconfig: Path | None = None,
        *,
        context: str | None = None,
        timeout_s: float = 10.0,
        lean: bool = True,
        connections: int = 0,
        max_connections: int = 32,
        keepalive_s: float = 0.0,
        warm_connections: int | None = None,
        watch_silence_s: float = WATCH_SILENCE_S,
    ) -> KubeClient:
        """From ``kubeconfig``, else kubectl's defaults (the ``$KUBECONFIG`` files merged,
        ``~/.kube/config``, the in-cluster service account: :mod:`dra_driver.kube.configfiles`),
        with ``context`` instead of the current one; the connection settings are
        :meth:`__init__`'s."""
        api_client = clientconfig.api_client(
            kubeconfig, context, lean=lean, pool_size=max(connections, max_connections)
        )
        return cls(
            api_client,
            timeout_s=timeout_s,
            lean=lean,
            connections=connections,
            max_connections=max_connections,
            keepalive_s=keepalive_s,
            warm_connections=warm_connections,
            watch_silence_s=watch_silence_s,
        )

    def with_headers(self, headers: tuple[tuple[str, str], ...]) -> KubeClient:
        """A client on the same configuration (its own connections) that sends ``headers``
        on every request, e.g. ``Impersonate-User`` (:mod:`dra_driver.kube.impersonation`)."""
        return KubeClient(
            self._client,
            timeout_s=self._timeout[1],
            lean=self._transport is not None,
            watch_silence_s=self._watch_silence_s,
            headers=headers,
        )

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
        self._client.close()

    # ------------------------------------------------------------------ the port
    def get_resource_claim(self, namespace: str, name: str) -> api.Obj:
        return self._json("GET", f"{_GROUP}/namespaces/{_q(namespace)}/resourceclaims/{_q(name)}")

    def get_node(self, name: str) -> api.Obj:
        return self._json("GET", f"/api/v1/nodes/{_q(name)}")

    def apply_resource_claim_status(
        self, namespace: str, name: str, patch: api.Obj, field_manager: str
    ) -> api.Obj:
        # Server-side apply: a media type of its own (JSON is YAML). After every prepare and
        # unprepare, so over the lean transport where there is one (issue 37: through the
        # library it cost more CPU than the rest of the claim's work).
        path = f"{_GROUP}/namespaces/{_q(namespace)}/resourceclaims/{_q(name)}/status"
        query = [("fieldManager", field_manager), ("force", "true")]
        if self._transport is not None:
            return self._json("PATCH", path, query=query, body=patch, content_type=_APPLY)
        return self._patch(path, json.dumps(patch), _APPLY, query=query)

    def create_event(self, namespace: str, event: api.Obj) -> api.Obj:
        path = f"/apis/events.k8s.io/v1/namespaces/{_q(namespace)}/events"
        return self._json("POST", path, body=event)

    def patch_node(self, name: str, patch: api.Obj) -> api.Obj:
        path = f"/api/v1/nodes/{_q(name)}"
        return self._patch(path, patch, "application/merge-patch+json")

    def _patch(
        self,
        path: str,
        body: api.Obj | str,
        content_type: str,
        *,
        query: list[tuple[str, str]] | None = None,
    ) -> api.Obj:
        if self._transport is not None:
            status, data = self._lean(
                "PATCH", path, query=query, body=body, content_type=content_type
            )
        else:
            response = self._request(
                "PATCH", path, query=query, body=body, content_type=content_type
            )
            status, data = response.status, library.data(response, "PATCH", path)
        return replies.decoded(status, data, "PATCH", path)

    def list_resource_slices(self, *, driver: str, node_name: str) -> tuple[list[api.Obj], str]:
        query = [("fieldSelector", _selector(driver, node_name))]
        body = self._json("GET", f"{_GROUP}/resourceslices", query=query)
        return list(body.get("items") or []), str(
            (body.get("metadata") or {}).get("resourceVersion") or ""
        )

    def create_resource_slice(self, obj: api.Obj) -> api.Obj:
        return self._json("POST", f"{_GROUP}/resourceslices", body=obj)

    def update_resource_slice(self, obj: api.Obj) -> api.Obj:
        name = obj["metadata"]["name"]
        return self._json("PUT", f"{_GROUP}/resourceslices/{_q(name)}", body=obj)

    def delete_resource_slice(self, name: str, *, resource_version: str | None = None) -> None:
        options: api.Obj = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if resource_version:
            options["preconditions"] = {"resourceVersion": resource_version}
        self._json("DELETE", f"{_GROUP}/resourceslices/{_q(name)}", body=options)

    def watch_resource_slices(
        self, *, driver: str, node_name: str, resource_version: str, timeout_s: float
    ) -> Iterator[api.WatchEvent]:
        query = [("fieldSelector", _selector(driver, node_name))]
        return self._watch(f"{_GROUP}/resourceslices", query, resource_version, timeout_s)

    def _watch(
        self,
        path: str,
        query: list[tuple[str, str]],
        resource_version: str,
        timeout_s: float,
    ) -> Iterator[api.WatchEvent]:
        """A watch of the collection at ``path`` (``query``: its selectors) from
        ``resource_version``, ended by the server after ``timeout_s``."""
        query = [
            *query,
            ("watch", "1"),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(max(1, int(timeout_s)))),
        ]
        if resource_version:
            query.append(("resourceVersion", resource_version))
        silence = timeout_s + self._watch_silence_s  # the longest read a live watch may take
        what = path.rsplit("/", 1)[-1]
        if self._transport is not None:
            return self._lean_watch(path, query, silence, what)
        response = self._request("GET", path, query=query, timeout=(self._timeout[0], silence))
        return replies.events(response.stream(65536), silence, what, response.release_conn)

    def _lean_watch(
        self, path: str, query: list[tuple[str, str]], silence: float, what: str
    ) -> Iterator[api.WatchEvent]:
        if self._transport is None:
            raise RuntimeError("the lean transport is not in use")
        target = f"{path}?{urllib.parse.urlencode(query)}"
        try:
            stream = self._transport.stream(target, read_timeout_s=silence)
        except transport.TransportError as exc:
            raise api.ApiError(0, f"API server unreachable: {exc}") from exc
        if not 200 <= stream.status < 300:
            raise replies.error("GET", path, stream.status, stream.body())
        return replies.events(stream.chunks(), silence, what, stream.close)

    # ------------------------------------------------------------------ beyond the port
    # What ``dra-driver doctor`` asks (:mod:`dra_driver.kube.features`); the agent never does.
    @property
    def server(self) -> str:
        """The API server's URL, as the configuration names it."""
        return str(self._client.configuration.host)

    def get_version(self) -> api.Obj:
        """``GET /version``: the server's build (``gitVersion``, ``major``, ``minor``, ...)."""
        return self._json("GET", "/version")

    def get_api_group(self, group: str) -> api.Obj:
        """``GET /apis/<group>``: the ``APIGroup`` (versions served, preferred version)."""
        return self._json("GET", f"/apis/{_q(group)}")

    def dry_run_create_resource_slice(self, obj: api.Obj) -> api.Obj:
        """``POST ...?dryRun=All``: the slice as the server would store it; nothing stored."""
        return self._json("POST", f"{_GROUP}/resourceslices", query=[("dryRun", "All")], body=obj)

    def access_review(self, verb: str, group: str, resource: str) -> api.Obj:
        """A ``SelfSubjectAccessReview`` of ``verb`` on ``resource`` (cluster-wide)."""
        review = {
            "kind": "SelfSubjectAccessReview",
            "apiVersion": "authorization.k8s.io/v1",
            "spec": {"resourceAttributes": {"verb": verb, "group": group, "resource": resource}},
        }
        return self._json(
            "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body=review
        )

    # ------------------------------------------------------------------ HTTP
    def _json(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: api.Obj | None = None,
        content_type: str = "application/json",
    ) -> api.Obj:
        if self._transport is not None:
            status, data = self._lean(
                method, path, query=query, body=body, content_type=content_type
            )
        else:
            response = self._request(method, path, query=query, body=body)
            status, data = response.status, library.data(response, method, path)
        return replies.decoded(status, data, method, path)

    def _lean(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None,
        body: api.Obj | str | None,
        content_type: str = "application/json",
    ) -> tuple[int, bytes]:
        if self._transport is None:
            raise RuntimeError("the lean transport is not in use")
        target = f"{path}?{urllib.parse.urlencode(query)}" if query else path
        if body is None:
            payload = None
        elif isinstance(body, str):
            payload = body.encode()
        else:
            payload = json.dumps(body, separators=(",", ":")).encode()
        try:
            response = self._transport.request(
                method, target, body=payload, content_type=content_type
            )
        except transport.TransportError as exc:
            raise api.ApiError(0, f"API server unreachable: {exc}") from exc
        if not 200 <= response.status < 300:
            raise replies.error(method, path, response.status, response.body)
        return response.status, response.body

    def _request(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: api.Obj | str | None = None,
        timeout: tuple[float, float] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        """Through the library; a non-2xx reply raises the port's error."""
        response = library.request(
            self._client,
            method,
            path,
            query=query,
            body=body,
            timeout=timeout or self._timeout,
            content_type=content_type,
            headers=self._headers,
        )
        if not 200 <= response.status < 300:
            try:
                data = library.data(response, method, path)
            except api.ApiError:
                data = b""
            raise replies.error(method, path, response.status, data)
        return response


def _q(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")


def _selector(driver: str, node_name: str) -> str:
    terms = [
        f"spec.driver={driver}" if driver else "",
        f"spec.nodeName={node_name}" if node_name else "",
    ]
    return ",".join(t for t in terms if t)
