"""Fixtures for device-plugin tests: a short temp plugin dir, a test kubelet, running plugins."""

from __future__ import annotations

import dataclasses
import logging
import queue
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

import grpc
import pytest
import structlog

from dra_driver.deviceplugin import app
from dra_driver.devices import fake, health, model
from dra_driver.pb.deviceplugin.v1beta1 import deviceplugin_pb2 as pb
from dra_driver.pb.deviceplugin.v1beta1 import deviceplugin_pb2_grpc as pb_grpc

from .testkubelet import FakeKubelet

FAST = {"poll_interval_s": 0.1, "stream_poll_s": 0.2}
Events = list[MutableMapping[str, Any]]


@pytest.fixture
def logged() -> Iterator[Events]:
    """Every structlog event while the test runs, at every level, with ``log_level``. Create
    the plugin objects inside the test: they bind their loggers when built. The events still
    reach the other processors (the catalogue check of tests/conftest.py included)."""
    events: Events = []

    def record(
        _logger: object, method: str, event_dict: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        events.append({**event_dict, "log_level": method})
        return event_dict

    wrapper = structlog.get_config()["wrapper_class"]
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    processors = structlog.get_config()["processors"]  # the live list every logger reads
    processors.insert(0, record)
    try:
        yield events
    finally:
        if record in processors:
            processors.remove(record)
        structlog.configure(wrapper_class=wrapper)


def events_named(events: Events, name: str) -> Events:
    return [e for e in list(events) if e.get("event") == name]


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    """A short directory under /tmp: unix socket paths must stay under 108 bytes."""
    path = Path(tempfile.mkdtemp(dir="/tmp", prefix="dp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def cdi_root(plugin_dir: Path) -> Path:
    return plugin_dir / "cdi"


@pytest.fixture
def kubelet(plugin_dir: Path) -> Iterator[FakeKubelet]:
    k = FakeKubelet(plugin_dir).start()
    yield k
    k.stop()


@dataclasses.dataclass
class Running:
    """A started DevicePluginApp plus what tests poke it with."""

    app: app.DevicePluginApp
    board: health.HealthBoard
    devices: model.NodeDevices
    kubelet: FakeKubelet
    channels: list[grpc.Channel]

    def stub(self, resource: str = "nvidia.com/gpu") -> pb_grpc.DevicePluginStub:
        endpoint = self.app.endpoints[resource].socket_path.name
        channel = self.kubelet.plugin_channel(endpoint)
        self.channels.append(channel)
        return pb_grpc.DevicePluginStub(channel)

    def uuids(self) -> list[str]:
        return [g.uuid for g in self.devices.gpus]


StartPlugin = Callable[..., Running]


@pytest.fixture
def start_plugin(kubelet: FakeKubelet, plugin_dir: Path, cdi_root: Path) -> Iterator[StartPlugin]:
    started: list[Running] = []

    def start(
        profile: str | model.NodeDevices = "h100-nvl-pairs",
        mig_minors: dict[str, int] | None = None,
        **overrides: Any,
    ) -> Running:
        devices = (
            fake.FakeBackend.from_name(profile).discover() if isinstance(profile, str) else profile
        )
        settings: dict[str, Any] = {"plugin_dir": plugin_dir, "cdi_root": cdi_root, **FAST}
        settings.update(overrides)
        board = health.HealthBoard()
        plugin = app.DevicePluginApp(
            config=app.Config(**settings),
            devices=devices,
            health_source=board,
            mig_minors=mig_minors,
        )
        plugin.start()
        running = Running(plugin, board, devices, kubelet, [])
        started.append(running)
        return running

    yield start
    for running in started:
        for channel in running.channels:
            channel.close()
        running.app.stop()
        running.board.close()


class Stream:
    """Reads a ListAndWatch stream on a thread so tests can wait with a timeout."""

    def __init__(self, stub: pb_grpc.DevicePluginStub) -> None:
        self.call = stub.ListAndWatch(pb.Empty(), timeout=30)
        self.items: queue.Queue[pb.ListAndWatchResponse | Exception] = queue.Queue()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for item in self.call:
                self.items.put(item)
        except Exception as exc:  # the stream ending is an observation, not a test error
            self.items.put(exc)

    def next(self, timeout: float = 5.0) -> pb.ListAndWatchResponse:
        item = self.items.get(timeout=timeout)
        assert isinstance(item, pb.ListAndWatchResponse), f"stream ended: {item}"
        return item

    def cancel(self) -> None:
        self.call.cancel()  # type: ignore[no-untyped-call]


@pytest.fixture
def open_stream() -> Iterator[Callable[[pb_grpc.DevicePluginStub], Stream]]:
    streams: list[Stream] = []

    def open_(stub: pb_grpc.DevicePluginStub) -> Stream:
        stream = Stream(stub)
        streams.append(stream)
        return stream

    yield open_
    for stream in streams:
        stream.cancel()
