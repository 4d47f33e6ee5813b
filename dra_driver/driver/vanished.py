"""Prepared claims whose GPU is gone: found, reported, and (at start-up) cleaned up.

Why it exists: a GPU can vanish under a prepared claim (it fell off the bus, the driver came back
without it, the node restarted with the card replaced: a new UUID in the same slot). Such a claim
must never be re-prepared on another GPU behind its owner's back, and it must not fail forever
either. This module says which records are affected (:func:`stale_records`) and reports one
(:func:`report`): a warning naming the claim and a ``Ready=False`` condition with reason
``GpuVanished`` on its devices in ``status.devices``; a Warning Event on the claim beside it
(:mod:`.claimevents`). At start-up (:func:`clean_at_start`) the affected records are rolled back
(CDI spec, metadata, record; their GPUs are gone), so the kubelet's next prepare of the claim
fails with a clear error instead of answering from a record for a GPU that is not there; at run
time (:mod:`dra_driver.lifecycleparts`) they are only reported, since their containers may still
run.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from typing import Any, Protocol

import structlog

from dra_driver import logs
from dra_driver.devices import rediscovery
from dra_driver.driver import checkpoint, claimevents, claims, claimstatus, inventory
from dra_driver.kube import api as kube

REASON = claimstatus.VANISHED_REASON
_VISIBLE = "NVIDIA_VISIBLE_DEVICES="


class StateParts(Protocol):
    """What clean-up needs of :class:`~dra_driver.driver.state.ClaimState`."""

    @property
    def store(self) -> checkpoint.Checkpoint: ...

    @property
    def devices(self) -> inventory.Inventory: ...

    @property
    def log(self) -> structlog.typing.FilteringBoundLogger: ...

    def rollback(self, ref: claims.ClaimRef) -> list[str]: ...


def record_uuids(record: checkpoint.ClaimRecord) -> set[str]:
    """The GPU and MIG device UUIDs a prepared claim's CDI spec hands its containers."""
    found: set[str] = set()
    edits = [d.get("containerEdits") or {} for d in record.cdiSpec.get("devices") or ()]
    edits.append(record.cdiSpec.get("containerEdits") or {})  # the claim-wide edits
    for edit in edits:
        for env in edit.get("env") or ():
            if isinstance(env, str) and env.startswith(_VISIBLE):
                found |= {u for u in env[len(_VISIBLE) :].split(",") if u}
    return found


def record_gpu_uuids(record: checkpoint.ClaimRecord) -> set[str]:
    """The full-GPU UUIDs a prepared claim's CDI spec hands its containers."""
    return {u for u in record_uuids(record) if u.startswith("GPU-")}


def stale_records(
    records: Iterable[checkpoint.ClaimRecord],
    devices: inventory.Inventory,
    *,
    hidden: rediscovery.Hidden = rediscovery.never_hidden,
) -> list[tuple[checkpoint.ClaimRecord, tuple[str, ...]]]:
    """Prepared records naming a device the node no longer has, or a GPU UUID it no longer
    has (a card replaced in the same slot keeps the name, not the UUID): (record, the device
    names affected). A record handing out a GPU that NVML does not see on purpose (``hidden``,
    :func:`dra_driver.devices.rediscovery.vanished`) is never stale."""
    present = {g.uuid for g in devices.node.gpus} if devices.node is not None else None
    out = []
    for record in records:
        if record.state != checkpoint.PREPARE_COMPLETED:
            continue
        if not all(rediscovery.vanished(u, hidden=hidden) for u in record_gpu_uuids(record)):
            continue
        gone_uuids = record_gpu_uuids(record) - present if present is not None else set()
        lost = tuple(
            d.deviceName
            for d in record.devices
            if devices.get(d.deviceName) is None
            or (gone_uuids and _uses(devices.get(d.deviceName), gone_uuids))
        )
        if not lost and gone_uuids:
            lost = tuple(d.deviceName for d in record.devices)
        if lost:
            out.append((record, lost))
    return out


