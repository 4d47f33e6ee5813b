"""The real node agent process against the fake API server on loopback with DRA feature gates
off: it probes the server at start and adapts (an XID 79 GPU is withdrawn from the published
slices and comes back on recovery, since the server would drop its taint), refuses explicit
dynamic MIG or GPU shares the server cannot keep with one error line naming the gate, and
notices a server restarted with a gate off."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.slices import compare
from dra_driver.testing.fakeapi import fakeserver
from dra_driver.testing.kubeletsim import PluginProcess

Obj = dict[str, Any]
DROPPED = "API server drops the ResourceSlice fields of a feature"


@pytest.fixture
def servers() -> Iterator[Callable[..., fakeserver.FakeApiServer]]:
    made: list[fakeserver.FakeApiServer] = []

    def make(gates: set[str] | None = None) -> fakeserver.FakeApiServer:
        server = fakeserver.FakeApiServer(disabled_gates=gates or set()).start()
        server.api.put_node("n1", uid=str(uuid.uuid4()))
        made.append(server)
        return server

    yield make
    for server in made:
        server.stop()


class Agent:
    def __init__(
        self, base: Path, server: fakeserver.FakeApiServer, *flags: str, fake: str
    ) -> None:
        self.server = server
        self.proc = PluginProcess(
            base=base,
            kubeconfig=server.write_kubeconfig(base / "kubeconfig"),
            publish=True,
            fake=fake,
            extra=("--health-min-hold", "0", *flags),
        )

    def slices(self) -> list[Obj]:
        found, _ = self.server.api.list_resource_slices(driver="gpu.nvidia.com", node_name="n1")
        return sorted(found, key=lambda s: s["metadata"]["name"])

    def devices(self) -> dict[str, Obj]:
        return {d["name"]: d for s in self.slices() for d in s["spec"].get("devices") or ()}

    def fake_event(self, *args: str) -> None:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "dra_driver",
                "fake-event",
                *args,
                "--kubelet-plugins-dir",
                str(self.proc.plugins_dir),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr

    def events(self, name: str) -> list[Obj]:
        lines = [json.loads(x) for x in self.proc.log().splitlines() if x.startswith("{")]
        return [x for x in lines if x.get("event") == name]

    def metric(self, line: str) -> bool:
        status, body = self.proc.http_get("/metrics")
        return status == 200 and line in body


def wait(what: Callable[[], Any], timeout_s: float = 30.0) -> float:
    began = time.monotonic()
    while not what():
        assert time.monotonic() - began < timeout_s, f"not within {timeout_s}s: {what}"
        time.sleep(0.01)
    return time.monotonic() - began


@pytest.fixture
def agents(short_dir: Path) -> Iterator[Callable[..., Agent]]:
    made: list[Agent] = []

    def make(
        server: fakeserver.FakeApiServer, *flags: str, fake: str = "dgx-h100", start: bool = True
    ) -> Agent:
        agent = Agent(short_dir, server, *flags, fake=fake)
        made.append(agent)
        if start:
            agent.proc.start()
            agent.proc.wait_ready()
            wait(lambda: "gpu-7" in agent.devices())
        return agent

    yield make
    for agent in made:
        agent.proc.kill()


def test_without_device_taints_an_xid_79_gpu_is_withdrawn_within_2s_and_recovery_returns_it(
    servers: Callable[..., fakeserver.FakeApiServer], agents: Callable[..., Agent]
) -> None:
    server = servers({"DRADeviceTaints"})
    agent = agents(server)
    (line,) = agent.events(DROPPED)
    assert (line["feature"], line["gate"], line["reason"]) == (
        "deviceTaints",
        "DRADeviceTaints",
        "start",
    )
    assert agent.metric('dra_driver_feature_enabled{feature="deviceTaints"} 0.0')
    assert agent.metric('dra_driver_feature_enabled{feature="sharedCounters"} 1.0')
    assert agent.metric('dra_driver_feature_enabled{feature="setRanks"} 1.0')

    def rank4(device: str) -> int:  # digit 4 of setRanks: the GPU's rank among sets of 4
        return int(agent.devices()[device]["attributes"]["setRanks"]["int"]) // 1000 % 10

    ranks_before = rank4("gpu-1")
    agent.fake_event("--gpu", "0", "--xid", "79")
    assert wait(lambda: "gpu-0" not in agent.devices(), timeout_s=2.0) < 2.0
    devices = agent.devices()
    assert set(devices) == {f"gpu-{i}" for i in range(1, 8)}
    assert not any("taints" in d for d in devices.values())
    # gpu-1's quad lost gpu-0: its rank moves (the ranks are of the GPUs still published).
    assert devices["gpu-1"]["attributes"]["setRanks"]["int"] // 1000 % 10 != ranks_before
    agent.fake_event("--gpu", "0", "--recovered")
    wait(lambda: "gpu-0" in agent.devices(), timeout_s=2.0)
    assert rank4("gpu-1") == ranks_before
    assert agent.events("API server stored a ResourceSlice without fields we sent") == []


@pytest.mark.parametrize(
    ("flags", "gate"),
    [
        (("--dynamic-mig", "all"), "DRAPartitionableDevices"),
        (("--shareable", "all"), "DRAConsumableCapacity"),
    ],
)
def test_explicit_dynamic_mig_or_shares_on_a_server_dropping_them_exit_at_start(
    servers: Callable[..., fakeserver.FakeApiServer],
    agents: Callable[..., Agent],
    flags: tuple[str, ...],
    gate: str,
) -> None:
    server = servers({gate})
    agent = agents(server, *flags, fake="h100-mig", start=False)
    agent.proc.start()
    assert agent.proc.wait() == 1
    errors = [x for x in agent.proc.log().splitlines() if x.startswith("dra-driver: error:")]
    assert len(errors) == 1, agent.proc.log()
    assert gate in errors[0] and " ".join(flags) in errors[0], errors[0]
    assert agent.slices() == [] and server.api.writes == 0


def test_a_server_restarted_with_taints_off_is_noticed_and_publishing_adapts(
    servers: Callable[..., fakeserver.FakeApiServer], agents: Callable[..., Agent]
) -> None:
    server = servers()
    agent = agents(server)
    assert agent.events(DROPPED) == []
    assert agent.metric('dra_driver_feature_enabled{feature="deviceTaints"} 1.0')
    server.api.restart_with_gates({"DRADeviceTaints"})
    agent.fake_event("--gpu", "3", "--xid", "79")
    wait(lambda: "gpu-3" not in agent.devices(), timeout_s=10.0)
    (line,) = agent.events(DROPPED)
    assert line["feature"] == "deviceTaints" and line["reason"] in ("reconnect", "fields dropped")
    assert agent.metric('dra_driver_feature_enabled{feature="deviceTaints"} 0.0')
    # What is stored now is what the agent wants: no taint anywhere, gpu-3 withdrawn.
    assert not any("taints" in d for d in agent.devices().values())
    slices = agent.slices()
    writes = server.api.writes
    time.sleep(0.5)
    assert server.api.writes == writes and agent.slices() == slices  # settled, no rewrites
    assert all(compare.dropped(s, s) == [] for s in slices)
