"""A small HTTP/1.1 client for the API server's JSON requests: kept-alive connections, TLS, auth.

Why it exists: every prepare GETs its ResourceClaim, and through the ``kubernetes`` client
library (its REST layer, urllib3, ``http.client`` and the ``email`` header parser) one small GET
cost about 0.5 ms of CPU on a 2-core node — a quarter of the plugin's whole CPU per claim, and
CPU is what limits how many claims the GIL lets us prepare at once. Writing the request line
and parsing the status line and headers ourselves costs about a fifth of that.

What it does, and no more: HTTP/1.1 requests with a ``Content-Length`` body; responses framed
by ``Content-Length``, ``chunked`` transfer coding or connection close (read by
:mod:`dra_driver.kube.http1`); a pool of connections that can be opened up front and kept open
past the server's idle cut-off — all of them, or only ``warm`` ones, which is what an idle
fleet of agents costs the server (:class:`Transport`) — with TLS sessions resumed on reconnect
(an idle connection the server has closed is noticed before reuse, and once one connection times
out — a path gone silent — the idle ones are dropped with it); streamed responses (watches) on a
connection of their own (:meth:`Transport.stream`); TLS with the configuration's settings (CA
file or data, client certificate as a file or inline, no-verify, TLS server name); the
``Authorization`` header taken from the configuration on every request (so refreshed tokens are
used). The configuration is the ``kubernetes`` library's or
:class:`dra_driver.kube.kubeconfig.Configuration`, which has the same attributes. A request is
never re-sent once written: whether to retry is the caller's decision. Proxies stay with the
library (:func:`from_configuration` returns None when a proxy is configured). One connection —
its socket, TLS and read buffer — is :mod:`dra_driver.kube.connection`'s.
"""

from __future__ import annotations

import collections
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

from dra_driver import __version__
from dra_driver.kube.connection import Connection, load_cert_data
from dra_driver.kube.connection import Endpoint as Endpoint
from dra_driver.kube.http1 import Response as Response
from dra_driver.kube.http1 import TransportError as TransportError
from dra_driver.kube.http1 import describe as _describe
from dra_driver.kube.http1 import read_head, read_response
from dra_driver.kube.http1 import timed_out as _timed_out
from dra_driver.kube.streams import Stream

CONNECT_ATTEMPTS = 3  # like the library's urllib3.Retry(connect=2)


def from_configuration(
    configuration: Any,
    *,
    timeouts: tuple[float, float],
    max_idle: int = 32,
    proxied: bool | None = None,
    headers: tuple[tuple[str, str], ...] = (),
) -> Transport | None:
    """A transport for a ``kubernetes.client.Configuration``; None when the server is reached
    through a proxy (``proxied``; default: whenever the configuration names one)."""
    if getattr(configuration, "proxy", None) if proxied is None else proxied:
        return None
    url = urllib.parse.urlsplit(configuration.host)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ValueError(f"API server URL {configuration.host!r} is not http(s)://host[:port]")
    tls: ssl.SSLContext | None = None
    server_hostname = None
    if url.scheme == "https":
        tls = ssl.create_default_context(
            cafile=configuration.ssl_ca_cert or None, cadata=configuration.ca_cert_data or None
        )
        if configuration.cert_file:
            tls.load_cert_chain(configuration.cert_file, configuration.key_file or None)
        cert_data = getattr(configuration, "cert_data", None)  # kubeconfig.Configuration's
        if cert_data:
            load_cert_data(tls, cert_data, getattr(configuration, "key_data", None))
        assert_hostname = getattr(configuration, "assert_hostname", None)
        server_hostname = configuration.tls_server_name or (
            assert_hostname if isinstance(assert_hostname, str) else None
        )
        if not configuration.verify_ssl:
            tls.check_hostname = False
            tls.verify_mode = ssl.CERT_NONE
        elif assert_hostname is False:
            tls.check_hostname = False
    endpoint = Endpoint(
        host=url.hostname,
        port=url.port or (443 if url.scheme == "https" else 80),
        base_path=url.path.rstrip("/"),
        tls=tls,
        server_hostname=server_hostname,
    )

    def authorization() -> str | None:
        setting = configuration.auth_settings().get("BearerToken")
        return str(setting["value"]) if setting and setting.get("value") else None

    return Transport(
        endpoint, authorization=authorization, timeouts=timeouts, max_idle=max_idle, headers=headers
    )


