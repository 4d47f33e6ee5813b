"""A small HTTP/1.1 client for the API server's JSON requests: kept-alive connections, TLS, auth.

Why it exists: every prepare GETs its ResourceClaim, and through the ``kubernetes`` client
library (its REST layer, urllib3, ``http.client`` and the ``email`` header parser) one small GET
cost about 0.5 ms of CPU on a 2-core node — a quarter of the plugin's whole CPU per claim, and
CPU is what limits how many claims the GIL lets us prepare at once. Writing the request line
and parsing the status line and headers ourselves costs about a fifth of that.

What it does, and no more: HTTP/1.1 requests with a ``Content-Length`` body; responses framed
by ``Content-Length``, ``chunked`` transfer coding or connection close; a pool of idle
connections (an idle connection the server has closed is noticed before reuse, as urllib3
does); TLS with the client library's settings (CA file or data, client certificate, no-verify,
TLS server name); the ``Authorization`` header taken from the library's configuration on every
request (so refreshed tokens are used). A request is never re-sent once written: whether to retry
is the caller's decision. Proxies and streaming (watch) stay with the library
(:func:`from_configuration` returns None when a proxy is configured).
"""

from __future__ import annotations

import dataclasses
import select
import socket
import ssl
import threading
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any, BinaryIO

from dra_driver import __version__

MAX_LINE = 65536
MAX_HEADERS = 200
CONNECT_ATTEMPTS = 3  # like the library's urllib3.Retry(connect=2)


class TransportError(Exception):
    """No (complete) response: connection refused, dropped, timed out or garbled."""


@dataclasses.dataclass(frozen=True, slots=True)
class Response:
    status: int
    headers: Mapping[str, str]  # lower-case names
    body: bytes


@dataclasses.dataclass(frozen=True, slots=True)
class Endpoint:
    """Where the API server is and how to reach it."""

    host: str
    port: int
    base_path: str = ""  # e.g. a proxy's /k8s/clusters/x prefix; no trailing slash
    tls: ssl.SSLContext | None = None
    server_hostname: str | None = None  # for SNI and certificate checks; default: host

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def from_configuration(
    configuration: Any,
    *,
    timeouts: tuple[float, float],
    max_idle: int = 32,
    proxied: bool | None = None,
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

    return Transport(endpoint, authorization=authorization, timeouts=timeouts, max_idle=max_idle)


class _Connection:
    def __init__(self, endpoint: Endpoint, timeouts: tuple[float, float]) -> None:
        sock = socket.create_connection((endpoint.host, endpoint.port), timeout=timeouts[0])
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if endpoint.tls is not None:
                sock = endpoint.tls.wrap_socket(
                    sock, server_hostname=endpoint.server_hostname or endpoint.host
                )
            sock.settimeout(timeouts[1])
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        self.rfile: BinaryIO = sock.makefile("rb", buffering=MAX_LINE)  # type: ignore[assignment]

    def dropped(self) -> bool:
        """An idle connection with something to read: the server closed it (or misbehaves)."""
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    def close(self) -> None:
        self.rfile.close()
        self.sock.close()


class Transport:
    """Thread-safe: each request takes an idle connection or opens one."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        authorization: Callable[[], str | None] = lambda: None,
        timeouts: tuple[float, float] = (5.0, 10.0),
        max_idle: int = 32,
    ) -> None:
        self.endpoint = endpoint
        self._authorization = authorization
        self._timeouts = timeouts
        self._max_idle = max_idle
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()
        self._closed = False

    def request(self, method: str, path: str, *, body: bytes | None = None) -> Response:
        """Send one request (``path`` includes the query) and read the whole response."""
        head = [
            f"{method} {self.endpoint.base_path}{path} HTTP/1.1",
            f"Host: {self.endpoint.host_header}",
            "Accept: application/json",
            f"User-Agent: dra-driver/{__version__}",
        ]
        token = self._authorization()
        if token:
            head.append(f"Authorization: {token}")
        if body is not None:
            head.append("Content-Type: application/json")
            head.append(f"Content-Length: {len(body)}")
        data = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + (body or b"")
        conn = self._take()
        try:
            conn.sock.sendall(data)
            response, reusable = _read_response(conn.rfile, method)
        except (OSError, ValueError, TransportError) as exc:
            conn.close()
            raise TransportError(f"{method} {path}: {_describe(exc)}") from exc
        if reusable:
            self._give_back(conn)
        else:
            conn.close()
        return response

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _take(self) -> _Connection:
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                break
            if not conn.dropped():
                return conn
            conn.close()
        error: Exception | None = None
        for _ in range(CONNECT_ATTEMPTS):
            try:
                return _Connection(self.endpoint, self._timeouts)
            except (OSError, ValueError) as exc:
                error = exc
        raise TransportError(
            f"cannot connect to {self.endpoint.host_header}: {_describe(error)}"
        ) from error

    def _give_back(self, conn: _Connection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._max_idle:
                self._idle.append(conn)
                return
        conn.close()


def _describe(exc: BaseException | None) -> str:
    if isinstance(exc, TimeoutError | socket.timeout):
        return "timed out"
    return str(exc) or type(exc).__name__


def _readline(rfile: BinaryIO) -> bytes:
    line = rfile.readline(MAX_LINE + 1)
    if len(line) > MAX_LINE:
        raise TransportError("response line too long")
    return line


def _read_response(rfile: BinaryIO, method: str) -> tuple[Response, bool]:
    """One response (skipping 1xx); also whether the connection may be reused."""
    while True:
        status_line = _readline(rfile)
        if not status_line:
            raise TransportError("connection closed before a response")
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise TransportError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
        status = int(parts[1])
        headers: dict[str, str] = {}
        for _ in range(MAX_HEADERS + 1):
            line = _readline(rfile)
            if line in (b"\r\n", b"\n"):
                break
            if not line:
                raise TransportError("connection closed in the response headers")
            name, colon, value = line.decode("latin-1").partition(":")
            if not colon:
                raise TransportError(f"malformed header line {line[:80]!r}")
            key = name.strip().lower()
            headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
        else:
            raise TransportError("too many response headers")
        if status >= 200:
            break
    tokens = {t.strip() for t in headers.get("connection", "").lower().split(",")}
    reusable = "close" not in tokens and (parts[0] != b"HTTP/1.0" or "keep-alive" in tokens)
    if method == "HEAD" or status in (204, 304):
        return Response(status, headers, b""), reusable
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return Response(status, headers, _read_chunked(rfile)), reusable
    length = headers.get("content-length")
    if length is None:  # the body runs until the server closes the connection
        return Response(status, headers, rfile.read()), False
    if not length.isdigit():
        raise TransportError(f"bad Content-Length {length!r}")
    body = rfile.read(int(length))
    if len(body) != int(length):
        raise TransportError(f"connection closed after {len(body)} of {length} body bytes")
    return Response(status, headers, body), reusable


def _read_chunked(rfile: BinaryIO) -> bytes:
    chunks: list[bytes] = []
    while True:
        size_line = _readline(rfile).split(b";", 1)[0].strip()
        try:
            size = int(size_line, 16)
        except ValueError:
            raise TransportError(f"bad chunk size {size_line[:20]!r}") from None
        if size == 0:
            break
        chunk = rfile.read(size)
        if len(chunk) != size or _readline(rfile) not in (b"\r\n", b"\n"):
            raise TransportError("connection closed inside a chunk")
        chunks.append(chunk)
    while _readline(rfile) not in (b"\r\n", b"\n", b""):  # trailer fields, ignored
        pass
    return b"".join(chunks)
