"""Preparing and unpreparing one claim: locking, device ownership, CDI spec and checkpoint.

Claims are independent, so each has its own lock (never one node-wide lock: a slow claim must not
hold up the others). Two concurrent calls for the same claim run one after the other, and the
second finds the claim prepared and answers from the checkpoint. Ownership of devices is checked
here too, as the last line of defence: a device prepared for one claim is refused to another,
unless one of them has admin access or both hold shares of a multi-allocatable device.

Order of effects (crash-safety argument):
prepare:   checkpoint PrepareStarted (carries the sharing intent, the MPS daemon and the dynamic
           MIG instances to create) → apply GPU sharing (:mod:`~dra_driver.driver.sharing`) →
           MPS daemon running (:mod:`~dra_driver.driver.mpsclaims`) → create MIG instances
           (:mod:`~dra_driver.driver.mig`) → write CDI spec → checkpoint PrepareCompleted
unprepare: restore GPU sharing defaults → destroy MIG instances → delete checkpoint record →
           remove CDI spec → stop the MPS daemon if no claim record uses it any more
start-up:  sharing of completed records re-applied, of PrepareStarted ones restored; MPS
           daemons of completed records adopted or restarted, all others stopped; MIG
           instances on dynamic GPUs that no completed record owns destroyed, a completed
           record whose MIG instance is gone unprepared (a crash cut its unprepare short);
           PrepareStarted → spec removed, record deleted (rolled back); a completed record
           whose spec is missing → spec rewritten from it; a spec of ours with no record → removed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import structlog

from dra_driver import logs
from dra_driver.apimachinery import taints
from dra_driver.driver import (
    cdi,
    checkpoint,
    claims,
    config,
    inventory,
    mpsclaims,
    results,
    sharing,
)
from dra_driver.driver import mig as mig_mod
from dra_driver.kube import api as kube


class DeviceBusy(claims.ClaimError):
    """A device is already prepared for another claim."""


class DeviceTainted(claims.ClaimError):
    """A device is tainted (unhealthy) and the claim's request does not tolerate the taint."""


# Device name → its current taints (``{"key", "value", "effect"}``, plus a ``message`` saying
# why, for the refusal); the node's health.
DeviceTaints = Callable[[str], Sequence[Mapping[str, Any]]]


class ClaimLocks:
    """One lock per claim UID, created on demand and dropped when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, tuple[threading.Lock, int]] = {}

    @contextlib.contextmanager
    def hold(self, uid: str) -> Iterator[None]:
        with self._guard:
            lock, users = self._locks.get(uid, (threading.Lock(), 0))
            self._locks[uid] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._guard:
                lock, users = self._locks[uid]
                if users == 1:
                    del self._locks[uid]
                else:
                    self._locks[uid] = (lock, users - 1)


@dataclasses.dataclass(frozen=True, slots=True)
class _Use:
    uid: str
    admin: bool
    share_id: str | None


class Ownership:
    """Which claims hold which (pool, device); reserve-or-fail is atomic."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._uses: dict[tuple[str, str], list[_Use]] = {}

    def reserve(self, ref: claims.ClaimRef, devices: Sequence[claims.AllocatedDevice]) -> None:
        with self._guard:
            for dev in devices:
                for use in self._uses.get((dev.pool, dev.device), []):
                    if use.uid == ref.uid or use.admin or dev.admin_access:
                        continue
                    if use.share_id and dev.share_id and use.share_id != dev.share_id:
                        continue
                    raise DeviceBusy(
                        f"{ref}: device {dev.pool}/{dev.device} is already prepared for claim "
                        f"uid {use.uid}; refusing to hand it to a second claim"
                    )
            for dev in devices:
                uses = self._uses.setdefault((dev.pool, dev.device), [])
                uses[:] = [u for u in uses if u.uid != ref.uid]
                uses.append(_Use(ref.uid, dev.admin_access, dev.share_id))

    def release(self, uid: str) -> None:
        with self._guard:
            for key in list(self._uses):
                remaining = [u for u in self._uses[key] if u.uid != uid]
                if remaining:
                    self._uses[key] = remaining
                else:
                    del self._uses[key]