class Transport:
    """Thread-safe: each request takes an idle connection or opens one.

    The pool: idle connections are kept (up to ``max_idle``, which callers set to at least the
    number of threads that may request at once) and reused oldest first; one the server closed is
    noticed before use and replaced. :meth:`start_pool` opens ``size`` connections up front, so
    the first burst of requests does not pay a handshake each, and — with ``keepalive_s`` — keeps
    them open: an idle connection older than that gets a cheap request (``GET /version``) so the
    server's idle cut-off (kube-apiserver: 90 s) never closes it, and closed ones are replaced in
    the background. New TLS connections resume the last TLS session (no certificate exchange and
    signatures: about half a full handshake's CPU on both sides).
    """

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        authorization: Callable[[], str | None] = lambda: None,
        timeouts: tuple[float, float] = (5.0, 10.0),
        max_idle: int = 32,
        headers: tuple[tuple[str, str], ...] = (),  # sent on every request (impersonation)
    ) -> None:
        self.endpoint = endpoint
        self._authorization = authorization
        self._timeouts = timeouts
        self._max_idle = max_idle
        self._idle: collections.deque[Connection] = collections.deque()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._session: ssl.SSLSession | None = None
        self._head = (
            f"HTTP/1.1\r\nHost: {endpoint.host_header}\r\nAccept: application/json\r\n"
            f"User-Agent: dra-driver/{__version__}\r\n"
        ) + "".join(f"{name}: {value}\r\n" for name, value in headers)
        self._open = 0  # connections open: idle or in use
        self._keeper: threading.Thread | None = None
        self.connections_opened = 0
        self.sessions_resumed = 0

    def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        content_type: str = "application/json",
    ) -> Response:
        """Send one request (``path`` includes the query) and read the whole response;
        ``content_type`` names the body's media type (e.g. a server-side apply's)."""
        data = self._encode(method, path, body, content_type)
        conn = self._take()
        try:
            conn.sock.sendall(data)
            response, reusable = read_response(conn.rfile, method)
        except (OSError, ValueError, TransportError) as exc:
            self._discard(conn)
            if _timed_out(exc):  # a silent path: the idle ones went through it too
                self._drop_idle()
            raise TransportError(f"{method} {path}: {_describe(exc)}") from exc
        if reusable:
            self._give_back(conn)
        else:
            self._discard(conn)
        return response

    def stream(self, path: str, *, read_timeout_s: float) -> Stream:
        """A streamed GET (a watch) on a connection of its own, never pooled: its status and
        headers are read, its body is :meth:`Stream.chunks`. A read that waits longer than
        ``read_timeout_s`` raises :class:`TransportError` (``timed_out``)."""
        data = self._encode("GET", path, None, "")
        conn = self._connect()
        try:
            conn.sock.settimeout(read_timeout_s)
            conn.sock.sendall(data)
            status, headers, _ = read_head(conn.rfile)
        except (OSError, ValueError, TransportError) as exc:
            conn.close()
            raise TransportError(
                f"GET {path}: {_describe(exc)}", timed_out=_timed_out(exc)
            ) from exc
        return Stream(status, headers, conn)

    def _encode(self, method: str, path: str, body: bytes | None, content_type: str) -> bytes:
        head = f"{method} {self.endpoint.base_path}{path} {self._head}"
        token = self._authorization()
        if token:
            head += f"Authorization: {token}\r\n"
        if body is not None:
            head += f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
        data = (head + "\r\n").encode("latin-1")
        return data + body if body else data

    def start_pool(self, size: int, *, keepalive_s: float = 0.0, warm: int | None = None) -> None:
        """Open ``size`` connections in the background (failures are left to the requests);
        with ``keepalive_s`` > 0, keep ``warm`` of them (default: all) open for good (see the
        class docstring): the others are closed once idle ``keepalive_s``, and a burst opens
        them again (resuming the TLS session the warm ones keep fresh)."""
        if size <= 0 or self._keeper is not None:
            return
        self._max_idle = max(self._max_idle, size)
        keep = size if warm is None else max(0, min(warm, size))
        self._keeper = threading.Thread(
            target=self._keep, args=(size, keepalive_s, keep), name="api-connections", daemon=True
        )
        self._keeper.start()

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            idle, self._idle = list(self._idle), collections.deque()
            self._open -= len(idle)
        for conn in idle:
            conn.close()
        if self._keeper is not None and self._keeper is not threading.current_thread():
            self._keeper.join(timeout=5)

    # ------------------------------------------------------------------ the pool
    def _take(self) -> Connection:
        while True:
            with self._lock:
                conn = self._idle.popleft() if self._idle else None
                if conn is None:
                    self._open += 1  # the one opened below
                    break
            if not conn.dropped():
                return conn
            self._discard(conn)
        try:
            return self._connect()
        except TransportError:
            with self._lock:
                self._open -= 1
            raise

    def _connect(self) -> Connection:
        error: Exception | None = None
        for _ in range(CONNECT_ATTEMPTS):
            session = self._session
            try:
                conn = Connection(self.endpoint, self._timeouts, session)
            except (OSError, ValueError) as exc:
                error = exc
                if session is not None and isinstance(exc, ssl.SSLError):
                    self._session = None  # a session the server cannot take: start afresh
                continue
            self.connections_opened += 1
            if conn.tls and conn.sock.session_reused:  # type: ignore[attr-defined]
                self.sessions_resumed += 1
            return conn
        raise TransportError(
            f"cannot connect to {self.endpoint.host_header}: {_describe(error)}"
        ) from error

    def _give_back(self, conn: Connection) -> None:
        if conn.fresh:  # a new TLS connection: once it has read a ticket, resume from it
            session = conn.sock.session  # type: ignore[attr-defined]
            if session is not None and session.has_ticket:
                conn.fresh = False
                self._session = session
        conn.idle_since = time.monotonic()
        with self._lock:
            if not self._closed.is_set() and len(self._idle) < self._max_idle:
                self._idle.append(conn)
                return
            self._open -= 1
        conn.close()

    def _drop_idle(self) -> None:
        """Close every idle connection: after a connection went silent (no reset, no answer:
        a dropped NAT entry, a dead proxy or peer), the others opened the same way are likely
        dead too, and each would cost a request its full read timeout before being noticed."""
        with self._lock:
            idle, self._idle = list(self._idle), collections.deque()
            self._open -= len(idle)
        for conn in idle:
            conn.close()

    def _discard(self, conn: Connection) -> None:
        with self._lock:
            self._open -= 1
        conn.close()

    def _keep(self, size: int, keepalive_s: float, warm: int) -> None:
        """The pool's thread: warm up ``size``, then (with ``keepalive_s``) keep ``warm``."""
        period = min(max(keepalive_s / 2, 0.1), 10.0)
        while not self._closed.is_set():
            self._refresh(keepalive_s, warm)
            self._fill(size)
            size = warm
            if keepalive_s <= 0 or self._closed.wait(period):
                return

    def _fill(self, size: int) -> None:
        """Open connections until ``size`` are open (the first one proves the server answers
        and, over TLS, learns the session the others resume)."""
        while not self._closed.is_set():
            with self._lock:
                if self._open >= size:
                    return
                self._open += 1
            try:
                conn = self._connect()
            except TransportError:
                with self._lock:
                    self._open -= 1
                return  # the server is not there: requests will say so, the next round retries
            if conn.tls and self._session is None and not self._ping(conn):
                return
            self._give_back(conn)

    def _refresh(self, keepalive_s: float, warm: int) -> None:
        """Drop connections the server closed; of those idle longer than ``keepalive_s``, ping
        as many as keep ``warm`` open and close the others (one request each would keep them
        open: per agent and per keep-alive period, what a fleet of agents asks of the server
        while idle)."""
        with self._lock:
            count = len(self._idle)
        kept = 0
        for _ in range(count):
            with self._lock:
                if not self._idle:
                    return
                conn = self._idle.popleft()
            if conn.dropped():
                self._discard(conn)
            elif keepalive_s > 0 and time.monotonic() - conn.idle_since >= keepalive_s:
                if kept >= warm:
                    self._discard(conn)
                elif self._ping(conn):
                    kept += 1
                    self._give_back(conn)
            else:
                kept += 1
                with self._lock:  # a full rotation keeps the order: oldest used first
                    self._idle.append(conn)

    def _ping(self, conn: Connection) -> bool:
        """A cheap request on ``conn`` (any complete answer will do); False: it is gone."""
        head = f"GET {self.endpoint.base_path}/version {self._head}"
        token = self._authorization()
        if token:
            head += f"Authorization: {token}\r\n"
        try:
            conn.sock.sendall((head + "\r\n").encode("latin-1"))
            _, reusable = read_response(conn.rfile, "GET")
        except (OSError, ValueError, TransportError) as exc:
            reusable = False
            if _timed_out(exc):
                self._drop_idle()
        if not reusable:
            self._discard(conn)
        return reusable
