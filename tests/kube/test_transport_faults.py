"""Issue 16, defect 12 (found again by the fault suite once the pool kept connections warm): a
network path that goes silent must cost one request its read timeout, not one per idle
connection of the pool."""

from __future__ import annotations

import time

import pytest

from dra_driver.kube import transport
from dra_driver.testing.fakeapi import fakeserver, faultproxy, memory


def test_one_silent_connection_drops_the_idle_ones_with_it() -> None:
    api = memory.InMemoryApi(use_default_cel=False)
    api.put_node("n1")
    with fakeserver.FakeApiServer(api) as server:
        host, port = server.url.removeprefix("http://").split(":")
        with faultproxy.FaultProxy((host, int(port))) as proxy:
            lean = transport.Transport(
                transport.Endpoint(host="127.0.0.1", port=proxy.port), timeouts=(2.0, 0.5)
            )
            lean.start_pool(4)
            deadline = time.monotonic() + 10
            while proxy.open_connections() < 4:
                assert time.monotonic() < deadline, "the pool never opened its connections"
                time.sleep(0.02)
            assert proxy.blackhole_all() == 4  # every pooled connection goes silent
            with pytest.raises(transport.TransportError, match="timed out"):
                lean.request("GET", "/api/v1/nodes/n1")
            response = lean.request("GET", "/api/v1/nodes/n1")  # a new connection, at once
            assert response.status == 200
            lean.close()
