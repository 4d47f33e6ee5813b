"""Allocate as a pure function: what one container gets for the device IDs the kubelet chose.

Why separate from the servicer: the answer (CDI names, ``NVIDIA_VISIBLE_DEVICES``, device nodes)
depends only on the inventory, the health snapshot and the configured strategy, so it is tested
without gRPC. Replicas of one GPU collapse to that GPU. Every container gets
``NVIDIA_VISIBLE_DEVICES`` with the UUIDs; ``--device-list-strategy cdi`` adds the CDI device
names, ``envvar`` adds the device nodes as device specs (backed by ``/dev/null`` when fake),
including a MIG device's capability nodes. A unit with a ``problem`` is refused like an
unhealthy one. MPS replicas add their daemon's pipe directory and limits
(:mod:`dra_driver.deviceplugin.mps`).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from dra_driver import records
from dra_driver.deviceplugin import cdi, inventory
from dra_driver.deviceplugin import mps as mps_replicas
from dra_driver.devices import health

VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"


class Strategy(enum.StrEnum):
    """How Allocate tells the container runtime which devices to inject."""

    CDI = "cdi"  # cdi_devices: the runtime applies our static CDI spec
    ENVVAR = "envvar"  # NVIDIA_VISIBLE_DEVICES (+ device specs) for the NVIDIA runtime


class UnhealthyDeviceError(inventory.RequestError):
    """The kubelet asked for a device that is currently unhealthy."""


@records.record
class DeviceNode:
    container_path: str
    host_path: str
    permissions: str = "rw"


@records.record
class ContainerEdits:
    """One container's share of an AllocateResponse."""

    envs: dict[str, str]
    device_nodes: tuple[DeviceNode, ...]
    cdi_devices: tuple[str, ...]
    mounts: tuple[mps_replicas.Mount, ...] = ()


def container_edits(
    resource: inventory.Resource,
    ids: Sequence[str],
    *,
    strategy: Strategy,
    cdi_kind: str,
    snapshot: health.Snapshot,
    fake_node: str | None,
    mps: mps_replicas.MpsReplicas | None = None,
) -> ContainerEdits:
    """Edits for one container request; raises RequestError naming every bad ID. With ``mps``
    (MPS replicas) the container also gets its daemon's pipe directory and its limits."""
    if not ids:
        raise inventory.RequestError("devices_ids is empty")
    devices = resource.lookup(ids, field="devices_ids")
    sick = [
        f"{d.id} ({d.unit.problem or snapshot.reason(d.unit.health_keys)})"
        for d in devices
        if d.unit.problem or not snapshot.is_healthy(d.unit.health_keys)
    ]
    if sick:
        raise UnhealthyDeviceError(f"devices_ids: unhealthy device(s) {', '.join(sick)}")
    units = tuple({d.unit.uuid: d.unit for d in devices}.values())
    envs = {VISIBLE_DEVICES: ",".join(u.uuid for u in units)}
    names: tuple[str, ...] = ()
    nodes: tuple[DeviceNode, ...] = ()
    if strategy is Strategy.CDI:
        names = tuple(cdi.qualified_name(cdi_kind, u) for u in units)
    else:
        paths = [p for u in units for p in cdi.device_nodes(u)] + list(cdi.CONTROL_NODES)
        nodes = tuple(
            DeviceNode(container_path=p, host_path=cdi.host_path(p, fake_node))
            for p in dict.fromkeys(paths)
        )
    mounts: tuple[mps_replicas.Mount, ...] = ()
    if mps is not None:
        shared = mps.edits(devices)
        envs.update(shared.envs)
        mounts = shared.mounts
    return ContainerEdits(envs=envs, device_nodes=nodes, cdi_devices=names, mounts=mounts)
