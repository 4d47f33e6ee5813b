"""A connection to the API server: where it is (:class:`Endpoint`), one socket with its TLS and
read buffer (:class:`Connection`), and a client certificate given inline.

Why it exists apart from :mod:`dra_driver.kube.transport` (the pool, requests, keep-alive):
opening a socket, wrapping it in TLS with a resumed session and telling whether an idle one was
closed by the server are one connection's concerns; the transport decides which connection a
request takes and when one is opened, kept or dropped.
"""

from __future__ import annotations

import os
import socket
import ssl
import tempfile
import time
from typing import BinaryIO

from dra_driver import records

READ_BUFFER = 16384


@records.record
class Endpoint:
    """Where the API server is and how to reach it."""

    host: str
    port: int
    base_path: str = ""  # e.g. a proxy's /k8s/clusters/x prefix; no trailing slash
    tls: ssl.SSLContext | None = None
    server_hostname: str | None = None  # for SNI and certificate checks; default: host

    @property
    def address(self) -> tuple[str | bytes, int]:
        """``(host, port)`` to connect to, an ASCII host as bytes: a ``str`` host makes
        ``getaddrinfo`` load the IDNA codec (``encodings.idna``, ``stringprep``,
        ``unicodedata``: ~0.4 MiB per agent for the agent's life); a name that is not ASCII
        stays ``str`` and is IDNA-encoded as before."""
        return (_ascii(self.host), self.port)

    @property
    def tls_name(self) -> str | bytes:
        """The TLS server name (SNI and the certificate check), as :attr:`address` encodes it."""
        return _ascii(self.server_hostname or self.host)

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def _ascii(name: str) -> str | bytes:
    return name.encode("ascii") if name.isascii() else name


class Connection:
    __slots__ = ("fresh", "idle_since", "rfile", "sock", "tls")

    def __init__(
        self,
        endpoint: Endpoint,
        timeouts: tuple[float, float],
        session: ssl.SSLSession | None = None,
    ) -> None:
        sock = socket.create_connection(endpoint.address, timeout=timeouts[0])  # type: ignore[arg-type]
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if endpoint.tls is not None:
                sock = endpoint.tls.wrap_socket(
                    sock,
                    server_hostname=endpoint.tls_name,
                    session=session,
                )
            sock.settimeout(timeouts[1])
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        self.tls = isinstance(sock, ssl.SSLSocket)
        # 16 KiB: a TLS record's most, so a larger buffer saves no reads; it is held per
        # connection for the agent's life (64 KiB was ~0.3 MiB per agent, docs/fleet.md).
        self.rfile: BinaryIO = sock.makefile("rb", buffering=READ_BUFFER)  # type: ignore[assignment]
        self.idle_since = time.monotonic()
        self.fresh = self.tls  # TLS, and its session not yet learnt (see Transport._give_back)

    def dropped(self) -> bool:
        """Whether an idle connection is unusable: the server closed it (or sent something
        nobody asked for). A non-blocking read tells, and it must be TLS-aware: a TLS 1.3 server
        sends session tickets after the handshake, which a client reads only with its next read,
        so a fresh connection is readable without having been closed. Reading through TLS
        consumes them (the pool then resumes from that session) and finds nothing (alive), the
        end (closed, with or without a close_notify) or data (unusable)."""
        sock = self.sock
        try:
            timeout = sock.gettimeout()
            sock.settimeout(0.0)
            try:
                sock.recv(1)  # data, or b"" (the end): unusable either way
                return True
            finally:
                sock.settimeout(timeout)
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
            return False  # nothing to read (TLS: after consuming any session tickets)
        except (OSError, ValueError):
            return True

    def close(self) -> None:
        self.rfile.close()
        self.sock.close()


def load_cert_data(tls: ssl.SSLContext, cert: bytes, key: bytes | None) -> None:
    """A client certificate given inline: ``ssl`` loads only files, so through a private
    temporary directory, removed at once."""
    with tempfile.TemporaryDirectory(prefix="dra-driver-tls-") as tmp:
        cert_path = os.path.join(tmp, "client.crt")
        key_path = os.path.join(tmp, "client.key") if key else None
        for path, data in ((cert_path, cert), (key_path, key)):
            if path is not None and data is not None:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
        tls.load_cert_chain(cert_path, key_path)
