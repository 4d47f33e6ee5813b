"""A tiny real HTTP server that serves an in-memory API over the Kubernetes REST paths.

Why it exists: the real client adapter (:mod:`dra_driver.kube.client`) must be tested over real
HTTP — URL building, field selectors, chunked watch streams, Status bodies, preconditions in
DELETE bodies, merge patches of Nodes, connection errors — and no kube-apiserver can run here.
This server speaks exactly the paths the driver uses, backed by
:class:`~dra_driver.testing.fakeapi.memory.InMemoryApi`, on 127.0.0.1 with an ephemeral port; tests
start it in-process or as a subprocess (``python -m dra_driver.testing.fakeapi.fakeserver``) and
point a kubeconfig at it.

Like a real API server it can serve TLS and require a client certificate (``tls``, a bundle from
:mod:`dra_driver.testing.fakeapi.certs`; the TLS handshake runs on the connection's own thread),
and close kept-alive connections that stay idle (``idle_timeout_s``; kube-apiserver closes them
after 90 s). It counts the connections it accepted and the TLS sessions resumed (``stats``, also
served at ``/fakeapi/stats``) so tests and benchmarks can see handshakes.
"""

from __future__ import annotations

import argparse
import base64
import http.server
import json
import re
import signal
import socket
import threading
import urllib.parse
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from dra_driver.kube import api
from dra_driver.testing.fakeapi import (
    discovery,
    featuregates,
    httpserver,
    memory,
    nodes,
    objectroutes,
)

if TYPE_CHECKING:
    from dra_driver.testing.fakeapi import certs

_GROUP = "/apis/resource.k8s.io/v1"
_ROUTES: list[tuple[str, re.Pattern[str]]] = [
    ("claim", re.compile(rf"^{_GROUP}/namespaces/([^/]+)/resourceclaims/([^/]+)$")),
    ("claimstatus", re.compile(rf"^{_GROUP}/namespaces/([^/]+)/resourceclaims/([^/]+)/status$")),
    ("claims", re.compile(rf"^{_GROUP}/namespaces/([^/]+)/resourceclaims$")),
    ("node", re.compile(r"^/api/v1/nodes/([^/]+)$")),
    ("slice", re.compile(rf"^{_GROUP}/resourceslices/([^/]+)$")),
    ("slices", re.compile(rf"^{_GROUP}/resourceslices$")),
    ("class", re.compile(rf"^{_GROUP}/deviceclasses/([^/]+)$")),
    ("classes", re.compile(rf"^{_GROUP}/deviceclasses$")),
    ("version", re.compile(r"^/version$")),
    ("group", re.compile(rf"^/apis/{discovery.GROUP}/?$")),
    ("review", re.compile(rf"^{discovery.REVIEW_PATH}$")),
    ("stats", re.compile(r"^/fakeapi/stats$")),
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


class _Handler(http.server.BaseHTTPRequestHandler):
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
        token = self.server.token
        try:
            if token and self.headers.get("Authorization") != f"Bearer {token}":
                raise api.ApiError(401, "Unauthorized", reason="Unauthorized")
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
        elif route == "review" and method == "POST":
            self._json(201, self.server.served.access_review(body))
        elif route == "stats" and method == "GET":
            self._json(200, self.server.stats())
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

    def _json(self, code: int, obj: Any) -> None:
        data = json.dumps(obj).encode()
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


class FakeApiServer:
    """Serve ``api`` on 127.0.0.1:<ephemeral port> in a background thread."""

    def __init__(
        self,
        api_: memory.InMemoryApi | None = None,
        *,
        port: int = 0,
        token: str | None = None,
        tls: certs.Bundle | None = None,
        idle_timeout_s: float | None = None,
        disabled_gates: Iterable[str] | None = None,
        served_versions: Iterable[str] = ("v1",),
        denied: Iterable[tuple[str, str]] = (),
        access_reviews: bool = True,
    ) -> None:
        """``tls``: serve HTTPS and require a client certificate of that bundle's CA;
        ``idle_timeout_s``: close a kept-alive connection idle that long (None: never);
        ``disabled_gates``: DRA feature gates off in the API served (:mod:`.featuregates`);
        ``served_versions`` of ``resource.k8s.io``, ``(verb, resource)`` access reviews
        ``denied``, or no ``access_reviews`` served at all (:mod:`.discovery`)."""
        if api_ is None:
            api_ = memory.InMemoryApi(disabled_gates=disabled_gates or ())
        elif disabled_gates is not None and frozenset(disabled_gates) != api_.disabled_gates:
            raise ValueError("disabled_gates differ from those of the InMemoryApi given")
        self.api = api_
        self.tls = tls
        self._httpd = httpserver.Server(
            ("127.0.0.1", port),
            _Handler,
            tls=tls.server_context() if tls is not None else None,
            idle_timeout_s=idle_timeout_s,
        )
        self._httpd.api = self.api
        self._httpd.token = token
        self._httpd.served = discovery.Served.of(served_versions, denied, reviews=access_reviews)
        self.token = token
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"{'https' if self.tls else 'http'}://{host!s}:{port}"

    def stats(self) -> dict[str, int]:
        """Connections accepted, TLS sessions resumed, connections open now."""
        return self._httpd.stats()

    def start(self) -> FakeApiServer:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fake-apiserver",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self.api.end_watches()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._httpd.drop_connections()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def write_kubeconfig(self, path: Path) -> Path:
        return write_kubeconfig(path, self.url, token=self.token, tls=self.tls)

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


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


def write_kubeconfig(
    path: Path, server_url: str, *, token: str | None = None, tls: certs.Bundle | None = None
) -> Path:
    """Write a kubeconfig whose only context points at ``server_url`` (with ``tls``: trusting
    its CA and presenting its client certificate, all inline)."""
    user: dict[str, str] = {"token": token} if token else {}
    cluster: dict[str, str] = {"server": server_url}
    if tls is not None:
        cluster["certificate-authority-data"] = base64.b64encode(tls.ca_pem).decode()
        user["client-certificate-data"] = base64.b64encode(tls.client_cert_pem).decode()
        user["client-key-data"] = base64.b64encode(tls.client_key_pem).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": cluster}],
        "users": [{"name": "fake", "user": user}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    """Run a fake API server until SIGTERM/SIGINT; write a kubeconfig for it."""
    parser = argparse.ArgumentParser(prog="python -m dra_driver.testing.fakeapi.fakeserver")
    parser.add_argument("--kubeconfig", type=Path, required=True, help="kubeconfig to write")
    parser.add_argument("--node", action="append", default=[], help="Node object to create")
    parser.add_argument("--token", default=None, help="require this bearer token")
    parser.add_argument(
        "--feature-gates",
        default="",
        help="DRA gates as kube-apiserver takes them (DRADeviceTaints=false,...); default all on",
    )
    args = parser.parse_args(argv)
    try:
        disabled = featuregates.parse(args.feature_gates)
    except ValueError as exc:
        parser.error(str(exc))
    server = FakeApiServer(token=args.token, disabled_gates=disabled)
    for node in args.node:
        server.api.put_node(node)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    server.start()
    tmp = args.kubeconfig.with_suffix(".tmp")
    write_kubeconfig(tmp, server.url, token=args.token)
    tmp.replace(args.kubeconfig)  # appears complete or not at all
    print(server.url, flush=True)
    done.wait()
    server.stop()
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
