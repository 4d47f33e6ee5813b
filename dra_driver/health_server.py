"""A tiny HTTP server for ``/metrics``, ``/healthz`` and ``/readyz``.

Why it exists: the DaemonSet's liveness and readiness probes and Prometheus need one endpoint
each, and the node agent should not pull in a web framework for three GET handlers. It is the
standard library's threaded HTTP server on its own daemon thread, so a slow scrape never blocks
a kubelet gRPC call.

- ``/healthz``: 200 while the process answers (liveness: a hung agent is restarted).
- ``/readyz``: 200 once every readiness condition holds, else 503; the body lists them.
  For the kubelet plugin the conditions are ``registered`` (the kubelet called
  NotifyRegistrationStatus with success) and ``slices_published`` (our ResourceSlices are
  published: false until the first reconcile succeeds, and false again while publishing has
  failed for longer than ``--publish-grace``). The app flips them on a :class:`Readiness`
  object, or hands it a check computed when asked, e.g. a :class:`Grace`.
- ``/metrics``: the explicit prometheus registry, text or OpenMetrics by ``Accept``.

Where it listens: ``--metrics-address`` (env ``METRICS_ADDRESS``); by default the pod's own IP
(env ``POD_IP``, which the chart sets from the downward API), and ``127.0.0.1`` outside a pod —
never every interface unless asked to (``0.0.0.0`` / ``::``). IPv6 addresses work too.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterable
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


class Grace:
    """A condition that rides out short failures: false until the first success; then true
    until failures (with no success in between) have lasted longer than ``grace_s``; true
    again at the next success. Thread-safe; hand it to :meth:`Readiness.set_check`.

    E.g. publishing: ``ok()`` after every successful reconcile, ``failed()`` after every
    failed one (or a watch that cannot be opened); ``grace_s`` is ``--publish-grace``.
    """

    def __init__(
        self, grace_s: float, *, ready: bool = False, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if grace_s < 0:
            raise ValueError(f"grace period {grace_s}: must not be negative")
        self.grace_s = grace_s
        self._clock = clock
        self._lock = threading.Lock()
        self._succeeded = ready
        self._failing_since: float | None = None

    def ok(self) -> None:
        with self._lock:
            self._succeeded = True
            self._failing_since = None

    def failed(self) -> None:
        with self._lock:
            if self._failing_since is None:
                self._failing_since = self._clock()

    def failing_for(self) -> float | None:
        """Seconds since the current run of failures began; None when not failing."""
        with self._lock:
            since = self._failing_since
        return None if since is None else self._clock() - since

    def __call__(self) -> bool:
        with self._lock:
            if not self._succeeded:
                return False
            since = self._failing_since
        return since is None or self._clock() - since <= self.grace_s


class Readiness:
    """Named readiness conditions, all initially false; thread-safe."""

    def __init__(self, *, conditions: Iterable[str] = KUBELET_PLUGIN_CONDITIONS) -> None:
        self._lock = threading.Lock()
        self._state: dict[str, bool] = {name: False for name in conditions}
        self._checks: dict[str, Callable[[], bool]] = {}
        self._reasons: dict[str, Callable[[], str]] = {}
        self._quiet: set[str] = set()  # conditions listed only while false
        if not self._state:
            raise UnknownCondition("readiness needs at least one condition")

    def set(self, name: str, ok: bool = True) -> None:
        """Set condition ``name``; e.g. ``readiness.set("registered")`` once the kubelet did."""
        with self._lock:
            self._known(name)
            self._checks.pop(name, None)
            changed = self._state[name] != ok
            self._state[name] = ok
        if changed:
            _log.info("readiness condition changed", condition=name, ok=ok)

    def set_check(self, name: str, check: Callable[[], bool]) -> None:
        """Compute condition ``name`` with ``check`` whenever readiness is asked for (a
        :class:`Grace`, or anything that knows by itself, e.g. how long since a success)."""
        with self._lock:
            self._known(name)
            self._checks[name] = check

    def add_condition(
        self, name: str, check: Callable[[], bool], reason: Callable[[], str] | None = None
    ) -> None:
        """A condition beyond the ones given at construction, computed by ``check``;
        ``reason`` says why it is false (``/readyz`` shows it under ``reasons``). It is listed
        only while false (the usual conditions stay what they were)."""
        with self._lock:
            self._quiet.add(name)
            self._state.setdefault(name, False)
            self._checks[name] = check
            if reason is not None:
                self._reasons[name] = reason

    def reasons(self) -> dict[str, str]:
        """Why each false condition that has a reason is false."""
        with self._lock:
            reasons = dict(self._reasons)
        out = {}
        for name, reason in reasons.items():
            try:
                text = reason()
            except Exception as exc:
                text = f"unknown ({exc!r})"
            if text:
                out[name] = text
        return out

    def _known(self, name: str) -> None:
        if name not in self._state:
            raise UnknownCondition(
                f"readiness condition {name!r}: not one of {', '.join(self._state)}"
            )

    def snapshot(self) -> dict[str, bool]:
        with self._lock:
            checks = dict(self._checks)
        values = {}
        for name, check in checks.items():
            try:
                values[name] = bool(check())
            except Exception as exc:  # a broken check reads as not ready, never as an error
                _log.error("readiness check failed", condition=name, error=repr(exc))
                values[name] = False
        changed = []
        with self._lock:
            for name, ok in values.items():
                if name in self._checks and self._state[name] != ok:
                    self._state[name] = ok
                    changed.append((name, ok))
            state = dict(self._state)
        for name, ok in changed:
            _log.info("readiness condition changed", condition=name, ok=ok)
        return {n: ok for n, ok in state.items() if not (ok and n in self._quiet)}

    def is_ready(self) -> bool:
        return all(self.snapshot().values())


class HealthServer:
    """Serves the three endpoints on ``host:port`` (port 0 = any free port) until stopped."""

    def __init__(
        self,
        *,
        registry: prom.CollectorRegistry,
        readiness: Readiness,
        host: str = "127.0.0.1",
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
        server_class = _IPv6Server if ":" in self._host else _Server
        try:
            httpd = server_class((self._host, self._port), handler)
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


class _Server(http.server.ThreadingHTTPServer):
    def server_bind(self) -> None:
        """Bind without ``http.server``'s ``socket.getfqdn`` of the address: a reverse DNS
        lookup at start (slow where cluster DNS is) for a name nothing here uses, which also
        loads the IDNA codec for the agent's life (~0.4 MiB, docs/fleet.md)."""
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)


class _IPv6Server(_Server):
    address_family = socket.AF_INET6


def default_address() -> str:
    """Where to listen unless told: ``METRICS_ADDRESS``, else the pod IP (``POD_IP``, from the
    downward API), else loopback — never every interface by default."""
    return os.environ.get("METRICS_ADDRESS") or os.environ.get("POD_IP") or "127.0.0.1"


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
                doc: dict[str, object] = {"ready": ready, "conditions": state}
                reasons = readiness.reasons()
                if reasons:
                    doc["reasons"] = reasons
                body = json.dumps(doc, sort_keys=True)
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
        default=default_address(),
        help="bind address of the /metrics, /healthz, /readyz server (env METRICS_ADDRESS; "
        "default: the pod IP from env POD_IP, else 127.0.0.1; 0.0.0.0 or :: = every interface)",
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
