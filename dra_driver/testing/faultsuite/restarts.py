"""Restarts around the agents: the kubelet under the device plugin, and agent hand-overs.

``kubelet restarts (device plugin)``: the device-plugin process runs against the stand-in
kubelet (:mod:`~dra_driver.testing.dpkubeletsim`), which restarts the way a real one does
(its socket and the plugin sockets deleted, a new ``kubelet.sock``), sometimes while a
ListAndWatch is open. After each restart the plugin must register again, serve ListAndWatch and
Allocate, and stay alive.

``publisher hand-overs (two agents)``: two kubelet-plugin processes of one node, as during a
seamless upgrade, publish different content. Only one may write; when it stops (SIGTERM or
SIGKILL) the other must take over within seconds, without the node's slices disappearing.
"""

from __future__ import annotations

import random
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import grpc

from dra_driver.testing import polling
from dra_driver.testing.faultsuite import Row, rig

DEADLINE_S = 30.0


def run_kubelet(size: int, rng: random.Random, workdir: Path) -> Row:
    """``size`` kubelet restarts under one device-plugin process."""
    from dra_driver.pb.deviceplugin.v1beta1 import deviceplugin_pb2 as pb
    from dra_driver.pb.deviceplugin.v1beta1 import deviceplugin_pb2_grpc as pb_grpc
    from dra_driver.testing.dpkubeletsim import FakeKubelet
    from dra_driver.testing.faultsuite import fuzz

    row = Row("kubelet restarts (device plugin)")
    base = workdir / "kr"
    base.mkdir(parents=True, exist_ok=True)
    kubelet = FakeKubelet(base).start()
    proc, _ = fuzz.start_device_plugin(base, profile="pcie-l4")
    try:
        for restart in range(size + 1):
            if restart:
                row.trials += 1
                kubelet.restart(delete_plugin_sockets=rng.random() < 0.8)
            try:
                requests = kubelet.wait_requests(restart + 1, timeout=DEADLINE_S)
            except AssertionError:
                row.fail(f"restart {restart}: no registration within {DEADLINE_S:g}s", hang=1)
                break
            with kubelet.plugin_channel(requests[-1].endpoint) as channel:
                stub = pb_grpc.DevicePluginStub(channel)
                try:
                    listed = next(iter(stub.ListAndWatch(pb.Empty(), timeout=DEADLINE_S)))
                    ids = [d.ID for d in listed.devices]
                    req = pb.AllocateRequest()
                    req.container_requests.add(devices_ids=rng.sample(ids, rng.randint(1, 2)))
                    stub.Allocate(req, timeout=DEADLINE_S)
                except grpc.RpcError as exc:
                    row.fail(f"restart {restart}: {exc.code().name}: {exc.details()}")
            if proc.poll() is not None:
                row.fail("the device plugin process died", crash=1)
                break
    finally:
        proc.kill()
        proc.wait(10)
        kubelet.stop()
    return row


def run_handover(size: int, rng: random.Random, workdir: Path) -> Row:
    """``size`` hand-overs between two agent processes of one node."""
    from dra_driver.testing.fakeapi import fakeserver
    from dra_driver.testing.kubeletsim import PluginProcess

    row = Row("publisher hand-overs (two agents)")
    base = workdir / "ho"
    base.mkdir(parents=True, exist_ok=True)
    server = fakeserver.FakeApiServer(rig.api_with([])).start()
    mem = server.api
    kubeconfig = server.write_kubeconfig(base / "kc")
    profiles = ["dgx-h100", "pcie-l4"]  # the two versions publish different devices
    sizes = [_device_count(p) for p in profiles]

    def start(index: int) -> Any:
        plugin = PluginProcess(
            base=base,
            kubeconfig=kubeconfig,
            publish=True,
            pod_uid=str(uuid.uuid4()),
            fake=profiles[index % 2],
        ).start()
        plugin.wait_ready(timeout_s=60)
        return plugin

    def devices() -> int:
        ours = [s for s in mem.all_resource_slices() if s["spec"]["nodeName"] == rig.NODE]
        return sum(len(s["spec"].get("devices") or ()) for s in ours)

    running: list[Any] = []
    try:
        running.append(start(0))
        if not _wait(lambda: devices() == sizes[0]):
            row.fail("the first agent never published", hang=1)
            return row
        for handover in range(size):
            row.trials += 1
            newcomer = start(handover + 1)
            running.append(newcomer)
            want = sizes[(handover + 1) % 2]
            mem.reset_calls()
            time.sleep(rng.uniform(0.5, 1.5))  # both run: only the old one may write
            if mem.writes:
                row.fail(f"hand-over {handover}: {mem.writes} writes while both agents ran")
            old = running.pop(0)
            gone = 0
            old.signal(rng.choice([signal.SIGTERM, signal.SIGKILL]))
            deadline = time.monotonic() + DEADLINE_S
            while devices() != want and time.monotonic() < deadline:
                gone += devices() == 0
                time.sleep(0.02)
            old.kill()
            if devices() != want:
                row.fail(f"hand-over {handover}: the new agent did not take over", hang=1)
            elif gone:
                row.fail(f"hand-over {handover}: the node had no slices during the hand-over")
            if newcomer.proc is not None and newcomer.proc.poll() is not None:
                row.fail(f"hand-over {handover}: the new agent died", crash=1)
    except (RuntimeError, TimeoutError) as exc:
        row.fail(f"an agent did not start: {str(exc)[:300]}", crash=1)
    finally:
        for plugin in running:
            plugin.kill()
        server.stop()
    return row


def _device_count(profile: str) -> int:
    from dra_driver.devices import fake
    from dra_driver.slices import build

    node = fake.FakeBackend.from_name(profile).discover()
    slices = build.build(node, node_name=rig.NODE, driver_name=rig.DRIVER).slices
    return sum(len(s["spec"].get("devices") or ()) for s in slices)


def _wait(condition: Any, timeout_s: float = DEADLINE_S) -> bool:
    return polling.poll(condition, timeout_s)
