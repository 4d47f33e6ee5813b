"""Reading one HTTP/1.1 response off a connection: status line, headers and the body's framing.

Why it exists apart from :mod:`dra_driver.kube.transport` (connections, TLS, the pool): the
wire format is one concern and the most exacting one — ``Content-Length``, ``chunked`` transfer
coding or a body that runs until the server closes, 1xx interim responses, whether the
connection may be reused, and every way a reply can be cut short or garbled, each a
:class:`TransportError` rather than a wrong answer.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator, Mapping
from typing import BinaryIO

from dra_driver import records

MAX_LINE = 65536
MAX_HEADERS = 200


class TransportError(Exception):
    """No (complete) response: connection refused, dropped, timed out or garbled
    (``timed_out``: a read waited past its timeout)."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


@records.record
class Response:
    status: int
    headers: Mapping[str, str]  # lower-case names
    body: bytes


def _readline(rfile: BinaryIO) -> bytes:
    line = rfile.readline(MAX_LINE + 1)
    if len(line) > MAX_LINE:
        raise TransportError("response line too long")
    return line


def read_response(rfile: BinaryIO, method: str) -> tuple[Response, bool]:
    """One response (skipping 1xx); also whether the connection may be reused."""
    status, headers, reusable = read_head(rfile)
    body, reusable = read_body(rfile, method, status, headers, reusable)
    return Response(status, headers, body), reusable


def read_head(rfile: BinaryIO) -> tuple[int, dict[str, str], bool]:
    """A response's status and headers (skipping 1xx), and whether the connection may be
    reused once its body is read; the body is left on ``rfile``."""
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
    return status, headers, reusable


def read_body(
    rfile: BinaryIO, method: str, status: int, headers: Mapping[str, str], reusable: bool
) -> tuple[bytes, bool]:
    """The whole body after :func:`read_head`, by its framing; and whether the connection may
    be reused."""
    if method == "HEAD" or status in (204, 304):
        return b"", reusable
    if chunked(headers):
        return b"".join(iter_chunks(rfile)), reusable
    length = headers.get("content-length")
    if length is None:  # the body runs until the server closes the connection
        return rfile.read(), False
    if not length.isdigit():
        raise TransportError(f"bad Content-Length {length!r}")
    body = rfile.read(int(length))
    if len(body) != int(length):
        raise TransportError(f"connection closed after {len(body)} of {length} body bytes")
    return body, reusable


def chunked(headers: Mapping[str, str]) -> bool:
    return "chunked" in headers.get("transfer-encoding", "").lower()


def iter_chunks(rfile: BinaryIO) -> Iterator[bytes]:
    """The chunks of a ``chunked`` body as they arrive (a watch stream), trailers skipped."""
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
        yield chunk
    while _readline(rfile) not in (b"\r\n", b"\n", b""):  # trailer fields, ignored
        pass


def timed_out(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is a read or connect that waited past its timeout."""
    return isinstance(exc, TimeoutError | socket.timeout) or isinstance(
        exc.__cause__, TimeoutError | socket.timeout
    )


def describe(exc: BaseException | None) -> str:
    """``exc`` in a few words, for a :class:`TransportError`'s message."""
    if isinstance(exc, TimeoutError | socket.timeout):
        return "timed out"
    return str(exc) or type(exc).__name__
