"""The transport's warm pool over real TLS on loopback: the fake API server with a client
certificate, as a real API server is reached (session tickets, idle cut-off, resumption)."""

from __future__ import annotations

import select
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from dra_driver.kube import connection, transport
from dra_driver.testing.fakeapi import certs, fakeserver

WAIT_S = 20.0  # generous: a loaded 2-core machine


@pytest.fixture(scope="module")
def bundle() -> certs.Bundle:
    return certs.make_bundle()


@pytest.fixture
def serve(bundle: certs.Bundle) -> Iterator[Callable[..., fakeserver.FakeApiServer]]:
    started: list[fakeserver.FakeApiServer] = []

    def start(idle_timeout_s: float | None = None) -> fakeserver.FakeApiServer:
        server = fakeserver.FakeApiServer(tls=bundle, idle_timeout_s=idle_timeout_s).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def client(server: fakeserver.FakeApiServer, bundle: certs.Bundle) -> transport.Transport:
    port = int(server.url.rsplit(":", 1)[1])
    endpoint = transport.Endpoint(host="127.0.0.1", port=port, tls=bundle.client_context())
    return transport.Transport(endpoint, timeouts=(5.0, 5.0))


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        threading.Event().wait(0.01)


def idle(http: transport.Transport) -> list[connection.Connection]:
    with http._lock:
        return list(http._idle)


def test_a_fresh_tls_connection_with_unread_session_tickets_is_used_not_dropped(
    serve: Callable[..., fakeserver.FakeApiServer], bundle: certs.Bundle
) -> None:
    server = serve()
    http = client(server, bundle)
    http.start_pool(3)  # no keep-alive: just opened up front
    wait_for(lambda: len(idle(http)) == 3, "three warm connections")
    assert server.stats()["connections"] == 3
    # The server's TLS 1.3 session tickets arrive after the handshake and sit unread: the
    # unused connections are readable although nobody closed them.
    # (The first was pinged to learn the session: it has read its tickets.)
    socks = [c.sock for c in idle(http)]
    wait_for(lambda: len(select.select(socks, [], [], 0)[0]) == 2, "the session tickets")
    for conn in idle(http):
        assert not conn.dropped()
    for _ in range(6):  # more requests than connections, one after the other
        assert http.request("GET", "/version").status == 200
    assert server.stats()["connections"] == 3  # no connection discarded, none opened
    assert http.connections_opened == 3
    assert http.sessions_resumed == 2  # the first one's session, resumed by the other two
    assert server.stats()["tlsResumed"] == 2
    http.close()


def test_reconnect_after_the_server_closed_idle_connections_resumes_the_session(
    serve: Callable[..., fakeserver.FakeApiServer], bundle: certs.Bundle
) -> None:
    server = serve(idle_timeout_s=0.2)
    http = client(server, bundle)
    assert http.request("GET", "/version").status == 200
    (conn,) = idle(http)
    wait_for(conn.dropped, "the server to close the idle connection")
    assert http.request("GET", "/version").status == 200  # not an error: a new connection
    stats = server.stats()
    assert (stats["connections"], stats["tlsResumed"]) == (2, 1)
    assert http.sessions_resumed == 1
    http.close()


def test_keepalive_keeps_the_pool_open_past_the_servers_idle_cutoff(
    serve: Callable[..., fakeserver.FakeApiServer], bundle: certs.Bundle
) -> None:
    cutoff = 2.0
    server = serve(idle_timeout_s=cutoff)
    http = client(server, bundle)
    http.start_pool(2, keepalive_s=0.25)
    wait_for(lambda: len(idle(http)) == 2, "two warm connections")
    first = set(map(id, idle(http)))
    threading.Event().wait(cutoff * 2.5)  # quiet: without keep-alive both would be closed
    assert server.stats()["connections"] == 2
    assert set(map(id, idle(http))) == first
    http.close()


def test_the_pool_is_refilled_in_the_background_when_the_server_drops_it(
    serve: Callable[..., fakeserver.FakeApiServer], bundle: certs.Bundle
) -> None:
    server = serve()
    http = client(server, bundle)
    http.start_pool(3, keepalive_s=0.2)
    wait_for(lambda: len(idle(http)) == 3, "three warm connections")
    server._httpd.drop_connections()  # e.g. the API server restarted behind its address
    wait_for(lambda: server.stats()["connections"] == 6, "three new connections")
    wait_for(lambda: len(idle(http)) == 3, "three warm connections again")
    assert server.stats()["tlsResumed"] >= 3  # resumed, not full handshakes
    for _ in range(3):
        assert http.request("GET", "/version").status == 200
    assert server.stats()["connections"] == 6
    http.close()


def test_a_pool_that_cannot_reach_the_server_leaves_the_error_to_requests(
    bundle: certs.Bundle,
) -> None:
    server = fakeserver.FakeApiServer(tls=bundle).start()
    http = client(server, bundle)
    server.stop()
    http.start_pool(2, keepalive_s=0.1)
    with pytest.raises(transport.TransportError, match="cannot connect"):
        http.request("GET", "/version")
    http.close()
    assert http._keeper is not None
    http._keeper.join(timeout=WAIT_S)
    assert not http._keeper.is_alive()


def test_only_the_warm_connections_are_kept_open_while_idle(
    serve: Callable[..., fakeserver.FakeApiServer], bundle: certs.Bundle
) -> None:
    """A fleet's idle cost: every connection kept open costs the server a ping per keep-alive
    period per node, so of the connections opened at start only ``warm`` are kept."""
    server = serve()
    http = client(server, bundle)
    http.start_pool(4, keepalive_s=0.3, warm=1)
    wait_for(lambda: server.stats()["connections"] == 4, "four connections opened at start")
    wait_for(lambda: len(idle(http)) == 1, "the idle ones beyond the warm one closed")
    pings = lambda: server.requests.snapshot()[0]["requests"]  # noqa: E731
    first = pings()
    wait_for(lambda: pings() >= first + 2, "the warm one pinged on")
    assert [r["resource"] for r in server.requests.snapshot()] == ["/version"]
    # The keeper takes the warm one out of the pool while it pings it: wait until it is back.
    wait_for(lambda: len(idle(http)) == 1, "the warm one back in the pool between pings")
    assert server.stats()["connections"] == 4  # none re-opened
    assert http.request("GET", "/version").status == 200  # a request still finds one
    http.close()
