"""A streamed HTTP response: a watch's body read as it arrives, on a connection of its own.

Why it exists apart from :mod:`dra_driver.kube.transport` (the pool, requests read whole): a
watch holds its connection for as long as the server keeps it open and must tell a stream that
broke off or went silent from one that ended; that is this small reader's concern. The
transport opens the connection and reads the status and headers (:meth:`Transport.stream
<dra_driver.kube.transport.Transport.stream>`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import BinaryIO, Protocol

from dra_driver.kube.http1 import (
    TransportError,
    chunked,
    describe,
    iter_chunks,
    read_body,
    timed_out,
)


class Connection(Protocol):
    rfile: BinaryIO

    def close(self) -> None: ...


class Stream:
    """A streamed response: ``status``, ``headers``, and the body as it arrives."""

    def __init__(self, status: int, headers: Mapping[str, str], conn: Connection) -> None:
        self.status, self.headers, self._conn = status, headers, conn

    def body(self) -> bytes:
        """The whole body (an error's Status); closes the stream."""
        try:
            data, _ = read_body(self._conn.rfile, "GET", self.status, self.headers, False)
            return data
        except (OSError, ValueError, TransportError):
            return b""
        finally:
            self.close()

    def chunks(self) -> Iterator[bytes]:
        """The body's pieces as they arrive; raises :class:`TransportError` when the stream
        breaks off or stays silent past the read timeout (``timed_out``)."""
        rfile = self._conn.rfile
        try:
            if chunked(self.headers):
                yield from iter_chunks(rfile)
            else:
                while piece := rfile.read1(65536):  # type: ignore[attr-defined]
                    yield piece
        except (OSError, ValueError, TransportError) as exc:
            raise TransportError(describe(exc), timed_out=timed_out(exc)) from exc

    def close(self) -> None:
        self._conn.close()
