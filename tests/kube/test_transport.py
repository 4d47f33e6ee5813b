"""The lean HTTP/1.1 transport against a scripted server on a real socket (and real TLS)."""

from __future__ import annotations

import socket
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import kubernetes
import pytest

from dra_driver.kube import transport

Reply = Callable[[bytes], bytes | None]  # request bytes → raw reply (None: close silently)
CLOSE = b"<close>"  # a reply ending with this: sent without it, then the connection is closed


class Scripted:
    """Answers each request with the next reply; records requests and connections."""

    def __init__(self, replies: list[Reply], tls: ssl.SSLContext | None = None) -> None:
        self.replies = replies
        self.requests: list[bytes] = []
        self.connections = 0
        self.tls = tls
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        if self.tls is not None:
            try:
                conn = self.tls.wrap_socket(conn, server_side=True)
            except (ssl.SSLError, OSError):
                conn.close()
                return
        buffer = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                while len(buffer) < length:
                    buffer += conn.recv(65536)
                request, buffer = head + b"\r\n\r\n" + buffer[:length], buffer[length:]
                self.requests.append(request)
                reply = self.replies.pop(0)(request)
                if reply is None:
                    return
                conn.sendall(reply.removesuffix(CLOSE))
                if reply.endswith(CLOSE):
                    return

    def endpoint(self, **kw: object) -> transport.Endpoint:
        return transport.Endpoint(host="127.0.0.1", port=self.port, **kw)  # type: ignore[arg-type]

    def close(self) -> None:
        self.listener.close()


def fixed(raw: bytes) -> Reply:
    return lambda request: raw


def ok(body: bytes, *extra: str) -> Reply:
    head = ["HTTP/1.1 200 OK", f"Content-Length: {len(body)}", *extra]
    return fixed(("\r\n".join(head) + "\r\n\r\n").encode() + body)


@pytest.fixture
def scripted() -> Iterator[Callable[..., Scripted]]:
    made: list[Scripted] = []

    def make(replies: list[Reply], tls: ssl.SSLContext | None = None) -> Scripted:
        made.append(Scripted(replies, tls))
        return made[-1]

    yield make
    for server in made:
        server.close()


