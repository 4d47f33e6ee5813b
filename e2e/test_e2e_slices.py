"""Each DRA node publishes its GPUs with the documented attributes; the legacy node does not."""

from __future__ import annotations

from typing import Any

import cluster as kube
import pytest

from dra_driver.devices import fake

# docs/attributes.md: what every whole GPU carries (bare names = the driver's domain).
GPU_ATTRIBUTES = (
    "type",
    "uuid",
    "productName",
    "architecture",
    "driverVersion",
    "cudaComputeCapability",
    "nvlinkIsland",
    "resource.kubernetes.io/pciBusID",
    "resource.kubernetes.io/pcieRoot",
)


def test_every_dra_node_publishes_its_gpus(cluster: kube.Cluster, nodes: dict[str, Any]) -> None:
    assert nodes["dra"], "no node has ResourceSlices of our driver"
    for node in nodes["dra"]:
        devices = cluster.devices(node)
        gpus = {n: d for n, d in devices.items() if kube.attr(d, "type") == "gpu"}
        assert gpus, f"node {node}: no GPU devices in {sorted(devices)}"
        for name, device in gpus.items():
            missing = [a for a in GPU_ATTRIBUTES if kube.attr(device, a) is None]
            assert not missing, f"{node}/{name} lacks {missing}"
            memory = (device.get("capacity") or {}).get("memory") or (
                device.get("capacity") or {}
            ).get(f"{kube.DRIVER}/memory")
            assert memory and memory.get("value"), f"{node}/{name} has no memory capacity"
        uuids = [kube.attr(d, "uuid") for d in gpus.values()]
        assert len(set(uuids)) == len(uuids), f"{node}: duplicate UUIDs"


def test_fake_profiles_are_published_as_described(
    cluster: kube.Cluster, nodes: dict[str, Any]
) -> None:
    checked = 0
    for profile in ("dgx-h100", "h100-nvl-pairs"):
        node = nodes.get(profile)
        if not isinstance(node, str):
            continue
        expected = fake.FakeBackend.from_name(profile).discover()
        devices = cluster.devices(node)
        uuids = {kube.attr(d, "uuid") for d in devices.values() if kube.attr(d, "type") == "gpu"}
        assert uuids == {g.uuid for g in expected.gpus}, f"{node} ({profile})"
        islands = {
            kube.attr(d, "nvlinkIsland") for d in devices.values() if kube.attr(d, "type") == "gpu"
        }
        assert len(islands) == (1 if profile == "dgx-h100" else 2), f"{node}: islands {islands}"
        checked += 1
    if not checked:
        kube.node_with(nodes, "dgx-h100")  # skips with the reason


def test_legacy_node_has_no_slices_and_advertises_gpus(
    cluster: kube.Cluster, nodes: dict[str, Any]
) -> None:
    if not nodes["device-plugin"]:
        pytest.skip(f"needs a node labelled {kube.MODE_LABEL}=device-plugin")
    for node in nodes["device-plugin"]:
        assert cluster.slices(node) == [], f"{node} is in device-plugin mode but has slices"
        allocatable = cluster.core.read_node(node).status.allocatable or {}
        assert int(allocatable.get("nvidia.com/gpu", "0")) > 0, f"{node}: {allocatable}"
