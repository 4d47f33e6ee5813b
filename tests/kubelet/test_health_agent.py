"""GPU health end to end on a running agent: ``dra-driver fake-event`` over the real health socket,
the agent's NVML watcher, taints in the slices of the API server on loopback, the kubelet's
health stream and NodePrepareResources over the real DRA socket.

Latencies are recorded (``record_property``) rather than asserted: the figures come from
``benchmarks/health_latency.py``; here each change must simply happen (generous timeouts).
"""

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

from dra_driver import healthcontrol
from dra_driver.pb.dra_health.v1 import health_pb2 as v1_pb2
from dra_driver.slices import validate
from dra_driver.testing.fakeapi import fakeserver
from dra_driver.testing.kubeletsim import KubeletSim, PluginProcess

from .claimkit import put_claim

Obj = dict[str, Any]
WAIT_S = 30.0


class Agent:
    def __init__(self, proc: PluginProcess, server: fakeserver.FakeApiServer) -> None:
        self.proc, self.server = proc, server

    def slices(self) -> list[Obj]:
        found, _ = self.server.api.list_resource_slices(driver="gpu.nvidia.com", node_name="n1")
        return sorted(found, key=lambda s: s["metadata"]["name"])

    def devices(self) -> dict[str, Obj]:
        return {d["name"]: d for s in self.slices() for d in s["spec"].get("devices", [])}

    def whole_pool(self) -> bool:
        """Every slice of the pool (counters, devices) is there, all of one generation."""
        pools = {
            (s["spec"]["pool"]["resourceSliceCount"], s["spec"]["pool"]["generation"])
            for s in self.slices()
        }
        return len(pools) == 1 and next(iter(pools))[0] == len(self.slices())

    def generation(self) -> int:
        return int(self.slices()[0]["spec"]["pool"]["generation"])

    def run(self, command: str, *args: str) -> subprocess.CompletedProcess[str]:
        """``dra-driver <command> ... --kubelet-plugins-dir <the agent's>``."""
        where = str(self.proc.plugins_dir)
        return subprocess.run(
            [sys.executable, "-m", "dra_driver", command, *args, "--kubelet-plugins-dir", where],
            capture_output=True,
            text=True,
            timeout=60,
        )

    def fake_event(self, *args: str) -> str:
        done = self.run("fake-event", *args)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def wait(self, what: Callable[[], Any], timeout_s: float = WAIT_S) -> float:
        began = time.monotonic()
        while not what():
            assert time.monotonic() - began < timeout_s, f"not within {timeout_s}s: {what}"
            time.sleep(0.01)
        return time.monotonic() - began

    def status(self) -> dict[str, Obj]:
        answer = healthcontrol.request(self.proc.settings.health_socket, {"op": "status"})
        return {d["device"]: d for d in answer["devices"]}


def start_agent(base: Path, server: fakeserver.FakeApiServer, *flags: str) -> Agent:
    server.api.put_node("n1", uid=str(uuid.uuid4()))
    proc = PluginProcess(
        base=base,
        kubeconfig=server.write_kubeconfig(base / "kubeconfig"),
        publish=True,
        extra=flags,
    )
    proc.start()
    proc.wait_ready()
    agent = Agent(proc, server)
    agent.wait(agent.whole_pool)
    return agent


@pytest.fixture
def agent(short_dir: Path, apiserver: fakeserver.FakeApiServer) -> Iterator[Agent]:
    a = start_agent(short_dir, apiserver, "--health-min-hold", "0")
    yield a
    a.proc.kill()


def taints(agent: Agent, device: str) -> list[Obj]:
    return [
        {k: v for k, v in t.items() if k != "timeAdded"}
        for t in agent.devices()[device].get("taints", [])
    ]


@pytest.mark.parametrize(
    ("args", "device", "taint"),
    [
        (["--xid", "79"], "gpu-0", ("gpu.nvidia.com/xid", "79", "NoExecute")),
        (["--xid", "48"], "gpu-1", ("gpu.nvidia.com/xid", "48", "NoSchedule")),
        (["--ecc-dbe"], "gpu-2", ("gpu.nvidia.com/ecc", "double-bit", "NoSchedule")),
        (["--lost"], "gpu-3", ("gpu.nvidia.com/gpu-lost", "lost", "NoExecute")),
        (["--remap-failure"], "gpu-4", ("gpu.nvidia.com/row-remap", "failure", "NoSchedule")),
        (
            ["--xid", "94", "--action", "node-reboot"],
            "gpu-5",
            ("gpu.nvidia.com/xid", "94", "NoExecute"),
        ),
    ],
)
def test_each_event_kind_taints_the_device_and_recovery_clears_it(
    agent: Agent,
    args: list[str],
    device: str,
    taint: tuple[str, str, str],
    record_property: Callable[[str, object], None],
) -> None:
    index = device.split("-")[1]
    generation = agent.generation()
    out = agent.fake_event("--gpu", index, *args)
    assert f"GPU {index} (GPU-" in out
    latency = agent.wait(lambda: taints(agent, device))
    agent.wait(agent.whole_pool)
    record_property("seconds_to_taint", round(latency, 3))
    key, value, effect = taint
    assert {"key": key, "value": value, "effect": effect} in taints(agent, device)
    assert agent.generation() == generation + 1  # one bump for the change
    # Only the GPU's own device carries its taint, and it leaves every ranked set.
    assert all(taints(agent, d) == [] for d in agent.devices() if d != device)
    assert agent.devices()[device]["attributes"]["setRanks"] == {"int": 0}  # every digit 0
    for s in agent.slices():
        assert validate.validate(s) == []
    assert agent.status()[device]["health"] == "Unhealthy"

    agent.fake_event("--gpu", index, "--recovered")
    agent.wait(lambda: not taints(agent, device) and agent.whole_pool())
    assert agent.generation() == generation + 2
    assert agent.status()[device]["recoveries"] == 1


