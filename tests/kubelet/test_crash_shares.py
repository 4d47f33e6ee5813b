"""Crash safety of GPU shares: SIGKILL the plugin process at random points while the test
kubelet prepares and unprepares claims that share GPUs through MPS.

The MPS daemons outlive the killed plugin (as on a node), so after every restart the plugin
must adopt the daemons of prepared shares and stop the others. At the end, with the plugin
restarted once more: every daemon on disk runs and is used by a prepared claim, no daemon
process is unaccounted for, compute modes match, and all claims unprepare (the last daemon
stops, every GPU back to compute mode Default) and prepare again. Twice: with the daemons as
processes of the plugin, and as Pods of their own (``--mps-daemon-image``, run by the test
kubelet for Pods), where no daemon Pod may be left that no record names.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest

from dra_driver.driver import claims
from dra_driver.driver.mps import mpsprocess
from dra_driver.kube.objects import PODS
from dra_driver.testing import polling
from dra_driver.testing.fakeapi import fakeserver
from dra_driver.testing.kubeletsim import KubeletSim, PluginProcess
from dra_driver.testing.podrunner import PodKubelet

from .test_crash import MIN_CALLS, kill_under_load

DRIVER = "gpu.nvidia.com"
POD_FLAGS = ("--mps-daemon-image", "dra-driver:test", "--pod-namespace", "gpu-driver")


def _share_claims(server: fakeserver.FakeApiServer, count: int) -> list[claims.ClaimRef]:
    """``count`` claims, each one share (4Gi, 10% compute) of gpu-0 or gpu-1."""
    refs = []
    for i in range(count):
        uid = str(uuid.uuid4())
        result = {
            "request": "gpu",
            "driver": DRIVER,
            "pool": "n1",
            "device": f"gpu-{i % 2}",
            "shareID": str(uuid.uuid4()),
            "consumedCapacity": {"memory": "4Gi", "computeShare": "10"},
        }
        server.api.put_resource_claim(
            {
                "metadata": {"name": f"s{i}", "namespace": "crash", "uid": uid},
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "gpu",
                                "exactly": {
                                    "deviceClassName": "gpu.nvidia.com",
                                    "capacity": {"requests": {"memory": "4Gi"}},
                                },
                            }
                        ]
                    }
                },
                "status": {"allocation": {"devices": {"results": [result]}}},
            }
        )
        refs.append(claims.ClaimRef(uid=uid, namespace="crash", name=f"s{i}"))
    return refs


def _daemon_processes(mps_root: Path) -> dict[str, int]:
    prefix = str(mps_root) + "/"
    found: dict[str, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        for var in env:
            key, _, value = var.decode(errors="replace").partition("=")
            if key == mpsprocess.MARKER and value.startswith(prefix) and state != "Z":
                found[value[len(prefix) :].split("/")[0]] = int(entry.name)
    return found


def _json_files(folder: Path) -> dict[str, Any]:
    return {p.stem: json.loads(p.read_text()) for p in folder.glob("*.json")}


@pytest.mark.parametrize("runner", ["process", "pod"])
def test_sigkill_with_shares_leaves_no_daemon_mode_or_spec_behind(
    short_dir: Path, apiserver: fakeserver.FakeApiServer, runner: str
) -> None:
    rng = random.Random(14)
    refs = _share_claims(apiserver, 6)
    kubeconfig = apiserver.write_kubeconfig(short_dir / "kubeconfig")
    plugin_dir = short_dir / "plugins" / DRIVER
    mps_root = plugin_dir / "mps"
    outcome: dict[str, list[str]] = {"errors": [], "calls": [], "interrupted": []}
    extra: tuple[str, ...] = ()
    pods: PodKubelet | None = None
    if runner == "pod":
        apiserver.api.put_node("n1", uid=str(uuid.uuid4()))
        apiserver.api.put_namespace("gpu-driver")
        pods = PodKubelet(apiserver.api.objects, node_name="n1", base=short_dir / "pods").start()
        extra = POD_FLAGS

    def running() -> dict[str, int]:
        """daemon id → pid of every daemon that runs (as a process, or in a Pod)."""
        if pods is None:
            return _daemon_processes(mps_root)
        found = {}
        for pod in pods.running().values():
            daemon = pod.name  # resolved to the daemon id below
            for item in pod.container["env"]:
                if item["name"] == mpsprocess.MARKER:
                    daemon = item["value"][len(str(mps_root)) + 1 :].split("/")[0]
            assert pod.pid is not None
            found[daemon] = pod.pid
        return found

    try:
        make = functools.partial(PluginProcess, base=short_dir, kubeconfig=kubeconfig, extra=extra)
        kills = kill_under_load(make, refs, rng, outcome, (0.1, 0.8))
        assert kills >= 3
        assert outcome["errors"] == []
        assert len(outcome["calls"]) >= MIN_CALLS

        plugin = PluginProcess(base=short_dir, kubeconfig=kubeconfig, extra=extra).start()
        try:
            plugin.wait_ready()
            records = _json_files(plugin_dir / "claims")
            assert all(r["state"] == "PrepareCompleted" for r in records.values())
            cdi = {p.name for p in plugin.cdi_root.glob("*.json")}
            assert cdi == {f"k8s.gpu.nvidia.com-claim_{uid}.json" for uid in records}
            wanted = {d["mpsDaemon"] for r in records.values() for d in r["devices"]}
            daemons = _json_files(mps_root / "daemons")
            assert {d["id"] for d in daemons.values()} == wanted
            if pods is None:
                assert running() == {d["id"]: d["pid"] for d in daemons.values()}
            else:  # exactly the recorded Pods, each running its daemon: no orphan Pod
                in_api = {p["metadata"]["name"]: p for p in apiserver.api.objects.all(PODS)}
                assert {n: p["metadata"]["uid"] for n, p in in_api.items()} == {
                    d["pod"]: d["podUid"] for d in daemons.values()
                }
                assert polling.poll(lambda: set(running()) == wanted)
            modes = json.loads((plugin_dir / "fake-gpu-control.json").read_text())
            exclusive = {u for u, s in modes.items() if s["computeMode"] == "ExclusiveProcess"}
            assert exclusive == {dev["uuid"] for d in daemons.values() for dev in d["devices"]}

            kubelet = KubeletSim(plugin.registry_dir)
            kubelet.register(DRIVER)
            response = kubelet.unprepare(refs)
            assert {c.error for c in response.claims.values()} == {""}
            assert list(plugin.cdi_root.glob("*.json")) == []
            assert _json_files(mps_root / "daemons") == {}
            assert apiserver.api.objects.all(PODS) == []
            assert polling.poll(lambda: running() == {})
            modes = json.loads((plugin_dir / "fake-gpu-control.json").read_text())
            assert {s["computeMode"] for s in modes.values()} == {"Default"}

            response = kubelet.prepare(refs)
            assert {c.error for c in response.claims.values()} == {""}, response
            assert set(running()) == {"gpu-0", "gpu-1"}
            kubelet.close()
        finally:
            plugin.kill()
    finally:
        if pods is not None:
            pods.stop(kill=True)
        for pid in _daemon_processes(mps_root).values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
