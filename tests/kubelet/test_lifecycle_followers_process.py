"""The kubelet's DRA health stream and the per-GPU metrics follow the node's GPUs at run time
(docs/lifecycle.md): the real agent on the fake backend, a real gRPC client on its real DRA
socket, ``/metrics`` over HTTP, ``dra-driver fake-event`` over its health socket. No restart.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.pb.dra_health.v1 import health_pb2 as v1_pb2
from dra_driver.testing.fakeapi import fakeserver

from .claimkit import put_claim
from .test_driver_lifecycle_process import Node, start

Health = dict[str, tuple[int, str]]


@pytest.fixture
def node(short_dir: Path, apiserver: fakeserver.FakeApiServer) -> Iterator[Node]:
    n = start(short_dir, apiserver, "--gpu-metrics-interval", "0.1")
    yield n
    n.kubelet.close()
    n.proc.kill()


def until(stream: Any, what: Callable[[Health], bool]) -> Health:
    """Read the stream until a list satisfies ``what`` (the stream's own timeout bounds it)."""
    for response in stream:
        seen = {d.device.device_name: (d.health, d.message) for d in response.devices}
        if what(seen):
            return seen
    raise AssertionError("the health stream ended")


def telemetry(node: Node, uuid: str) -> list[str]:
    """The GPU utilization series of GPU ``uuid`` on /metrics."""
    _, body = node.proc.http_get("/metrics")
    return [
        line
        for line in body.splitlines()
        if line.startswith("dra_driver_gpu_utilization_percent{") and f'gpu_uuid="{uuid}"' in line
    ]


def uuid_of(node: Node, device: str) -> str:
    return str(node.gpus()[device]["attributes"]["uuid"]["string"])


@pytest.mark.parametrize("version", ["v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"])
def test_stream_and_metrics_follow_hot_plug_and_the_driver(node: Node, version: str) -> None:
    stream = node.kubelet.watch_health(version, timeout_s=60)
    try:
        first = until(stream, lambda seen: True)
        assert "gpu-8" not in first and {h for h, _ in first.values()} == {v1_pb2.HEALTHY}
        held = put_claim(node.server, "held", ["gpu-3"])
        assert node.kubelet.prepare([held]).claims[held.uid].error == ""
        gone_uuid = uuid_of(node, "gpu-3")
        node.wait(lambda: bool(telemetry(node, gone_uuid)))

        # A GPU hot-added: in the stream, Healthy, and sampled for a claim that gets it.
        node.fake_event("--gpu-add")
        seen = until(stream, lambda seen: "gpu-8" in seen)
        assert seen["gpu-8"] == (v1_pb2.HEALTHY, "")
        node.wait(lambda: "gpu-8" in node.gpus())
        hot = put_claim(node.server, "hot", ["gpu-8"])
        assert node.kubelet.prepare([hot]).claims[hot.uid].error == ""
        hot_uuid = uuid_of(node, "gpu-8")
        node.wait(lambda: bool(telemetry(node, hot_uuid)))

        # A GPU removed under a claim: listed Unhealthy with why; its telemetry goes.
        node.fake_event("--gpu-remove", "3")
        seen = until(stream, lambda seen: seen.get("gpu-3", (0, ""))[0] == v1_pb2.UNHEALTHY)
        assert "vanished" in seen["gpu-3"][1]
        node.wait(lambda: not telemetry(node, gone_uuid))
        _, body = node.proc.http_get("/metrics")
        assert f'gpu_uuid="{gone_uuid}"' in body  # the claim's info line stays: it holds it

        # The driver away: every present device Unknown (not failed), and no frozen telemetry.
        node.fake_event("--driver-unload")
        seen = until(
            stream,
            lambda seen: all(h == v1_pb2.UNKNOWN for n, (h, _) in seen.items() if n != "gpu-3"),
        )
        assert "the NVIDIA driver is not loaded" in seen["gpu-0"][1]
        assert seen["gpu-3"][0] == v1_pb2.UNHEALTHY
        node.wait(lambda: not telemetry(node, hot_uuid))

        # Back: Healthy again, sampled again.
        node.fake_event("--driver-load")
        until(
            stream,
            lambda seen: all(h == v1_pb2.HEALTHY for n, (h, _) in seen.items() if n != "gpu-3"),
        )
        node.wait(lambda: bool(telemetry(node, hot_uuid)))
        # Its claim unprepared: the vanished device leaves the list at the next change.
        assert node.kubelet.unprepare([held]).claims[held.uid].error == ""
    finally:
        stream.cancel()
