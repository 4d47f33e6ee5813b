"""The fake API server's request handler: REST paths to the in-memory API, replies as a server's.

Why it exists: the listening side (:mod:`.httpserver`) and the server object tests start
(:mod:`.fakeserver`) do not care what a request asks; this module does. It routes the paths the
driver uses (ResourceSlices with field selectors, list or chunked watch; ResourceClaims and
their status apply patches; Node merge patches; DeviceClasses; ``/version``, API discovery
(kubectl's too) and access reviews) to :class:`~dra_driver.testing.fakeapi.memory.InMemoryApi`,
hands every other kind to :mod:`.objectroutes`, and answers like kube-apiserver: JSON bodies,
``Status`` objects with the right reason and code for errors, ``dryRun=All`` honoured where the
fake supports it, and a dropped connection for an injected "unreachable".
"""

from __future__ import annotations

import http.server
import json
import re
import socket
import urllib.parse
from typing import Any

import yaml

from dra_driver.kube import api
from dra_driver.testing.fakeapi import (
    discovery,
    httpserver,
    impersonation,
    nodes,
    objectroutes,
    requestlog,
    tables,
)

_GROUP = "/apis/resource.k8s.io/v1"
_ROUTES: list[tuple[str, re.Pattern[str]]] = [
    ("claim", re.compile(rf"^{_GROUP}/namespaces/([^/]+)/resourceclaims/([^/]+)$")),
    ("claimstatus", re.compile(rf"^{_GROUP}/namespaces/([^/]+)/resourceclaims/([^/]+)/status$")),
    ("claims", re.compile(rf"^{_GROUP}/namespaces/([^/]+)/resourceclaims$")),
    ("allclaims", re.compile(rf"^{_GROUP}/resourceclaims$")),
    ("node", re.compile(r"^/api/v1/nodes/([^/]+)$")),
    ("slice", re.compile(rf"^{_GROUP}/resourceslices/([^/]+)$")),
    ("slices", re.compile(rf"^{_GROUP}/resourceslices$")),
    ("class", re.compile(rf"^{_GROUP}/deviceclasses/([^/]+)$")),
    ("classes", re.compile(rf"^{_GROUP}/deviceclasses$")),
    ("version", re.compile(r"^/version$")),
    ("group", re.compile(rf"^/apis/{discovery.GROUP}/?$")),
    ("apiversions", re.compile(r"^/api/?$")),
    ("groups", re.compile(r"^/apis/?$")),
    ("resources", re.compile(r"^/api/(v1)/?$|^/apis/([^/]+)/([^/]+)/?$")),
    ("review", re.compile(rf"^{discovery.REVIEW_PATH}$")),
    ("stats", re.compile(r"^/fakeapi/stats$")),
    ("requests", re.compile(r"^/fakeapi/requests$")),
]
# What GET /version answers (the release the wire contracts were checked against).
VERSION = {
    "major": "1",
    "minor": "36",
    "gitVersion": "v1.36.2",
    "platform": "linux/amd64",
}
APPLY_PATCH = "application/apply-patch+yaml"
_SELECTABLE = {"spec.driver": "driver", "spec.nodeName": "node_name"}
_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    500: "InternalError",
    503: "ServiceUnavailable",
}


