"""A tiny HTTP server for ``/metrics``, ``/healthz`` and ``/readyz``.

Why it exists: the DaemonSet's liveness and readiness probes and Prometheus need one endpoint
each, and the node agent should not pull in a web framework for three GET handlers. It is the
standard library's threaded HTTP server on its own daemon thread, so a slow scrape never blocks
a kubelet gRPC call.

- ``/healthz``: 200 while the process answers (liveness: a hung agent is restarted).
- ``/readyz``: 200 once every readiness condition holds, else 503; the body lists them.
  For the kubelet plugin the conditions are ``registered`` (the kubelet called
  NotifyRegistrationStatus with success) and ``slices_published`` (the first reconcile of our
  ResourceSlices succeeded). The app flips them on a :class:`Readiness` object.
- ``/metrics``: the explicit prometheus registry, text or OpenMetrics by ``Accept``.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import threading
from collections.abc import Iterable
from types import TracebackType

import prometheus_client as prom
from prometheus_client import exposition

from dra_driver import logs

KUBELET_PLUGIN_CONDITIONS = ("registered", "slices_published")
DEVICE_PLUGIN_CONDITIONS = ("registered",)
DEFAULT_PORT = 8080

_log = logs.get("health")


class HealthServerError(Exception):
    """The server could not start (address in use, bad address, ...)."""


class UnknownCondition(ValueError):
    """A readiness condition name the :class:`Readiness` object was not built with."""


class Readiness:
    """Named readiness conditions, all initially false; thread-safe."""

    def __init__(self, *, conditions: Iterable[str] = KUBELET_PLUGIN_CONDITIONS) -> None:
        self._lock = threading.Lock()
        self._state: dict[str, bool] = {name: False for name in conditions}
        if not self._state:
            raise UnknownCondition("readiness needs at least one condition")

    def set(self, name: str, ok: bool = True) -> None:
        """Set condition ``name``; e.g. ``readiness.set("registered")`` once the kubelet did."""
        with self._lock:
            if name not in self._state:
                raise UnknownCondition(
                    f"readiness condition {name!r}: not one of {', '.join(self._state)}"
                )
            changed = self._state[name] != ok
            self._state[name] = ok
        if changed:
            _log.info("readiness condition changed", condition=name, ok=ok)

    def snapshot(self) -> dict[str, bool]:
        with self._lock:
            return dict(self._state)

    def is_ready(self) -> bool:
        return all(self.snapshot().values())


class HealthServer:
    """Serves the three endpoints on ``host:port`` (port 0 = any free port) until stopped."""

    def __init__(
        self,
        *,
        registry: prom.CollectorRegistry,
        readiness: Readiness,
        host: str = "0.0.0.0",
        port: int = DEFAULT_PORT,
    ) -> None:
        if not 0 <= port <= 65535:
            raise HealthServerError(f"health server port {port}: must be 0-65535")
        self._registry = registry
        self._readiness = readiness
        self._host = host
        self._port = port
        self._httpd: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        """The bound ``(host, port)``; only valid after :meth:`start`."""
        if self._httpd is None:
            raise HealthServerError("health server is not running")
        host, port = self._httpd.server_address[:2]
        return (str(host), int(port))

    def start(self) -> None:
        if self._httpd is not None:
            raise HealthServerError("health server already started")
        handler = _handler_class(registry=self._registry, readiness=self._readiness)
        try:
            httpd = http.server.ThreadingHTTPServer((self._host, self._port), handler)
        except OSError as exc:
            raise HealthServerError(
                f"health server cannot listen on {self._host}:{self._port}: {exc.strerror or exc}"
            ) from exc
        httpd.daemon_threads = True
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="health-server",
            daemon=True,
        )
        self._thread.start()
        host, port = self.address
        _log.info("health server listening", host=host, port=port)

    def stop(self, *, timeout: float = 5.0) -> None:
        """Stop serving and close the socket; safe to call twice."""
        httpd, thread = self._httpd, self._thread
        self._httpd = self._thread = None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if thread is not None:
            thread.join(timeout)

    def __enter__(self) -> HealthServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _handler_class(
    *, registry: prom.CollectorRegistry, readiness: Readiness
) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        server_version = "dra-driver"
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/healthz":
                self._send(200, "text/plain; charset=utf-8", b"ok\n")
            elif path == "/readyz":
                state = readiness.snapshot()
                ready = all(state.values())
                body = json.dumps({"ready": ready, "conditions": state}, sort_keys=True)
                self._send(200 if ready else 503, "application/json", body.encode() + b"\n")
            elif path == "/metrics":
                encoder, content_type = exposition.choose_encoder(self.headers.get("Accept", ""))
                self._send(200, content_type, encoder(registry))
            else:
                self._send(404, "text/plain; charset=utf-8", f"no such path: {path}\n".encode())

        def do_HEAD(self) -> None:
            self.do_GET()

        def _send(self, status: int, content_type: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            _log.debug("http request", client=self.client_address[0], line=format % args)

    return Handler


def add_flags(parser: argparse.ArgumentParser) -> None:
    """``--metrics-address`` / ``--metrics-port`` (env METRICS_ADDRESS / METRICS_PORT)."""
    parser.add_argument(
        "--metrics-address",
        metavar="HOST",
        default=os.environ.get("METRICS_ADDRESS", "0.0.0.0"),
        help="bind address of the /metrics, /healthz, /readyz server (env METRICS_ADDRESS)",
    )
    # A string default goes through ``type`` too, so a bad METRICS_PORT gets the same message.
    parser.add_argument(
        "--metrics-port",
        metavar="PORT",
        type=_port,
        default=os.environ.get("METRICS_PORT", str(DEFAULT_PORT)),
        help=f"its port; 0 picks a free one (env METRICS_PORT; default {DEFAULT_PORT})",
    )


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"port {text!r}: not a number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port}: must be 0-65535")
    return port


def from_args(
    args: argparse.Namespace, *, registry: prom.CollectorRegistry, readiness: Readiness
) -> HealthServer:
    """The server :func:`add_flags`' flags describe (not started)."""
    return HealthServer(
        registry=registry,
        readiness=readiness,
        host=args.metrics_address,
        port=args.metrics_port,
    )