class ClaimState:
    """The prepare/unprepare logic for single claims, safe to call from many threads."""

    def __init__(
        self,
        *,
        api: kube.KubeApi,
        driver_name: str,
        pool_name: str,
        devices: inventory.Inventory,
        specs: cdi.CdiSpecs,
        store: checkpoint.Checkpoint,
        log: structlog.typing.FilteringBoundLogger,
        gpu_sharing: sharing.GpuSharing | None = None,
        mig_instances: mig_mod.MigInstances | None = None,
        device_taints: DeviceTaints | None = None,
        mps: mpsclaims.MpsClaims | None = None,
    ) -> None:
        """``device_taints``: a device's taints now; a claim whose request does not tolerate
        one (NoSchedule / NoExecute) is refused, naming the taint and why it is there."""
        self.api = api
        self.driver_name = driver_name
        self.pool_name = pool_name
        self.devices = devices
        self.specs = specs
        self.store = store
        self.log = log
        self.locks = ClaimLocks()
        self.ownership = Ownership()
        self.sharing = gpu_sharing or sharing.GpuSharing(gpu_control=None, log=log)
        self.mig = mig_instances or mig_mod.MigInstances(control=None, devices=devices, log=log)
        self.device_taints = device_taints
        self.mps = mps

    # ---- start-up ----------------------------------------------------------------------------

    def recover(self) -> None:
        """Bring disk back to a consistent state after whatever ended the last run."""
        report = self.store.load()
        self.specs.remove_stale_temporaries()
        for uid in report.other_boot:
            if checkpoint.valid_uid(uid):
                self.specs.remove(uid)
        if report.other_boot:
            self.log.info(
                "node rebooted since these claims were prepared; forgot them",
                claims=report.other_boot,
            )
        self._recover_sharing(report.records)
        if self.mps is not None:
            self.mps.recover([r for r in report.records if r.state == checkpoint.PREPARE_COMPLETED])
        unprepared = self.mig.recover(report.records)
        for record in report.records:
            clog = logs.claim_logger(
                self.log, uid=record.uid, namespace=record.namespace, name=record.name
            )
            if record.state == checkpoint.PREPARE_STARTED:
                self.specs.remove(record.uid)
                self.store.delete(record.uid)
                clog.warning("rolled back a preparation interrupted by a crash")
                continue
            if record.uid in unprepared:
                self._forget(record.uid, strict=False)
                clog.warning("finished an unprepare interrupted by a crash (MIG instance gone)")
                continue
            try:
                if not self.specs.spec_path(record.uid).exists():
                    self.specs.write(record.uid, record.cdiSpec)
                    clog.warning("restored the missing CDI spec of a prepared claim")
                self.ownership.reserve(_ref(record), self._owned(_allocated(record)))
            except (OSError, claims.ClaimError) as exc:
                clog.error("prepared claim is inconsistent after restart", error=str(exc))
        known = {r.uid for r in self.store.records()}
        for uid in self.specs.claim_uids_on_disk():
            if uid not in known:
                self.specs.remove(uid)
                self.log.info("removed a CDI spec of ours without a prepared claim", claim_uid=uid)

    def _recover_sharing(self, records: list[checkpoint.ClaimRecord]) -> None:
        by_state: dict[str, dict[str, tuple[sharing.Target, ...]]] = {}
        for record in records:
            wanted = sharing.recorded_targets(record, self.devices)
            if wanted:
                by_state.setdefault(record.state, {})[record.uid] = wanted
        self.sharing.recover(
            held=by_state.get(checkpoint.PREPARE_COMPLETED, {}),
            interrupted=by_state.get(checkpoint.PREPARE_STARTED, {}),
        )

    # ---- prepare / unprepare -------------------------------------------------------------------

    def prepare(self, ref: claims.ClaimRef) -> tuple[results.PreparedDevice, ...]:
        """Prepare one claim (idempotent). Raises :class:`claims.ClaimError` (API errors
        included) or :class:`checkpoint.CheckpointError`, with a message naming the claim."""
        _check_ref(ref)
        clog = logs.claim_logger(self.log, uid=ref.uid, namespace=ref.namespace, name=ref.name)
        with self.locks.hold(ref.uid):
            record = self.store.get(ref.uid)
            if record is not None and record.state == checkpoint.PREPARE_COMPLETED:
                clog.debug("claim already prepared; answering from the checkpoint")
                return record.prepared()
            if record is not None:  # a failed earlier attempt in this process
                self._forget(ref.uid)
            try:
                claim = self.api.get_resource_claim(ref.namespace, ref.name)
            except kube.NotFound:
                raise claims.ClaimError(f"{ref}: not found in the API server") from None
            except kube.ApiError as exc:
                raise claims.ClaimError(
                    f"{ref}: cannot read it from the API server (HTTP {exc.status}): {exc}"
                ) from None
            allocated = claims.allocated_devices(
                claim, ref=ref, driver=self.driver_name, pool=self.pool_name
            )
            planned = self._plan(ref, allocated)
            needs, planned = mpsclaims.plan_claim(self.mps, ref, allocated, planned)
            wanted = sharing.targets(ref, planned)
            if self.mps is not None:
                self.mps.check_time_slicing(ref, [t.uuid for t in wanted])
            migs = self.mig.intents(ref, allocated)  # dynamic MIG: specs need the new UUIDs
            spec = {} if migs else self.specs.build(ref, planned)
            self.ownership.reserve(ref, self._owned(allocated))
            try:
                record = self._record(ref, allocated, planned, spec, migs, needs)
                self.store.put(record.model_copy(update={"state": checkpoint.PREPARE_STARTED}))
                self.sharing.apply(ref, wanted)
                if self.mps is not None:
                    self.mps.acquire(ref, needs, time_sliced=set(self.sharing.applied()))
                planned, made = self.mig.apply(ref, planned, allocated)
                if made:
                    spec = self.specs.build(ref, planned)
                    record = self._record(ref, allocated, planned, spec, made, needs)
                self.specs.write(ref.uid, spec)
                self.store.put(record)
            except BaseException:
                self._forget(ref.uid, strict=False)
                raise
            # Debug: the driver loop logs one info event per request (result, devices, time).
            clog.debug(
                "prepared claim",
                devices=[d.device for d in allocated],
                cdi_spec=str(self.specs.spec_path(ref.uid)),
            )
            return record.prepared()

    def unprepare(self, ref: claims.ClaimRef) -> None:
        """Undo :meth:`prepare` (idempotent; unknown claims succeed; needs no API access)."""
        _check_ref(ref)
        clog = logs.claim_logger(self.log, uid=ref.uid, namespace=ref.namespace, name=ref.name)
        with self.locks.hold(ref.uid):
            known = self.store.get(ref.uid) is not None
            self._forget(ref.uid)
            clog.debug("unprepared claim" if known else "unprepare of a claim not prepared here")

    def prepared_claims(self) -> list[claims.ClaimRef]:
        return [_ref(r) for r in self.store.records()]

    def _forget(self, uid: str, *, strict: bool = True) -> None:
        """Drop a claim: GPU sharing restored first (a failure raises when ``strict``, keeping
        the record so a retry or the next start-up restores it), then record, spec, ownership;
        then its MPS daemons stop if no claim left on disk uses them (decided after the record
        is gone, so of claims unprepared together the last one stops the daemon)."""
        record = self.store.get(uid)
        if record is not None:
            try:
                self.sharing.release(_ref(record), sharing.recorded_targets(record, self.devices))
            except sharing.SharingError as exc:
                if strict:
                    raise
                self.log.error("GPU sharing not restored", claim_uid=uid, error=str(exc))
            try:
                self.mig.release(record)
            except mig_mod.MigError as exc:
                if strict:
                    raise
                self.log.error("MIG instances not destroyed", claim_uid=uid, error=str(exc))
        self.store.delete(uid)
        self.specs.remove(uid)
        self.ownership.release(uid)
        if record is not None and self.mps is not None:
            self.mps.release(record)

    # ---- helpers -------------------------------------------------------------------------------

    def _owned(self, allocated: Sequence[claims.AllocatedDevice]) -> list[claims.AllocatedDevice]:
        """What a claim holds: its devices, and the memory slices of its dynamic MIG devices."""
        return [*allocated, *self.mig.ownership_keys(allocated)]

    def _plan(
        self, ref: claims.ClaimRef, allocated: Sequence[claims.AllocatedDevice]
    ) -> list[cdi.Planned]:
        planned: list[cdi.Planned] = []
        for dev in allocated:
            known = self.devices.get(dev.device)
            if known is None:
                raise claims.ClaimError(
                    f"{ref}: device {dev.pool}/{dev.device} (request {dev.request}) is not a "
                    "device of this node"
                )
            if known.problem:
                raise claims.ClaimError(
                    f"{ref}: device {dev.device} cannot be prepared: {known.problem}"
                )
            self._check_taints(ref, dev)
            cfg = config.effective(dev.configs, ref=ref, kind=known.kind)
            planned.append(cdi.Planned(device=known, request=dev.request_name, config=cfg))
        clashes = inventory.overlaps(
            [(p.device.name, p.device) for p in planned],
            shares=[d.share_id is not None for d in allocated],
        )
        if clashes:
            raise claims.ClaimError(
                f"{ref}: refusing a claim whose devices overlap in physical GPUs: "
                + "; ".join(clashes)
            )
        return planned

    def _check_taints(self, ref: claims.ClaimRef, dev: claims.AllocatedDevice) -> None:
        if self.device_taints is None:
            return
        device_taints = self.device_taints(dev.device)
        blocking = taints.first_untolerated(device_taints, dev.tolerations)
        if blocking is not None:
            reason = blocking.get("message") or "the device is unhealthy"
            raise DeviceTainted(
                f"{ref}: device {dev.pool}/{dev.device} is tainted "
                f"{taints.describe(blocking)} ({reason}) and request {dev.request} does not "
                "tolerate it"
            )

    def _record(
        self,
        ref: claims.ClaimRef,
        allocated: Sequence[claims.AllocatedDevice],
        planned: Sequence[cdi.Planned],
        spec: dict[str, object],
        migs: Mapping[str, checkpoint.MigRecord],
        needs: Sequence[mpsclaims.Need] = (),
    ) -> checkpoint.ClaimRecord:
        daemons = {n.device.name: n.daemon for n in needs}
        return checkpoint.ClaimRecord(
            uid=ref.uid,
            namespace=ref.namespace,
            name=ref.name,
            state=checkpoint.PREPARE_COMPLETED,
            bootId=self.store.boot_id,
            devices=tuple(
                checkpoint.DeviceRecord(
                    requestNames=(dev.request_name,),
                    poolName=dev.pool,
                    deviceName=dev.device,
                    cdiDeviceIds=(self.specs.device_id(ref.uid, dev.device),),
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


def _check_ref(ref: claims.ClaimRef) -> None:
    if not checkpoint.valid_uid(ref.uid):
        raise claims.ClaimError(f"{ref}: invalid claim uid {ref.uid!r}")
    if not ref.namespace or not ref.name:
        raise claims.ClaimError(f"{ref}: namespace and name are required")


def _ref(record: checkpoint.ClaimRecord) -> claims.ClaimRef:
    return claims.ClaimRef(uid=record.uid, namespace=record.namespace, name=record.name)


def _allocated(record: checkpoint.ClaimRecord) -> list[claims.AllocatedDevice]:
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