def test_framings_and_connection_reuse(scripted: Callable[..., Scripted]) -> None:
    server = scripted(
        [
            ok(b'{"a":1}'),
            fixed(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"),
            fixed(
                b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n"
                b'4;ext=1\r\n{"x"\r\n3\r\n:2}\r\n0\r\nTrailer: t\r\n\r\n'
            ),
            ok(b"{}", "Connection: close"),
            fixed(b"HTTP/1.0 200 OK\r\n\r\nuntil close" + CLOSE),
            ok(b"[]"),
        ]
    )
    http = transport.Transport(server.endpoint(base_path="/prefix"), authorization=lambda: "t1")
    first = http.request("GET", "/a?x=1")
    assert (first.status, first.body) == (200, b'{"a":1}')
    assert first.headers["content-length"] == "7"
    assert http.request("POST", "/b", body=b'{"k":"v"}').body == b"{}"
    chunked = http.request("GET", "/c")
    assert (chunked.status, chunked.body) == (404, b'{"x":2}')
    assert server.connections == 1  # three requests, one kept-alive connection
    assert http.request("GET", "/d").body == b"{}"  # then the server says close
    assert http.request("GET", "/e").body == b"until close"  # a fresh connection
    assert http.request("GET", "/f").body == b"[]"  # and another: no length = closed
    assert server.connections == 3
    assert server.requests[0].startswith(b"GET /prefix/a?x=1 HTTP/1.1\r\n")
    assert b"\r\nAuthorization: t1\r\n" in server.requests[0]
    assert server.requests[1].endswith(b'Content-Length: 9\r\n\r\n{"k":"v"}')
    assert b"Content-Type: application/json" in server.requests[1]
    http.close()


def test_idle_connection_closed_by_the_server_is_replaced_before_use(
    scripted: Callable[..., Scripted],
) -> None:
    server = scripted([fixed(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n1" + CLOSE), ok(b"2")])
    http = transport.Transport(server.endpoint())
    assert http.request("GET", "/one").body == b"1"
    (idle,) = http._idle
    for _ in range(200):  # the server's FIN arrives
        if idle.dropped():
            break
        threading.Event().wait(0.01)
    assert http.request("GET", "/two").body == b"2"  # not an error: a new connection
    assert server.connections == 2 and len(server.requests) == 2


def test_a_dropped_or_garbled_reply_is_an_error_and_never_resent(
    scripted: Callable[..., Scripted],
) -> None:
    server = scripted(
        [
            lambda r: None,
            fixed(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort" + CLOSE),
            fixed(b"SMTP ready\r\n"),
            fixed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"),
        ]
    )
    http = transport.Transport(server.endpoint(), timeouts=(1.0, 1.0))
    with pytest.raises(transport.TransportError, match="closed before a response"):
        http.request("PUT", "/x", body=b"{}")
    assert len(server.requests) == 1
    with pytest.raises(transport.TransportError, match="5 of 10"):
        http.request("GET", "/y")
    with pytest.raises(transport.TransportError, match="status line"):
        http.request("GET", "/z")
    with pytest.raises(transport.TransportError, match="chunk size"):
        http.request("GET", "/w")
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    nowhere = transport.Transport(transport.Endpoint(host="127.0.0.1", port=port))
    with pytest.raises(transport.TransportError, match="cannot connect"):
        nowhere.request("GET", "/")


def test_configuration_gives_tls_auth_and_refreshed_tokens(
    scripted: Callable[..., Scripted], tmp_path: Path
) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=apiserver.test", "-addext", "subjectAltName=DNS:apiserver.test"),
            *("-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_tls.load_cert_chain(cert, key)
    server = scripted([ok(b"{}"), ok(b"{}")], tls=server_tls)
    config = kubernetes.client.Configuration()
    config.host = f"https://127.0.0.1:{server.port}"
    config.ssl_ca_cert = str(cert)
    config.api_key = {"authorization": "Bearer one"}
    refreshes = [0]

    def refresh(c: kubernetes.client.Configuration) -> None:  # e.g. a rotated token file
        refreshes[0] += 1
        c.api_key = {"authorization": f"Bearer t{refreshes[0]}"}

    config.refresh_api_key_hook = refresh
    # The certificate names apiserver.test, not 127.0.0.1: verification fails...
    strict = transport.from_configuration(config, timeouts=(2.0, 2.0))
    assert strict is not None
    with pytest.raises(transport.TransportError, match=r"certificate|hostname|match"):
        strict.request("GET", "/")
    # ...unless the kubeconfig names the TLS server.
    config.tls_server_name = "apiserver.test"
    http = transport.from_configuration(config, timeouts=(2.0, 2.0))
    assert http is not None
    http.request("GET", "/")
    http.request("GET", "/")
    assert [r.split(b"Authorization: ")[1].split(b"\r\n")[0] for r in server.requests] == [
        b"Bearer t2",
        b"Bearer t3",
    ]
    config.proxy = "http://proxy.example:3128"
    assert transport.from_configuration(config, timeouts=(2.0, 2.0)) is None
    config.host = "unix:///nope"
    config.proxy = None
    with pytest.raises(ValueError, match="not http"):
        transport.from_configuration(config, timeouts=(2.0, 2.0))


def test_an_ascii_host_is_resolved_as_bytes_and_any_other_name_through_idna() -> None:
    """An ASCII name or address goes to getaddrinfo and to TLS as bytes, which keeps the IDNA
    codec (~0.4 MiB) out of the agent; a name that is not ASCII stays str and is encoded."""
    plain = transport.Endpoint(host="10.0.0.1", port=6443, server_hostname="apiserver.test")
    assert plain.address == (b"10.0.0.1", 6443)
    assert plain.tls_name == b"apiserver.test"
    assert transport.Endpoint(host="::1", port=443).tls_name == b"::1"
    named = transport.Endpoint(host="bücher.example", port=443)
    assert named.address == ("bücher.example", 443)
    assert named.tls_name == "bücher.example"
