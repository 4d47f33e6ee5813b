"""The devices of ``compute-domain.nvidia.com`` on a node: IMEX channels and the daemon.

Why it exists: the scheduler allocates a workload's channel and a daemon pod's daemon device
from ResourceSlices like any other device, so a node whose GPUs are in a multi-node NVLink
fabric clique publishes one pool (named after the node) with ``channel-<N>`` devices
(attributes ``type: channel``, ``id: N``) and one ``daemon-0`` (``type: daemon``) — the names
and attributes NVIDIA's DeviceClasses select (``compute-domain-default-channel.nvidia.com``:
``type == "channel" && id == 0``; ``compute-domain-daemon.nvidia.com``: ``type == "daemon"``).
A node outside any clique publishes nothing: no claim for a domain can land there. Publishing
is the generic :class:`~dra_driver.slices.publisher.Publisher` (generations, owner reference
to the Node, watch and resync) with this one slice as its desired set.

One channel device per node: a node serves one domain at a time (its IMEX daemon is the
domain's), so one workload pod per node and domain; ``All`` mode injects every channel into
that pod.
"""

from __future__ import annotations

from typing import Any

from dra_driver import computedomain as cd
from dra_driver.devices import model
from dra_driver.slices import build

CHANNELS = 1
_NO_CLUSTER = "00000000-0000-0000-0000-000000000000"


def clique_of(devices: model.NodeDevices) -> str:
    """``<cluster UUID>.<clique id>`` when this node's fabric-attached GPUs agree on one
    (registration completed, a real cluster UUID), else "" (the ``nvidia.com/gpu.clique``
    label's rule)."""
    ids = {
        (g.fabric.cluster_uuid, g.fabric.clique_id)
        for g in devices.gpus
        if g.fabric is not None
        and g.fabric.state == "completed"
        and g.fabric.cluster_uuid != _NO_CLUSTER
    }
    if len(ids) != 1:
        return ""
    ((cluster, clique),) = ids
    return f"{cluster}.{clique}"


def desired(node_name: str, clique: str) -> list[dict[str, Any]]:
    """This node's slices of the driver (none outside a clique); generation set on publish."""
    if not clique:
        return []
    devices = [
        {
            "name": f"channel-{i}",
            "attributes": {"type": {"string": "channel"}, "id": {"int": i}},
        }
        for i in range(CHANNELS)
    ]
    devices.append(
        {"name": "daemon-0", "attributes": {"type": {"string": "daemon"}, "id": {"int": 0}}}
    )
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": build.slice_name(node_name, cd.DRIVER_NAME, 0)},
            "spec": {
                "driver": cd.DRIVER_NAME,
                "nodeName": node_name,
                "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1},
                "devices": devices,
            },
        }
    ]