def losses(
    record: checkpoint.ClaimRecord, before: inventory.Inventory, changes: rediscovery.Changes
) -> list[claimevents.Loss]:
    """At run time: what the prepared ``record`` lost in ``changes``, device by device (as the
    devices were known ``before``): a GPU that vanished (a MIG device: its parent), or a static
    MIG device destroyed behind the driver's back. Dynamic MIG's own instances (``mig`` in
    the record) come and go with their claims: never a loss here."""
    gone = {g.uuid for g in changes.vanished}
    destroyed = {m.uuid for m in changes.mig_destroyed}
    minors = {g.minor: g.uuid for g in before.node.gpus} if before.node is not None else {}
    minors.update({g.minor: g.uuid for g in changes.vanished})
    found = []
    for dev in record.devices:
        known = before.get(dev.deviceName)
        if known is None:
            continue
        uuids = {u for u in known.uuid.split(",") if u}
        uuids |= {minors[m] for m in known.gpu_minors if m in minors}
        if uuids & gone:
            found.append(claimevents.Loss(device=dev.deviceName, uuids=tuple(sorted(uuids & gone))))
        elif dev.mig is None and known.kind == "mig" and known.uuid in destroyed:
            found.append(claimevents.Loss(device=dev.deviceName, uuids=(known.uuid,), mig=True))
    return found


def _mig_only(uuids: tuple[str, ...]) -> bool:
    """Whether what is gone is MIG devices only (their GPUs are still there)."""
    return bool(uuids) and all(u.startswith("MIG-") for u in uuids)


def _uses(device: inventory.PreparableDevice | None, uuids: set[str]) -> bool:
    """Whether ``device`` is now another GPU than the one the record handed out."""
    return device is not None and not (set(device.uuid.split(",")) & uuids)


def clean_at_start(
    state: StateParts,
    *,
    api: kube.KubeApi | None,
    driver_name: str,
    node_name: str,
    hidden: rediscovery.Hidden = rediscovery.never_hidden,
) -> list[claims.ClaimRef]:
    """Roll back and report the prepared claims whose GPU is gone (after recovery): a log
    line, the claim's condition and an Event on the claim (:mod:`.claimevents`)."""
    done = []
    node = state.devices.node
    present = (
        {g.uuid for g in node.gpus} | {m.uuid for g in node.gpus for m in g.mig_devices}
        if node is not None
        else set()
    )
    for record, lost in stale_records(state.store.records(), state.devices, hidden=hidden):
        ref = claims.ClaimRef(uid=record.uid, namespace=record.namespace, name=record.name)
        problems = state.rollback(ref)
        _claim_log(state.log, ref).warning(
            "a prepared claim's GPU is gone since the last start; cleaned up, not re-prepared",
            devices=list(lost),
            problems=problems,
        )
        if api is not None:
            report(api, driver_name, ref, record, set(lost), state.log)
            gone = tuple(sorted(record_uuids(record) - present))
            losses = [
                claimevents.Loss(device=name, uuids=gone, mig=_mig_only(gone)) for name in lost
            ]
            claimevents.emit(
                api,
                ref,
                losses,
                driver_name=driver_name,
                node_name=node_name,
                action=claimevents.ACTION_START,
                log=state.log,
            )
        done.append(ref)
    return done


def report(
    api: kube.KubeApi,
    driver_name: str,
    ref: claims.ClaimRef,
    record: checkpoint.ClaimRecord,
    lost: set[str],
    log: structlog.typing.FilteringBoundLogger,
) -> None:
    """``Ready=False``/``GpuVanished`` on the claim's lost devices in ``status.devices``
    (``Ready=True`` on the others), written as the status writer's field manager."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    entries: list[dict[str, Any]] = []
    for dev in record.devices:
        entry: dict[str, Any] = {"driver": driver_name, "pool": dev.poolName}
        entry["device"] = dev.deviceName
        if dev.shareId:
            entry["shareID"] = dev.shareId
        entry["conditions"] = [
            claimstatus.ready_condition(dev, gone=dev.deviceName in lost, since=now)
        ]
        entries.append(entry)
    patch = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": ref.name, "namespace": ref.namespace, "uid": ref.uid},
        "status": {"devices": entries},
    }
    try:
        api.apply_resource_claim_status(
            ref.namespace, ref.name, patch, claimstatus.field_manager(driver_name)
        )
    except kube.ApiError as exc:
        _claim_log(log, ref).warning(
            "cannot report the vanished GPU in the claim's status", error=str(exc)
        )


def _claim_log(
    log: structlog.typing.FilteringBoundLogger, ref: claims.ClaimRef
) -> structlog.typing.FilteringBoundLogger:
    return logs.claim_logger(log, uid=ref.uid, namespace=ref.namespace, name=ref.name)
