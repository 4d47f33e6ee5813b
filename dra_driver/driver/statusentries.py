"""What a prepared claim's ``status.devices`` entries say, built from its checkpoint record.

Why it exists apart from :mod:`~dra_driver.driver.claimstatus`: that module decides *when* a
claim's status is written (a queue, a background thread that keeps out of the way of prepares,
retries, a claim gone); this one decides *what* is written, as plain functions of the record,
the node's devices and the GPUs discovery found: one ``AllocatedDeviceStatus`` per device of
ours (``driver``, ``pool``, ``device``, ``shareID`` for a share), its ``data`` (the physical
GPUs: minors, UUIDs, PCI bus IDs; the MIG instance's UUID; a share's consumed capacity; at most
:data:`MAX_DATA` bytes, else only its kind) and its ``Ready`` condition (``False``, reason
``GpuVanished``, once its GPU is gone from the node).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from dra_driver import records
from dra_driver.devices import model
from dra_driver.driver import checkpoint, inventory

MAX_DATA = 10 * 1024  # bytes of ``data`` the server takes


@records.record
class GpuFacts:
    uuid: str
    pci_bus_id: str


def gpu_facts(devices: model.NodeDevices) -> dict[int, GpuFacts]:
    """Minor → the GPU's UUID and PCI bus ID, from discovery."""
    return {g.minor: GpuFacts(uuid=g.uuid, pci_bus_id=g.pci_bus_id) for g in devices.gpus}


def device_entries(
    record: checkpoint.ClaimRecord,
    *,
    driver_name: str,
    devices: inventory.Inventory,
    gpus: Mapping[int, GpuFacts],
    since: str,
    lost: frozenset[str] = frozenset(),
) -> list[dict[str, Any]]:
    """One ``AllocatedDeviceStatus`` per device of a prepared claim's record; a device in
    ``lost`` (its GPU vanished from the node) is ``Ready=False``, reason ``GpuVanished``."""
    entries = []
    for dev in record.devices:
        entry: dict[str, Any] = {
            "driver": driver_name,
            "pool": dev.poolName,
            "device": dev.deviceName,
        }
        if dev.shareId:
            entry["shareID"] = dev.shareId
        entry["data"] = _data(dev, devices.get(dev.deviceName), gpus)
        entry["conditions"] = [ready_condition(dev, gone=dev.deviceName in lost, since=since)]
        entries.append(entry)
    return entries


VANISHED_REASON = "GpuVanished"


def ready_condition(dev: checkpoint.DeviceRecord, *, gone: bool, since: str) -> dict[str, str]:
    """The device's ``Ready`` condition: prepared, or lost with its GPU (or a static MIG device
    destroyed behind the driver's back: the same reason, the claim's Event says which)."""
    if gone:
        return {
            "type": "Ready",
            "status": "False",
            "reason": VANISHED_REASON,
            "message": (
                "its GPU vanished from the node (or its MIG device was destroyed); the claim is "
                "not moved to another device"
            ),
            "lastTransitionTime": since,
        }
    return {
        "type": "Ready",
        "status": "True",
        "reason": "Prepared",
        "message": "prepared on the node; CDI device " + ", ".join(dev.cdiDeviceIds),
        "lastTransitionTime": since,
    }


def _data(
    dev: checkpoint.DeviceRecord,
    known: inventory.PreparableDevice | None,
    gpus: Mapping[int, GpuFacts],
) -> dict[str, Any]:
    minors = known.gpu_minors if known is not None else ()
    data: dict[str, Any] = {
        "kind": known.kind if known is not None else "unknown",
        "gpus": [
            {
                "minor": m,
                "uuid": gpus[m].uuid if m in gpus else "",
                "pciBusID": gpus[m].pci_bus_id if m in gpus else "",
            }
            for m in minors
        ],
    }
    if dev.mig is not None and dev.mig.uuid:  # dynamic MIG: the instance prepare created
        data["migUUID"] = dev.mig.uuid
    elif known is not None and known.kind == "mig":
        data["migUUID"] = known.uuid
    if dev.shareId:
        data["share"] = dict(dev.consumedCapacity)
    if len(json.dumps(data, separators=(",", ":"))) > MAX_DATA:  # never refused for its size
        data = {"kind": data["kind"], "truncated": True}
    return data
