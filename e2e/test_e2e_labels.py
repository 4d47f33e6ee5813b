"""GPU node labels (docs/labels.md) on a real cluster: both agents keep them on their Node, every
fake-GPU DRA node carries exactly the labels ``dra-driver labels --fake <profile>`` computes, a
pod picks the kind of GPU by nvidia.com/gpu.product, and deleted labels come back."""

from __future__ import annotations

from typing import Any

import cluster as kube
import pytest

from dra_driver.devices import fake
from dra_driver.nodelabels import compute

OWNED = "gpu.nvidia.com/node-labels"
RESYNC_S = 60  # the chart's default nodeLabels.resyncSeconds (upper bound: kind uses less)


def labels(cluster: kube.Cluster, node: str) -> dict[str, str]:
    return dict(cluster.core.read_node(node).metadata.labels or {})


def wait_labels(cluster: kube.Cluster, node: str, want: dict[str, str]) -> dict[str, str]:
    def check() -> dict[str, str] | None:
        got = labels(cluster, node)
        return got if all(got.get(k) == v for k, v in want.items()) else None

    return kube.poll(check, 2 * RESYNC_S + 30, lambda: f"{node} labels {labels(cluster, node)}")


def test_dra_node_carries_its_gpu_labels(cluster: kube.Cluster, nodes: dict[str, Any]) -> None:
    node = kube.node_with(nodes, "dgx-h100")
    got = wait_labels(
        cluster,
        node,
        {
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            "nvidia.com/gpu.count": "8",
            "nvidia.com/gpu.memory": "81920",
            "nvidia.com/gpu.family": "hopper",
            "nvidia.com/mig.capable": "true",
        },
    )
    owned = set(cluster.core.read_node(node).metadata.annotations[OWNED].split(","))
    assert owned == {k for k in got if k.startswith("nvidia.com/")}
    assert got[kube.PROFILE_LABEL] == "dgx-h100"  # a label we do not own is still there


def test_every_fake_node_carries_its_profiles_labels(
    cluster: kube.Cluster, nodes: dict[str, Any]
) -> None:
    """The DRA agent's labels are ``dra-driver labels --fake <profile>`` (whole GPUs, no MIG
    strategy), all of them and nothing else under nvidia.com/ that it owns."""
    profiles = kube.fake_profiles(nodes)
    if not profiles:
        kube.node_with(nodes, "dgx-h100")  # skips, naming the label
    for profile, node in sorted(profiles.items()):
        want = compute.compute(fake.FakeBackend.from_name(profile).discover()).labels
        assert want.get("nvidia.com/gpu.present") == "true", want
        got = wait_labels(cluster, node, want)
        owned = set(cluster.core.read_node(node).metadata.annotations[OWNED].split(","))
        assert owned == set(want), f"{node} ({profile}): owns {sorted(owned ^ set(want))} more/less"
        assert got[kube.PROFILE_LABEL] == profile


def test_deleted_labels_come_back(cluster: kube.Cluster, nodes: dict[str, Any]) -> None:
    node = kube.node_with(nodes, "h100-nvl-pairs")
    wait_labels(cluster, node, {"nvidia.com/gpu.product": "NVIDIA-H100-NVL"})
    cluster.core.patch_node(node, {"metadata": {"labels": {"nvidia.com/gpu.product": None}}})
    wait_labels(cluster, node, {"nvidia.com/gpu.product": "NVIDIA-H100-NVL"})


def test_legacy_pod_picks_the_gpu_kind_by_node_label(
    cluster: kube.Cluster, ns: str, nodes: dict[str, Any]
) -> None:
    if not nodes["device-plugin"]:
        pytest.skip(f"needs a node labelled {kube.MODE_LABEL}=device-plugin")
    (node,) = nodes["device-plugin"]
    wait_labels(cluster, node, {"nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.count": "4"})
    cluster.apply_spec("legacy-by-label", ns)
    pod = cluster.wait_running(ns, "legacy-by-label")
    assert pod["spec"]["nodeName"] == node