class RequestHandler(http.server.BaseHTTPRequestHandler):
    """One connection's requests: authentication, then the hand-made routes below, then the
    generic kinds (:mod:`.objectroutes`); an :class:`~dra_driver.kube.api.ApiError` becomes a
    Status reply."""

    protocol_version = "HTTP/1.1"
    # One buffered write per reply and no Nagle delay: headers and body in separate small
    # segments would meet the client's delayed ACK and cost ~40 ms per request.
    disable_nagle_algorithm = True
    wbufsize = 1 << 16
    server: httpserver.Server

    def log_message(self, format: str, *args: Any) -> None:
        return  # quiet: tests read results, not access logs

    def setup(self) -> None:
        super().setup()
        # A kept-alive connection idle this long is closed (the wait for the next request
        # times out); None: never.
        self.connection.settimeout(self.server.idle_timeout_s)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def _dispatch(self, method: str) -> None:
        parsed = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(parsed.query))
        body = self._body()
        self._tally: requestlog.Tally | None = None
        if not parsed.path.startswith("/fakeapi/"):  # the kit's own paths are not counted
            verb, resource = requestlog.classify(method, parsed.path, query)
            self._tally = self.server.requests.record(
                verb,
                resource,
                dry_run="dryRun" in query,
                bytes_in=int(self.headers.get("Content-Length") or 0),
            )
        token = self.server.token
        try:
            if token and self.headers.get("Authorization") != f"Bearer {token}":
                raise api.ApiError(401, "Unauthorized", reason="Unauthorized")
            impersonation.check(
                self.headers.items(),
                method=method,
                path=parsed.path,
                query=query,
                bound_node=self.server.bound_node,
                pod_namespaces=self.server.pod_namespaces,
            )
            self.server.served.check_path(parsed.path)
            for route, pattern in _ROUTES:
                match = pattern.match(parsed.path)
                if match:
                    self._route(method, route, match.groups(), query, body)
                    return
            if objectroutes.serve(self.server.api.objects, self, method, parsed.path, query, body):
                return
            raise api.NotFound("the server could not find the requested resource")
        except api.ApiError as exc:
            if exc.status == 0:  # injected "unreachable": drop the connection, no answer
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            self._status(exc.status, str(exc), exc.reason)
        except (ValueError, KeyError, TypeError) as exc:
            self._status(400, f"bad request: {exc}", "BadRequest")

    def _route(
        self, method: str, route: str, args: tuple[str, ...], query: dict[str, str], body: Any
    ) -> None:
        mem = self.server.api
        dry_run = _dry_run(query, route, method)
        if route == "claim" and method == "GET":
            self._json(200, mem.get_resource_claim(args[0], args[1]))
        elif route == "claimstatus" and method == "PATCH":
            self._apply_content_type()
            force = query.get("force") in ("true", "1")
            manager = query.get("fieldManager", "")
            self._json(
                200, mem.apply_resource_claim_status(args[0], args[1], body, manager, force=force)
            )
        elif route in ("claims", "allclaims") and method == "GET":
            claims, version = mem.list_resource_claims(args[0] if args else None)
            self._json(
                200,
                {
                    "kind": "ResourceClaimList",
                    "apiVersion": "resource.k8s.io/v1",
                    "metadata": {"resourceVersion": version},
                    "items": claims,
                },
            )
        elif route == "claims" and method == "POST":
            body.setdefault("metadata", {})["namespace"] = args[0]
            self._json(201, mem.create_resource_claim(body))
        elif route == "node" and method == "GET":
            self._json(200, mem.get_node(args[0]))
        elif route == "node" and method == "PATCH":
            self._json(200, mem.patch_node(args[0], self._patch_body(body)))
        elif route == "slices" and method == "GET":
            self._list_or_watch(query)
        elif route == "slices" and method == "POST":
            self._json(201, mem.create_resource_slice(body, dry_run=dry_run))
        elif route == "slice" and method == "GET":
            self._json(200, mem.get_resource_slice(args[0]))
        elif route == "slice" and method == "PUT":
            if (body.get("metadata") or {}).get("name") != args[0]:
                raise api.Invalid(
                    "metadata.name: Invalid value: the name of the object does "
                    "not match the name on the URL",
                    status=400,
                )
            self._json(200, mem.update_resource_slice(body))
        elif route == "slice" and method == "DELETE":
            rv = ((body or {}).get("preconditions") or {}).get("resourceVersion")
            mem.delete_resource_slice(args[0], resource_version=rv)
            self._json(
                200,
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Success",
                    "details": {
                        "name": args[0],
                        "group": "resource.k8s.io",
                        "kind": "resourceslices",
                    },
                },
            )
        elif route == "classes" and method == "POST":
            self._json(201, mem.create_device_class(body))
        elif route == "class" and method == "GET":
            self._json(200, mem.get_device_class(args[0]))
        elif route == "version" and method == "GET":
            self._json(200, VERSION)
        elif route == "group" and method == "GET":
            self._json(200, self.server.served.api_group())
        elif route == "apiversions" and method == "GET":
            host, port = self.server.server_address[:2]
            self._json(200, self.server.served.api_versions(f"{host!s}:{port}"))
        elif route == "groups" and method == "GET":
            self._json(200, self.server.served.api_group_list())
        elif route == "resources" and method == "GET":
            core, group, version = args
            served = self.server.served
            self._json(200, served.resource_list(group or "", version or core))
        elif route == "review" and method == "POST":
            self._json(201, self.server.served.access_review(body))
        elif route == "stats" and method == "GET":
            self._json(200, self.server.stats())
        elif route == "requests" and method == "GET":
            self._json(200, {"requests": self.server.requests.snapshot()})
        else:
            raise api.ApiError(405, f"method {method} not allowed here", reason="MethodNotAllowed")

    def _list_or_watch(self, query: dict[str, str]) -> None:
        selected = {"driver": "", "node_name": ""}
        for term in filter(None, query.get("fieldSelector", "").split(",")):
            key, _, value = term.replace("==", "=").partition("=")
            if key not in _SELECTABLE or key.endswith("!"):
                raise api.Invalid(f'field label not supported: "{key}"', status=400)
            selected[_SELECTABLE[key]] = value
        mem = self.server.api
        if query.get("watch") not in (None, "", "0", "false"):
            timeout = float(query.get("timeoutSeconds") or 1800)
            events = mem.watch_resource_slices(
                driver=selected["driver"],
                node_name=selected["node_name"],
                resource_version=query.get("resourceVersion", ""),
                timeout_s=timeout,
            )
            self._stream(events)
            return
        items, rv = mem.list_resource_slices(
            driver=selected["driver"], node_name=selected["node_name"]
        )
        if tables.wants_table(self.headers.get("Accept") or ""):  # kubectl get's rows
            self._json(200, tables.resource_slices(items, rv))
            return
        self._json(
            200,
            {
                "kind": "ResourceSliceList",
                "apiVersion": "resource.k8s.io/v1",
                "metadata": {"resourceVersion": rv},
                "items": items,
            },
        )

    def _stream(self, events: Any) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()  # the client sees the 200 before the first event
        try:
            for event in events:
                line = json.dumps({"type": event.type, "object": event.object}) + "\n"
                data = line.encode()
                self._sent(len(data))
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _patch_body(self, body: Any) -> Any:
        """The patch, for the patch types the fake applies (merge; strategic merge of maps)."""
        kind = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        if kind == nodes.STRATEGIC_MERGE_PATCH and not nodes.has_list(body):
            return body  # on maps a strategic merge patch is a merge patch
        if kind != nodes.MERGE_PATCH:
            raise api.ApiError(
                415,
                f"the fake API server applies {nodes.MERGE_PATCH} (and "
                f"{nodes.STRATEGIC_MERGE_PATCH} without lists), not {kind or 'no type'}",
                reason="UnsupportedMediaType",
            )
        return body

    def _apply_content_type(self) -> None:
        kind = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        if kind != APPLY_PATCH:
            raise api.ApiError(
                415,
                f"the fake API server applies claim status with {APPLY_PATCH} only, not "
                f"{kind or 'no type'}",
                reason="UnsupportedMediaType",
            )

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        if not length:
            return {}
        data = self.rfile.read(length) or b"{}"
        if (self.headers.get("Content-Type") or "").startswith(APPLY_PATCH):
            return yaml.safe_load(data)  # an apply patch is YAML (JSON is YAML too)
        return json.loads(data)

    def _sent(self, count: int) -> None:
        tally = getattr(self, "_tally", None)
        if tally is not None:
            self.server.requests.sent(tally, count)

    def _json(self, code: int, obj: Any) -> None:
        data = json.dumps(obj).encode()
        self._sent(len(data))
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _status(self, code: int, message: str, reason: str) -> None:
        self._json(
            code,
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": message,
                "reason": reason or _REASONS.get(code, ""),
                "code": code,
            },
        )


def _dry_run(query: dict[str, str], route: str, method: str) -> bool:
    """``?dryRun=All`` (the only value a server takes): honoured on ResourceSlice create only."""
    if "dryRun" not in query:
        return False
    if query["dryRun"] != "All":
        raise api.Invalid(f'dryRun: Unsupported value: "{query["dryRun"]}"', status=400)
    if (route, method) != ("slices", "POST"):
        raise api.Invalid(
            "the fake API server honours dryRun on ResourceSlice create only", status=400
        )
    return True
