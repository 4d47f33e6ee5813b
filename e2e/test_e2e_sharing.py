"""GPU shares (docs/sharing.md) on a real cluster: two pods hold shares of one GPU, the scheduler
books each share's memory and compute (consumable capacity), the node agent runs one MPS daemon
for the GPU and each container sees its own limits; the daemon goes with the last share.

Needs a node whose agent publishes shareable GPUs (``kubeletPlugin.shareable``; the kind values
share the H100 NVL cards of the h100-nvl-pairs worker)."""

from __future__ import annotations

import json
from typing import Any

import cluster as kube
import pytest

PREFERRED = ("h100-nvl-pairs", "dgx-h100")  # first the one e2e/values-kind.yaml shares
PIPE = "/tmp/nvidia-mps"  # CUDA_MPS_PIPE_DIRECTORY in every share's container


def shareable(cluster: kube.Cluster, node: str) -> dict[str, dict[str, Any]]:
    return {
        n: d
        for n, d in cluster.devices(node).items()
        if d.get("allowMultipleAllocations") and kube.attr(d, "type") == "gpu"
    }


def share_node(cluster: kube.Cluster, nodes: dict[str, Any]) -> str:
    """A DRA node publishing shareable GPUs (preferred profiles first), or skip."""
    profiles = kube.fake_profiles(nodes)
    ordered = [profiles[p] for p in PREFERRED if p in profiles] + list(nodes["dra"])
    for node in dict.fromkeys(ordered):
        if shareable(cluster, node):
            return str(node)
    pytest.skip(
        "needs a DRA node publishing shareable GPUs: fake profile h100-nvl-pairs with "
        "kubeletPlugin.shareable matching it (e2e/values-kind.yaml: 'auto:H100 NVL'; an auto: "
        "value publishes plain GPUs where the API server drops consumable capacity)"
    )


def test_share_pair_on_one_gpu_each_sees_its_mps_limits(
    cluster: kube.Cluster, ns: str, nodes: dict[str, Any]
) -> None:
    node = share_node(cluster, nodes)
    template_a, pod_a, template_b, pod_b = kube.load_spec("gpu-share-pair")
    cluster.create([template_a, pod_a], ns, node=node)
    a = cluster.wait_running(ns, "share-a")
    (result_a,) = kube.results(cluster.pod_claim(ns, a, "gpu"))
    device = result_a["device"]
    gpu = shareable(cluster, node).get(device)
    assert gpu is not None, f"share-a got {device}, not a shareable GPU of {node}"
    uuid = kube.attr(gpu, "uuid")
    # share-b must take the rest of the same GPU (first fit could pick another free one).
    template_b["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
        {"cel": {"expression": f'device.attributes["{kube.DRIVER}"].?uuid.orValue("") == "{uuid}"'}}
    ]
    cluster.create([template_b, pod_b], ns, node=node)
    b = cluster.wait_running(ns, "share-b")
    (result_b,) = kube.results(cluster.pod_claim(ns, b, "gpu"))

    # The scheduler booked two shares of the one device.
    assert result_b["device"] == device
    assert result_a.get("shareID") and result_b.get("shareID"), (result_a, result_b)
    assert result_a["shareID"] != result_b["shareID"]
    for result, memory, compute in ((result_a, "20Gi", "25"), (result_b, "30Gi", "50")):
        consumed = result.get("consumedCapacity") or {}
        assert consumed.get("memory") == memory and consumed.get("computeShare") == compute, result

    # Each container sees the GPU and its own limits, through the GPU's daemon.
    minor = device.removeprefix("gpu-")
    for pod, mib, percent in (("share-a", 20 * 1024, "25"), ("share-b", 30 * 1024, "50")):
        seen = cluster.seen(ns, pod, "ctr")
        assert seen.nodes == [f"nvidia{minor}"], f"{pod} sees {seen.nodes}"
        assert seen.env.get("NVIDIA_VISIBLE_DEVICES") == uuid, f"{pod}: {seen.env}"
        assert seen.env.get("CUDA_MPS_PIPE_DIRECTORY") == PIPE, f"{pod}: {seen.env}"
        assert seen.env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") == f"{uuid}={mib}M", seen.env
        assert seen.env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == percent, seen.env

    # One daemon for the GPU, running, recorded by the agent.
    record_path = f"{cluster.plugin_dir(node)}/mps/daemons/{device}.json"
    record = json.loads(cluster.agent_run(node, ["cat", record_path]).stdout)
    # A process of the agent (pid), or a Pod of its own where the chart runs daemons in Pods.
    assert record["state"] == "Running" and (record.get("pid") or record.get("podUid")), record
    assert [d["uuid"] for d in record["devices"]] == [uuid], record
    if record.get("pod"):  # the chart's default: the daemon in a Pod of its own on this node
        daemon_pod = cluster.pod(kube.AGENT_NAMESPACE, record["pod"])
        assert daemon_pod["metadata"]["uid"] == record["podUid"], daemon_pod["metadata"]
        assert daemon_pod["spec"]["nodeName"] == node, daemon_pod["spec"]
        ready = {c["type"]: c["status"] for c in daemon_pod["status"].get("conditions") or []}
        assert ready.get("Ready") == "True", daemon_pod["status"]

    # The first share going (unprepared: its CDI spec removed) leaves the daemon to the other ...
    uid_a = cluster.pod_claim(ns, a, "gpu")["metadata"]["uid"]
    cluster.delete_pod(ns, "share-a")
    cluster.wait_cdi_spec(node, uid_a, present=False)
    still = json.loads(cluster.agent_run(node, ["cat", record_path]).stdout)
    same = ("pid", "startTime", "podUid")
    assert still["state"] == "Running", still
    assert [still.get(k) for k in same] == [record.get(k) for k in same], (record, still)
    assert cluster.pod(ns, "share-b")["status"]["phase"] == "Running"
    # ... and the last one stops it.
    cluster.delete_pod(ns, "share-b")
    daemons = f"{cluster.plugin_dir(node)}/mps/daemons"
    kube.poll(
        lambda: (
            None
            if f"{device}.json"
            in cluster.agent_run(node, ["sh", "-c", f"ls {daemons} || true"]).stdout
            else True
        ),
        60,
        lambda: f"the MPS daemon of {device} on {node} outlived its last share",
    )
    if record.get("pod"):  # ... and its Pod is deleted with it
        pods = cluster.list_objects("v1", "Pod", namespace=kube.AGENT_NAMESPACE)
        assert record["pod"] not in [p["metadata"]["name"] for p in pods], record["pod"]
