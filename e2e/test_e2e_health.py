"""GPU health on the cluster: ``dra-driver fake-event`` run inside an agent pod (the pod's
environment gives it the agent's directories) makes a fake GPU fail and recover.

DRA node: the device gets the XID taint in its ResourceSlice and loses it after recovery (the
chart's default hold time is 60 s; e2e/values-kind.yaml sets HEALTH_MIN_HOLD to 20 s, and each
earlier recovery of a GPU doubles it, so waits follow the agent's holdLeftSeconds). Device-plugin
node: the kubelet takes the unhealthy GPU out of the node's allocatable ``nvidia.com/gpu`` and
puts it back. XID 48 (NoSchedule) where the GPU may be in use; the fatal XID 79 (NoExecute, which
evicts the pods using the GPU) only on a GPU no claim holds: a new pod avoids it, a pod that can
only use it waits and runs on it after recovery.
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


def test_xid_79_taint_is_avoided_until_recovery(
    cluster: kube.Cluster, ns: str, nodes: dict[str, Any]
) -> None:
    """XID 79 (fallen off the bus: NoExecute) on a GPU no claim uses, so no pod is evicted."""
    node = kube.node_with_any(nodes, ("dgx-h100", "h100-nvl-pairs"))
    devices = cluster.devices(node)
    held = cluster.held_gpus(node)
    free = sorted(
        (n for n, d in devices.items() if kube.attr(d, "type") == "gpu" and n not in held),
        key=lambda n: int(n.removeprefix("gpu-")),
    )
    free = [n for n in free if not devices[n].get("taints")]
    assert len(free) >= 2, f"{node}: needs two free healthy GPUs, has {free} (held: {held})"
    device = free[0]  # the first free GPU: where a plain one-GPU claim would go
    uuid = kube.attr(devices[device], "uuid")
    index = cluster.agent_gpus(node)[uuid]["index"]

    out = cluster.fake_event(node, "--gpu", str(index), "--xid", "79")
    assert "XID 79" in out, out
    taint = (f"{kube.DRIVER}/xid", "79", "NoExecute")

    def tainted() -> dict[str, dict[str, Any]] | None:
        now = cluster.devices(node)
        return now if now[device].get("taints") else None

    now = kube.poll(tainted, 60, lambda: f"{device} on {node} has no taint")
    assert {(t["key"], t.get("value"), t["effect"]) for t in now[device]["taints"]} == {taint}
    # Its dynamic MIG placements (if any) inherit the taint; it leaves every ranked set.
    for name, other in now.items():
        if name.startswith(f"{device}-mig-"):
            got = {(t["key"], t.get("value"), t["effect"]) for t in other.get("taints") or []}
            assert taint in got, f"{name} of the failed {device} is not tainted: {got}"
    kube.poll(
        lambda: None if any(kube.set_ranks(cluster.devices(node)[device]).values()) else True,
        30,
        lambda: f"the tainted {device} on {node} is still in a ranked set",
    )

    # A new pod is given another GPU; one that can only use this GPU waits.
    avoids_template, avoids, only_template, only = kube.load_spec("xid-avoid")
    selector = only_template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"][0]
    selector["cel"]["expression"] = (
        f'device.attributes["{kube.DRIVER}"].?uuid.orValue("") == "{uuid}"'
    )
    cluster.create([avoids_template, avoids, only_template, only], ns, node=node)
    pod = cluster.wait_running(ns, "avoids-tainted")
    (result,) = kube.results(cluster.pod_claim(ns, pod, "gpu"))
    assert result["device"] != device, f"avoids-tainted was given the tainted {device}"
    cluster.wait_unschedulable(ns, "only-tainted")

    # Recovery: the taint goes once the hold time is over, and the waiting pod gets the GPU.
    out = cluster.fake_event(node, "--gpu", str(index), "--recovered")
    assert "recovered" in out, out
    hold_left = float(cluster.agent_gpus(node)[uuid]["health"].get("holdLeftSeconds") or 0)
    kube.poll(
        lambda: True if not cluster.devices(node)[device].get("taints") else None,
        hold_left + 60,
        lambda: f"{device} on {node} is still tainted {hold_left:.0f} s + 60 s after recovery",
    )
    pod = cluster.wait_running(ns, "only-tainted", timeout=120)
    (result,) = kube.results(cluster.pod_claim(ns, pod, "gpu"))
    assert result["device"] == device
    assert cluster.seen(ns, "only-tainted", "ctr").env.get("NVIDIA_VISIBLE_DEVICES") == uuid
