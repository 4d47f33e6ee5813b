"""The DRA health stream as the kubelet meets it: advertised at registration, served on the DRA
socket in both versions, the full device list at once, a new list when a device turns
unhealthy (a MIG device follows its parent GPU), and periodic resends."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from dra_driver import app, logs
from dra_driver.devices import fake, health
from dra_driver.kubelet import health_service
from dra_driver.pb.dra_health.v1 import health_pb2 as v1_pb2
from dra_driver.testing.fakeapi import memory
from dra_driver.testing.kubeletsim import KubeletSim

from . import agentready


class Running:
    """``app.run`` in a thread on a MIG profile, with a health board the test marks."""

    def __init__(self, base: Path, profile: str) -> None:
        self.devices = fake.FakeBackend.from_name(profile)
        self.board = health.HealthBoard()
        self.settings = app.PluginSettings(
            node_name="n1",
            registry_dir=base / "reg",
            plugins_dir=base / "plugins",
            cdi_root=base / "cdi",
            driver_root=base / "none",
            fake=True,
            boot_id_file=base / "boot",
            cleanup_interval_s=0,
            publish=False,
        )
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        app.run(
            self.settings,
            backend=self.devices,
            api=memory.InMemoryApi(use_default_cel=False),
            stop=self.stop,
            log=logs.get("test"),
            health_source=self.board,
        )


@pytest.fixture
def running(short_dir: Path) -> Iterator[Running]:
    r = Running(short_dir, "a100-mig")
    agentready.wait_ready(r.thread.start)  # its start-up lines stay in this set-up's capture
    yield r
    r.stop.set()
    r.thread.join(15)
    assert not r.thread.is_alive(), "an open health stream held up shutdown"


def by_name(response: Any) -> dict[str, tuple[int, str]]:
    return {d.device.device_name: (d.health, d.message) for d in response.devices}


@pytest.mark.parametrize("version", ["v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"])
def test_stream_opens_with_every_device_then_reports_an_unhealthy_gpu(
    running: Running, version: str
) -> None:
    kubelet = KubeletSim(running.settings.registry_dir)
    kubelet.register("gpu.nvidia.com")
    node = running.devices.discover()
    names = set(health.device_keys(node))
    gpu = node.gpus[0]
    migs = {n for n, keys in health.device_keys(node).items() if keys[1:] == (gpu.uuid,)}
    assert migs, "profile should have MIG devices on its first GPU"

    stream = kubelet.watch_health(version)
    try:
        first = next(stream)
        assert {d.device.pool_name for d in first.devices} == {"n1"}
        assert set(by_name(first)) == names
        assert {h for h, _ in by_name(first).values()} == {v1_pb2.HEALTHY}
        device = first.devices[0]
        assert device.last_updated_time > 0
        assert device.health_check_timeout_seconds == health_service.TIMEOUT_S

        running.board.mark_unhealthy(gpu.uuid, "XID 79")
        update = by_name(next(stream))
        sick = {n for n, (h, _) in update.items() if h == v1_pb2.UNHEALTHY}
        assert sick == {gpu.name} | migs
        assert update[gpu.name][1] == f"{gpu.uuid}: XID 79"

        running.board.mark_healthy(gpu.uuid)
        assert {h for h, _ in by_name(next(stream)).values()} == {v1_pb2.HEALTHY}
    finally:
        stream.cancel()
        kubelet.close()


def test_streams_resend_the_list_and_end_on_stop() -> None:
    board = health.HealthBoard()
    streams = health_service.HealthStreams(
        pool_name="n1",
        devices={"gpu-1": ("GPU-b",), "gpu-0": ("GPU-a",)},
        source=board,
        log=logs.get("test"),
        resend_s=0.05,
        poll_s=0.01,
    )

    class Context:
        def is_active(self) -> bool:
            return True

    stream = streams.stream(v1_pb2, Context())  # type: ignore[arg-type]
    first, second = next(stream), next(stream)  # nothing changed: resent after resend_s
    assert [d.device.device_name for d in first.devices] == ["gpu-0", "gpu-1"]
    assert by_name(first) == by_name(second)
    streams.stop()
    assert list(stream) == []  # ends within poll_s


def test_an_open_stream_does_not_hold_up_shutdown(running: Running) -> None:
    kubelet = KubeletSim(running.settings.registry_dir)
    kubelet.register("gpu.nvidia.com")
    stream = kubelet.watch_health("v1alpha1.DRAResourceHealth")
    assert len(next(stream).devices) == len(health.device_keys(running.devices.discover()))
    running.stop.set()
    running.thread.join(10)
    assert not running.thread.is_alive()
    try:  # the server ended the stream (normally, or by going away), not left it hanging
        rest = list(stream)
    except grpc.RpcError as exc:
        assert exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
    else:
        assert rest == []
    kubelet.close()