def test_ignored_xid_and_a_repeated_event_write_nothing(agent: Agent) -> None:
    before, writes = json.dumps(agent.slices()), agent.server.api.writes
    agent.fake_event("--gpu", "1", "--xid", "13")
    agent.wait(lambda: '"ignored XID"' in agent.proc.log())
    assert (json.dumps(agent.slices()), agent.server.api.writes) == (before, writes)

    agent.fake_event("--gpu", "1", "--xid", "48")
    agent.wait(lambda: taints(agent, "gpu-1") and agent.whole_pool())
    tainted, writes = json.dumps(agent.slices()), agent.server.api.writes
    agent.fake_event("--gpu", "1", "--xid", "48")  # the same fault again
    agent.fake_event("--gpu", "1", "--xid", "13")  # events are handled in order: after it
    agent.wait(lambda: agent.proc.log().count('"ignored XID"') == 2)
    assert (json.dumps(agent.slices()), agent.server.api.writes) == (tainted, writes)


def test_flapping_gpu_is_held(short_dir: Path, apiserver: fakeserver.FakeApiServer) -> None:
    a = start_agent(short_dir, apiserver, "--health-min-hold", "3600")
    try:
        a.fake_event("--gpu", "2", "--xid", "48")
        a.wait(lambda: taints(a, "gpu-2") and a.whole_pool())
        writes = a.server.api.writes
        a.fake_event("--gpu", "2", "--recovered")  # applied before the command returns
        status = a.status()["gpu-2"]
        assert status["health"] == "Unhealthy" and status["holdLeftSeconds"] > 3500
        assert taints(a, "gpu-2") and a.server.api.writes == writes
    finally:
        a.proc.kill()


def test_prepare_on_a_tainted_device_is_refused_per_claim_unless_tolerated(
    agent: Agent,
) -> None:
    kubelet = KubeletSim(agent.proc.registry_dir)
    try:
        kubelet.register("gpu.nvidia.com")
        agent.fake_event("--gpu", "6", "--xid", "79")
        agent.wait(lambda: taints(agent, "gpu-6"))
        sick = put_claim(agent.server, "sick", ["gpu-6"])
        fine = put_claim(agent.server, "fine", ["gpu-7"])
        tolerant = put_claim(agent.server, "tolerant", ["gpu-6"])
        stored = agent.server.api.get_resource_claim("team", "tolerant")
        stored["status"]["allocation"]["devices"]["results"][0]["tolerations"] = [
            {"key": "gpu.nvidia.com/xid", "operator": "Exists", "effect": "NoExecute"}
        ]
        agent.server.api.put_resource_claim(stored)
        answer = kubelet.prepare([sick, fine, tolerant]).claims
        assert answer[fine.uid].error == ""
        assert answer[tolerant.uid].error == ""
        assert "n1/gpu-6 is tainted gpu.nvidia.com/xid=79:NoExecute" in answer[sick.uid].error
        assert "GPU has fallen off the bus" in answer[sick.uid].error
    finally:
        kubelet.close()


@pytest.mark.parametrize("version", ["v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"])
def test_health_stream_reports_unhealthy_with_a_message_and_healthy_again(
    agent: Agent, version: str
) -> None:
    kubelet = KubeletSim(agent.proc.registry_dir)
    try:
        kubelet.register("gpu.nvidia.com")
        stream = kubelet.watch_health(version)
        first = next(stream)
        assert {d.health for d in first.devices} == {v1_pb2.HEALTHY}
        agent.fake_event("--gpu", "4", "--lost")
        update = next(stream)
        sick = {d.device.device_name: d.message for d in update.devices if d.health != 1}
        assert list(sick) == ["gpu-4"] and "GPU is lost" in sick["gpu-4"]
        agent.fake_event("--gpu", "4", "--recovered")
        assert {d.health for d in next(stream).devices} == {v1_pb2.HEALTHY}
        stream.cancel()
    finally:
        kubelet.close()


def test_fake_event_errors_are_clear(agent: Agent) -> None:
    done = agent.run("fake-event", "--gpu", "42", "--xid", "79")
    assert done.returncode == 1
    assert "no GPU 42 on this fake node (GPUs: 0, 1, 2, 3, 4, 5, 6, 7)" in done.stderr


def test_discover_shows_the_agents_health_view(agent: Agent) -> None:
    agent.fake_event("--gpu", "3", "--xid", "79")

    table = agent.run("discover", "--fake", "dgx-h100")
    assert table.returncode == 0, table.stderr
    rows = {line.split()[0]: line for line in table.stdout.splitlines() if line.startswith("gpu-")}
    assert rows["gpu-3"].endswith("Unhealthy (xid=79)")
    assert rows["gpu-2"].endswith("Healthy")
    doc = json.loads(agent.run("discover", "--fake", "dgx-h100", "-o", "json").stdout)
    gpu3 = doc["gpus"][3]["health"]
    assert (gpu3["health"], gpu3["source"], gpu3["recoveries"]) == ("Unhealthy", "agent", 0)
    assert gpu3["conditions"][0]["message"] == "XID 79 (GPU has fallen off the bus)"
    own = subprocess.run(  # without the agent: what this process's NVML shows (a fresh node)
        [sys.executable, "-m", "dra_driver", "discover", "--fake", "dgx-h100"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Unhealthy" not in own.stdout and own.returncode == 0
