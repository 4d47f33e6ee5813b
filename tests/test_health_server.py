"""HealthServer over real HTTP on 127.0.0.1: probes, readiness flips, metrics, flags."""

from __future__ import annotations

import argparse
import http.client
import json
import socket
from collections.abc import Iterator
from typing import NamedTuple

import pytest

from dra_driver import health_server, metrics


def get(
    server: health_server.HealthServer, path: str, headers: dict[str, str] | None = None
) -> tuple[int, str, str]:
    host, port = server.address
    conn = http.client.HTTPConnection(host, port, timeout=5)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type") or "", resp.read().decode()
    finally:
        conn.close()


class Running(NamedTuple):
    server: health_server.HealthServer
    ready: health_server.Readiness
    metrics: metrics.DriverMetrics


@pytest.fixture
def setup() -> Iterator[Running]:
    m = metrics.new()
    ready = health_server.Readiness()
    server = health_server.HealthServer(
        registry=m.registry, readiness=ready, host="127.0.0.1", port=0
    )
    with server:
        yield Running(server, ready, m)


def test_healthz_is_ok_while_not_ready(setup: Running) -> None:
    server, _, _ = setup
    assert get(server, "/healthz")[0] == 200
    assert get(server, "/healthz")[2] == "ok\n"


def test_readyz_needs_registration_and_slices(setup: Running) -> None:
    server, ready, _ = setup
    status, ctype, body = get(server, "/readyz")
    assert (status, ctype) == (503, "application/json")
    assert json.loads(body) == {
        "ready": False,
        "conditions": {"registered": False, "slices_published": False},
    }
    ready.set("registered")
    assert get(server, "/readyz")[0] == 503
    ready.set("slices_published")
    status, _, body = get(server, "/readyz")
    assert status == 200 and json.loads(body)["ready"] is True
    ready.set("registered", False)  # the kubelet dropped us: not ready again
    assert get(server, "/readyz")[0] == 503


def test_metrics_text_and_openmetrics(setup: Running) -> None:
    server, _, m = setup
    with m.request("prepare"):
        pass
    status, ctype, body = get(server, "/metrics")
    assert status == 200 and ctype.startswith("text/plain")
    assert 'dra_driver_requests_total{operation="prepare",result="success"} 1.0' in body
    status, ctype, body = get(
        server, "/metrics", {"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    assert ctype.startswith("application/openmetrics-text")
    assert body.rstrip().endswith("# EOF")


def test_unknown_path_is_404(setup: Running) -> None:
    server, _, _ = setup
    status, _, body = get(server, "/nope?x=1")
    assert status == 404 and "/nope" in body


def test_readiness_refuses_unknown_condition() -> None:
    ready = health_server.Readiness(conditions=health_server.DEVICE_PLUGIN_CONDITIONS)
    with pytest.raises(health_server.UnknownCondition, match="slices_published"):
        ready.set("slices_published")
    ready.set("registered")
    assert ready.is_ready()
    with pytest.raises(health_server.UnknownCondition):
        health_server.Readiness(conditions=())


def test_port_in_use_is_a_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = health_server.HealthServer(
            registry=metrics.new().registry,
            readiness=health_server.Readiness(),
            host="127.0.0.1",
            port=port,
        )
        with pytest.raises(health_server.HealthServerError, match=f"127.0.0.1:{port}"):
            server.start()


def test_stop_closes_the_socket_and_is_idempotent() -> None:
    server = health_server.HealthServer(
        registry=metrics.new().registry,
        readiness=health_server.Readiness(),
        host="127.0.0.1",
        port=0,
    )
    server.start()
    host, port = server.address
    server.stop()
    server.stop()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host, port), timeout=2).close()
    with pytest.raises(health_server.HealthServerError):
        _ = server.address


def test_flags_and_env_twins(monkeypatch: pytest.MonkeyPatch) -> None:
    def parse(*argv: str) -> argparse.Namespace:
        parser = argparse.ArgumentParser(exit_on_error=False)
        health_server.add_flags(parser)
        return parser.parse_args(argv)

    monkeypatch.delenv("METRICS_ADDRESS", raising=False)
    monkeypatch.delenv("POD_IP", raising=False)
    args = parse()
    assert (args.metrics_address, args.metrics_port) == ("127.0.0.1", 8080)
    monkeypatch.setenv("METRICS_PORT", "9400")
    monkeypatch.setenv("METRICS_ADDRESS", "127.0.0.1")
    args = parse()
    assert (args.metrics_address, args.metrics_port) == ("127.0.0.1", 9400)
    assert parse("--metrics-port", "0").metrics_port == 0
    server = health_server.from_args(
        parse("--metrics-port", "0"),
        registry=metrics.new().registry,
        readiness=health_server.Readiness(),
    )
    with server:
        assert server.address[0] == "127.0.0.1"
    with pytest.raises(argparse.ArgumentError, match="must be 0-65535"):
        parse("--metrics-port", "70000")
    monkeypatch.setenv("METRICS_PORT", "eighty")
    with pytest.raises(argparse.ArgumentError, match="not a number"):
        parse()


def test_the_server_never_listens_on_every_interface_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 16, defect 7: the default was 0.0.0.0 in both agents."""

    def address(*argv: str) -> str:
        parser = argparse.ArgumentParser(exit_on_error=False)
        health_server.add_flags(parser)
        return str(parser.parse_args(argv).metrics_address)

    monkeypatch.delenv("METRICS_ADDRESS", raising=False)
    monkeypatch.delenv("POD_IP", raising=False)
    assert address() == "127.0.0.1"  # outside a pod: loopback
    monkeypatch.setenv("POD_IP", "10.244.1.7")
    assert address() == "10.244.1.7"  # in a pod: its IP (the chart passes status.podIP)
    monkeypatch.setenv("METRICS_ADDRESS", "0.0.0.0")
    assert address() == "0.0.0.0"  # asked for explicitly
    assert address("--metrics-address", "::1") == "::1"
    ready = health_server.Readiness()
    with health_server.HealthServer(
        registry=metrics.new().registry, readiness=ready, port=0
    ) as server:
        assert server.address[0] == "127.0.0.1"
    with health_server.HealthServer(
        registry=metrics.new().registry, readiness=ready, host="::1", port=0
    ) as server:
        host, port = server.address
        assert host == "::1"
        conn = http.client.HTTPConnection("::1", port, timeout=5)
        conn.request("GET", "/healthz")
        assert conn.getresponse().status == 200
        conn.close()
