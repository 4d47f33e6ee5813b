"""Claims from e2e/specs/ are allocated as asked, and each container sees exactly its GPUs."""

from __future__ import annotations

import re
from typing import Any

import cluster as kube


def gpus_of(
    cluster: kube.Cluster, pod: dict[str, Any], results: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The slice devices behind allocation ``results`` on the pod's node."""
    devices = cluster.devices(pod["spec"]["nodeName"])
    ours = [r for r in results if r["driver"] == kube.DRIVER]
    missing = [r["device"] for r in ours if r["device"] not in devices]
    assert not missing, f"allocated devices {missing} are not in the node's slices"
    return [devices[r["device"]] for r in ours]


def _minors(device: dict[str, Any]) -> list[str]:
    """A GPU's minor (docs/attributes.md)."""
    return [re.sub(r"^gpu-", "", device["name"])]


def _uuids(device: dict[str, Any]) -> list[str]:
    return [kube.attr(device, "uuid")]


def assert_sees(
    cluster: kube.Cluster,
    ns: str,
    pod: str,
    container: str,
    devices: list[dict[str, Any]],
    *,
    exact_env: bool = True,
) -> None:
    """The container's /dev has exactly these GPUs' nodes (CDI applied), and so does its env."""
    seen = cluster.seen(ns, pod, container)
    minors = sorted(f"nvidia{m}" for d in devices for m in _minors(d))
    assert seen.nodes == minors, f"{pod}/{container} sees {seen.nodes}, expected {minors}"
    visible = seen.env.get("NVIDIA_VISIBLE_DEVICES")
    uuids = {u for d in devices for u in _uuids(d)}
    if exact_env:
        assert visible is not None, f"{pod}/{container}: no NVIDIA_VISIBLE_DEVICES in {seen.env}"
        assert set(visible.split(",")) == uuids, f"{pod}/{container}: {visible} vs {uuids}"
    elif visible not in (None, "void"):
        assert set(visible.split(",")) <= uuids
    claim_ref = seen.env.get("NVIDIA_DRA_CLAIM", "")
    assert claim_ref.startswith(f"{ns}/"), f"{pod}/{container}: NVIDIA_DRA_CLAIM={claim_ref!r}"


def test_one_gpu_per_pod(cluster: kube.Cluster, ns: str) -> None:
    cluster.apply_spec("one-gpu", ns)
    pod = cluster.wait_running(ns, "one-gpu")
    claim = cluster.pod_claim(ns, pod, "gpu")
    (gpu,) = gpus_of(cluster, pod, kube.results(claim))
    assert kube.attr(gpu, "type") == "gpu"
    assert_sees(cluster, ns, "one-gpu", "ctr", [gpu])


def test_two_pods_share_one_claim(cluster: kube.Cluster, ns: str) -> None:
    cluster.apply_spec("shared-claim-pods", ns)
    a, b = cluster.wait_running(ns, "shared-a"), cluster.wait_running(ns, "shared-b")
    assert a["spec"]["nodeName"] == b["spec"]["nodeName"]
    claim = cluster.claim(ns, "shared-gpu")
    reserved = {r["name"] for r in claim["status"]["reservedFor"]}
    assert reserved == {"shared-a", "shared-b"}
    (gpu,) = gpus_of(cluster, a, kube.results(claim))
    assert_sees(cluster, ns, "shared-a", "ctr", [gpu])
    assert_sees(cluster, ns, "shared-b", "ctr", [gpu])


def test_two_containers_share_a_claim(cluster: kube.Cluster, ns: str) -> None:
    cluster.apply_spec("shared-claim-containers", ns)
    pod = cluster.wait_running(ns, "two-containers")
    (gpu,) = gpus_of(cluster, pod, kube.results(cluster.pod_claim(ns, pod, "gpu")))
    assert_sees(cluster, ns, "two-containers", "first", [gpu])
    assert_sees(cluster, ns, "two-containers", "second", [gpu])


def test_two_requests_one_per_container(cluster: kube.Cluster, ns: str) -> None:
    cluster.apply_spec("two-requests", ns)
    pod = cluster.wait_running(ns, "two-requests")
    results = kube.results(cluster.pod_claim(ns, pod, "gpus"))
    by_request = {r["request"]: gpus_of(cluster, pod, [r]) for r in results}
    assert set(by_request) == {"train", "serve"}
    assert by_request["train"][0]["name"] != by_request["serve"][0]["name"]
    for container in ("train", "serve"):
        assert_sees(cluster, ns, "two-requests", container, by_request[container], exact_env=False)


def test_cel_on_product_name_and_memory(
    cluster: kube.Cluster, ns: str, nodes: dict[str, Any]
) -> None:
    node = kube.node_with(nodes, "h100-nvl-pairs")
    cluster.apply_spec("cel-selectors", ns)
    pod = cluster.wait_running(ns, "big-h100")
    assert pod["spec"]["nodeName"] == node, "only the H100 NVL GPUs have >= 90 GiB"
    (gpu,) = gpus_of(cluster, pod, kube.results(cluster.pod_claim(ns, pod, "gpu")))
    assert "H100" in kube.attr(gpu, "productName")
    assert_sees(cluster, ns, "big-h100", "ctr", [gpu])


def test_match_attribute_nvlink_island_and_numa_node(
    cluster: kube.Cluster, ns: str, nodes: dict[str, Any]
) -> None:
    kube.node_with(nodes, "h100-nvl-pairs")
    cluster.apply_spec("match-attribute", ns)
    for pod_name, attribute in (
        ("nvlink-pair", "nvlinkIsland"),
        ("numa-pair", "resource.kubernetes.io/numaNode"),
    ):
        pod = cluster.wait_running(ns, pod_name)
        gpus = gpus_of(cluster, pod, kube.results(cluster.pod_claim(ns, pod, "gpus")))
        values = {kube.attr(g, attribute) for g in gpus}
        assert len(gpus) == 2 and len(values) == 1 and None not in values, (
            f"{pod_name}: {attribute} of {[g['name'] for g in gpus]} = {values}"
        )
        assert_sees(cluster, ns, pod_name, "ctr", gpus)


def test_generated_claim_gets_a_bridged_pair_by_its_set_rank(
    cluster: kube.Cluster, ns: str, nodes: dict[str, Any]
) -> None:
    kube.node_with(nodes, "h100-nvl-pairs")
    cluster.apply_spec("best-pair", ns)
    pod = cluster.wait_running(ns, "best-pair")
    results = kube.results(cluster.pod_claim(ns, pod, "gpus"))
    assert [r["request"] for r in results] == ["gpus/rank1", "gpus/rank1"], results
    pair = gpus_of(cluster, pod, results)
    islands = {kube.attr(g, "nvlinkIsland") for g in pair}
    assert len(islands) == 1 and None not in islands, [g["name"] for g in pair]  # bridged
    assert_sees(cluster, ns, "best-pair", "ctr", pair)


def test_first_available_falls_back(cluster: kube.Cluster, ns: str) -> None:
    cluster.apply_spec("first-available", ns)
    pod = cluster.wait_running(ns, "first-available")
    results = kube.results(cluster.pod_claim(ns, pod, "gpu"))
    assert [r["request"] for r in results] == ["gpu/one"]
    assert_sees(cluster, ns, "first-available", "ctr", gpus_of(cluster, pod, results))


def test_claim_that_cannot_fit_stays_pending(cluster: kube.Cluster, ns: str) -> None:
    cluster.apply_spec("unsatisfiable", ns)

    def unschedulable() -> dict[str, Any] | None:
        pod = cluster.pod(ns, "too-big")
        for cond in pod["status"].get("conditions") or []:
            if cond["type"] == "PodScheduled" and cond["status"] == "False":
                return pod
        return None

    pod = kube.poll(unschedulable, 90, lambda: cluster.describe(ns, "too-big"))
    assert pod["status"]["phase"] == "Pending" and not pod["spec"].get("nodeName")
    claim = (
        cluster.pod_claim(ns, pod, "gpus") if pod["status"].get("resourceClaimStatuses") else None
    )
    if claim is not None:
        assert not kube.results(claim), "an unsatisfiable claim was allocated"
