"""A claim's checkpoint record as the rest of the driver sees it: built from a plan, read back.

Why its own module: the claim state (:mod:`~dra_driver.driver.state`) writes records and
start-up recovery (:mod:`~dra_driver.driver.recovery`) reads them; both need the same few
translations — the record of a planned claim, the claim reference and the allocated devices a
record stands for, the full GPUs it holds. Kept below both, so neither imports the other's
module for them (recovery is handed the claim state through a protocol instead).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dra_driver.driver import cdi, checkpoint, claims, inventory


def ref_of(record: checkpoint.ClaimRecord) -> claims.ClaimRef:
    return claims.ClaimRef(uid=record.uid, namespace=record.namespace, name=record.name)


def allocated_of(record: checkpoint.ClaimRecord) -> list[claims.AllocatedDevice]:
    """The devices a record holds, as ownership sees them."""
    return [
        claims.AllocatedDevice(
            request=d.requestNames[0] if d.requestNames else "",
            pool=d.poolName,
            device=d.deviceName,
            admin_access=d.adminAccess,
            share_id=d.shareId,
            configs=(),
        )
        for d in record.devices
    ]


def held_by(record: checkpoint.ClaimRecord, devices: inventory.Inventory) -> frozenset[str]:
    """The full GPUs a record's claim holds (names): its GPUs and GPU shares, a set's members,
    a MIG device's parent; a device with admin access holds nothing (others may have it too)."""
    held: set[str] = set()
    for dev in record.devices:
        known = None if dev.adminAccess else devices.get(dev.deviceName)
        if known is not None:
            held.update(known.gpu_names)
    return frozenset(held)


def build_record(
    ref: claims.ClaimRef,
    *,
    boot_id: str,
    specs: cdi.CdiSpecs,
    allocated: Sequence[claims.AllocatedDevice],
    planned: Sequence[cdi.Planned],
    spec: dict[str, object],
    migs: Mapping[str, checkpoint.MigRecord],
    daemons: Mapping[str, str],
) -> checkpoint.ClaimRecord:
    """The (completed) record of a planned claim; ``daemons``: device name → the MPS daemon it
    runs through, ``migs``: device name → its dynamic MIG instance."""
    return checkpoint.ClaimRecord(
        uid=ref.uid,
        namespace=ref.namespace,
        name=ref.name,
        state=checkpoint.PREPARE_COMPLETED,
        bootId=boot_id,
        devices=tuple(
            checkpoint.DeviceRecord(
                requestNames=(dev.request_name,),
                poolName=dev.pool,
                deviceName=dev.device,
                cdiDeviceIds=(specs.device_id(ref.uid, dev.device),),
                shareId=dev.share_id,
                adminAccess=dev.admin_access,
                config=plan.config.to_json(),
                consumedCapacity=dict(dev.consumed_capacity),
                mpsDaemon=daemons.get(dev.device),
                mig=migs.get(dev.device),
            )
            for dev, plan in zip(allocated, planned, strict=True)
        ),
        cdiSpec=spec,
    )
