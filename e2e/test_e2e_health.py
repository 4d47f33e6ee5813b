"""GPU health on the cluster: ``dra-driver fake-event`` run inside an agent pod (the pod's
environment gives it the agent's directories) makes a fake GPU fail and recover.

DRA node: the device gets the XID taint in its ResourceSlice and loses it after recovery (the
chart's default hold time is 60 s). Device-plugin node: the kubelet takes the unhealthy GPU out of
the node's allocatable ``nvidia.com/gpu`` and puts it back. XID 48 is used (NoSchedule): a
NoExecute taint would evict other tests' pods.
"""

from __future__ import annotations

from typing import Any

import cluster as kube
import pytest

HOLD_AND_MARGIN_S = 60 + 90


def _fake_event(cluster: kube.Cluster, node: str, component: str, *args: str) -> str:
    agent = cluster.agent_pod(node, component=component)
    return cluster.exec(
        kube.AGENT_NAMESPACE, agent["metadata"]["name"], ["dra-driver", "fake-event", *args]
    )


def test_xid_taints_the_device_and_recovery_removes_it(
    cluster: kube.Cluster, nodes: dict[str, Any]
) -> None:
    node = kube.node_with(nodes, "dgx-h100")
    device = "gpu-7"
    out = _fake_event(cluster, node, "kubelet-plugin", "--gpu", "7", "--xid", "48")
    assert "XID 48" in out, out

    def tainted() -> list[dict[str, Any]] | None:
        return cluster.devices(node)[device].get("taints") or None

    taints = kube.poll(tainted, 60, lambda: f"{device} on {node} has no taint")
    assert {(t["key"], t.get("value"), t["effect"]) for t in taints} == {
        (f"{kube.DRIVER}/xid", "48", "NoSchedule")
    }
    out = _fake_event(cluster, node, "kubelet-plugin", "--gpu", "7", "--recovered")
    assert "recovered" in out, out
    kube.poll(
        lambda: True if not cluster.devices(node)[device].get("taints") else None,
        HOLD_AND_MARGIN_S,
        lambda: f"{device} on {node} is still tainted",
    )


def test_device_plugin_node_loses_and_regains_the_gpu(
    cluster: kube.Cluster, nodes: dict[str, Any]
) -> None:
    if not nodes["device-plugin"]:
        pytest.skip(f"needs a node labelled {kube.MODE_LABEL}=device-plugin")
    node = nodes["device-plugin"][0]

    def allocatable() -> int:
        status = cluster.core.read_node(node).status
        return int((status.allocatable or {}).get("nvidia.com/gpu", "0"))

    before = allocatable()
    assert before > 0
    _fake_event(cluster, node, "device-plugin", "--gpu", "0", "--xid", "48")
    kube.poll(
        lambda: True if allocatable() < before else None,
        90,
        lambda: f"{node} still offers {allocatable()} nvidia.com/gpu",
    )
    _fake_event(cluster, node, "device-plugin", "--gpu", "0", "--recovered")
    kube.poll(
        lambda: True if allocatable() == before else None,
        HOLD_AND_MARGIN_S,
        lambda: f"{node} offers {allocatable()} nvidia.com/gpu, not {before} again",
    )
