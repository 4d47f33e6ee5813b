"""The node agent as a process re-publishes its set ranks as the kubelet prepares and unprepares
claims (rank 1 for four GPUs moves to the other quad and back, one log line naming the GPUs
held), and a restarted agent, finding its claim in the checkpoint, writes nothing: the published
ranks already are its claims'."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dra_driver.kube.objects import PODS
from dra_driver.testing.fakeapi import fakeserver
from dra_driver.testing.kubeletsim import KubeletSim, PluginProcess

from .claimkit import put_claim

QUAD = ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
HELD_EVENT = "GPUs held by prepared claims changed; re-publishing ResourceSlices"


def rank4(server: fakeserver.FakeApiServer) -> dict[str, int]:
    return {
        d["name"]: d["attributes"]["setRanks"]["int"] // 1000 % 10  # digit 4: sets of 4
        for s in server.api.all_resource_slices()
        for d in s["spec"].get("devices") or ()
        if "setRanks" in d["attributes"]
    }


def wait_for(condition: Callable[[], Any], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def agent(short_dir: Path, apiserver: fakeserver.FakeApiServer) -> PluginProcess:
    proc = PluginProcess(
        base=short_dir,
        kubeconfig=apiserver.write_kubeconfig(short_dir / "kubeconfig"),
        publish=True,
    )
    proc.start()
    proc.wait_ready()
    return proc


def test_the_agent_republishes_ranks_as_claims_come_and_go_and_after_a_restart(
    short_dir: Path, apiserver: fakeserver.FakeApiServer
) -> None:
    apiserver.api.put_node("n1", uid="uid-n1")
    free = {**{g: 1 for g in QUAD}, **{f"gpu-{i}": 2 for i in range(4, 8)}}
    taken = {**{g: 0 for g in QUAD}, **{f"gpu-{i}": 1 for i in range(4, 8)}}
    proc = agent(short_dir, apiserver)
    try:
        wait_for(lambda: rank4(apiserver) == free)
        kubelet = KubeletSim(proc.registry_dir)
        kubelet.register("gpu.nvidia.com")
        quad = put_claim(apiserver, "quad", QUAD)
        assert kubelet.prepare([quad]).claims[quad.uid].error == ""
        began = time.monotonic()
        wait_for(lambda: rank4(apiserver) == taken)
        assert time.monotonic() - began < 2.0
        assert kubelet.unprepare([quad]).claims[quad.uid].error == ""
        wait_for(lambda: rank4(apiserver) == free, timeout_s=2.0)
        assert kubelet.prepare([quad]).claims[quad.uid].error == ""  # held again, then restart
        wait_for(lambda: rank4(apiserver) == taken, timeout_s=2.0)
        kubelet.close()
        proc.signal(signal.SIGTERM)
        assert proc.wait() == 0
        lines = [json.loads(x) for x in proc.log().splitlines() if x.startswith("{")]
        held = [x["held"] for x in lines if x["event"] == HELD_EVENT]
        assert held == [QUAD, [], QUAD]
    finally:
        proc.kill()

    writes = apiserver.api.writes
    restarted = agent(short_dir, apiserver)
    try:
        wait_for(lambda: "ResourceSlices reconciled" in restarted.log() or _passed(restarted))
        assert rank4(apiserver) == taken and apiserver.api.writes == writes
    finally:
        restarted.kill()


def _passed(proc: PluginProcess) -> bool:
    """Whether the publisher's first pass is done (it writes nothing: nothing changed)."""
    status, body = proc.http_get("/metrics")
    return status == 200 and 'dra_driver_resourceslice_publish_total{result="success"} 1.0' in body


ALLOC_EVENT = "GPUs of claims allocated on this node changed; re-publishing ResourceSlices"


def bind_pod(apiserver: fakeserver.FakeApiServer, name: str, claim: str) -> None:
    apiserver.api.objects.create(
        PODS,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "team"},
            "spec": {
                "nodeName": "n1",
                "containers": [{"name": "c", "image": "busybox"}],
                "resourceClaims": [{"name": "gpus", "resourceClaimName": claim}],
            },
        },
    )


def test_ranks_follow_an_allocation_before_any_prepare_and_free_it_when_the_pod_goes(
    short_dir: Path, apiserver: fakeserver.FakeApiServer
) -> None:
    apiserver.api.put_node("n1", uid="uid-n1")
    free = {**{g: 1 for g in QUAD}, **{f"gpu-{i}": 2 for i in range(4, 8)}}
    taken = {**{g: 0 for g in QUAD}, **{f"gpu-{i}": 1 for i in range(4, 8)}}
    proc = agent(short_dir, apiserver)
    try:
        wait_for(lambda: rank4(apiserver) == free)
        put_claim(apiserver, "quad", QUAD)
        bind_pod(apiserver, "job", "quad")  # the scheduler allocated, then bound: no prepare
        wait_for(lambda: rank4(apiserver) == taken)
        apiserver.api.objects.delete(PODS, "job", namespace="team")  # deleted before it started
        wait_for(lambda: rank4(apiserver) == free)
        proc.signal(signal.SIGTERM)
        assert proc.wait() == 0
        lines = [json.loads(x) for x in proc.log().splitlines() if x.startswith("{")]
        assert [x["allocated"] for x in lines if x["event"] == ALLOC_EVENT] == [QUAD, []]
        assert not [x for x in lines if x["event"] == HELD_EVENT]
    finally:
        proc.kill()


def test_with_the_watch_off_ranks_follow_prepares_only(
    short_dir: Path, apiserver: fakeserver.FakeApiServer
) -> None:
    apiserver.api.put_node("n1", uid="uid-n1")
    free = {**{g: 1 for g in QUAD}, **{f"gpu-{i}": 2 for i in range(4, 8)}}
    proc = PluginProcess(
        base=short_dir,
        kubeconfig=apiserver.write_kubeconfig(short_dir / "kubeconfig"),
        publish=True,
        extra=["--watch-allocations=false"],
    )
    proc.start()
    proc.wait_ready()
    try:
        wait_for(lambda: rank4(apiserver) == free)
        put_claim(apiserver, "quad", QUAD)
        bind_pod(apiserver, "job", "quad")
        time.sleep(1.0)  # what the watch would have taken (it takes < 0.3 s)
        assert rank4(apiserver) == free
        assert not [c for c in apiserver.api.calls if c.method in ("list_pods", "watch_pods")]
    finally:
        proc.kill()
