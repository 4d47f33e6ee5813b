"""`nvidia.com/gpu` limits: through DRA (the extended-resource DeviceClass) on DRA nodes, and
through the legacy device plugin on the node labelled for it."""

from __future__ import annotations

from typing import Any

import cluster as kube
import pytest


def test_extended_resource_through_dra(
    cluster: kube.Cluster, ns: str, nodes: dict[str, Any]
) -> None:
    node = kube.node_with(nodes, "dgx-h100")
    classes = [
        c
        for c in cluster.list_objects("resource.k8s.io/v1", "DeviceClass")
        if (c.get("spec") or {}).get("extendedResourceName") == "nvidia.com/gpu"
    ]
    if not classes:
        pytest.skip(
            "no DeviceClass with extendedResourceName nvidia.com/gpu: install the chart with "
            "deviceClasses.extendedResourceName and enable DRAExtendedResource (Kubernetes "
            "< 1.37 drops the field otherwise)"
        )
    cluster.apply_spec("extended-resource", ns)
    pod = cluster.wait_running(ns, "extended-resource")
    assert pod["spec"]["nodeName"] == node
    status = pod["status"].get("extendedResourceClaimStatus") or {}
    claim = cluster.claim(ns, status["resourceClaimName"])
    devices = cluster.devices(node)
    (result,) = [r for r in kube.results(claim) if r["driver"] == kube.DRIVER]
    seen = cluster.seen(ns, "extended-resource", "ctr")
    assert seen.env.get("NVIDIA_VISIBLE_DEVICES") == kube.attr(devices[result["device"]], "uuid")


def test_legacy_device_plugin_on_its_own_node(
    cluster: kube.Cluster, ns: str, nodes: dict[str, Any]
) -> None:
    if not nodes["device-plugin"]:
        pytest.skip(f"needs a node labelled {kube.MODE_LABEL}=device-plugin")
    cluster.apply_spec("device-plugin", ns)
    pod = cluster.wait_running(ns, "legacy")
    assert pod["spec"]["nodeName"] in nodes["device-plugin"]
    assert not pod["spec"].get("resourceClaims")
    seen = cluster.seen(ns, "legacy", "ctr")
    visible = seen.env.get("NVIDIA_VISIBLE_DEVICES", "")
    assert len(set(visible.split(","))) == 2, f"legacy pod sees {seen}"
    # the DRA agent does not run there, the device plugin does
    with pytest.raises(AssertionError):
        cluster.agent_pod(pod["spec"]["nodeName"])
    cluster.agent_pod(pod["spec"]["nodeName"], component="device-plugin")
