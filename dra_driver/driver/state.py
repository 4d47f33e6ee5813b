"""Preparing and unpreparing one claim: locking, device ownership, CDI spec and checkpoint.

Claims are independent, so each has its own lock (never one node-wide lock: a slow claim must not
hold up the others). Two concurrent calls for the same claim run one after the other, and the
second finds the claim prepared and answers from the checkpoint. Ownership of devices is checked
here too, as the last line of defence: a device prepared for one claim is refused to another,
unless one of them has admin access or both hold shares of a multi-allocatable device.

Order of effects (crash-safety argument):
prepare:   checkpoint PrepareStarted (carries the sharing intent, the MPS daemon and the dynamic
           MIG instances to create) → apply GPU sharing (:mod:`~dra_driver.driver.sharing`) →
           MPS daemon running (:mod:`~dra_driver.driver.mps.mpsclaims`) → create MIG
           instances (:mod:`~dra_driver.driver.mig`) → write CDI spec → checkpoint
           PrepareCompleted → mark its GPUs held (:mod:`~dra_driver.devices.holdings`; the
           slices follow, later)
unprepare: restore GPU sharing defaults → destroy MIG instances → remove CDI spec → delete
           checkpoint record → release ownership and held GPUs → stop the MPS daemon if no
           claim record uses it any more (decided after the record is gone, so of claims
           unprepared together the last one stops it)
start-up:  (:mod:`~dra_driver.driver.recovery`) sharing of completed records re-applied, of
           PrepareStarted ones restored (and, when a claim file was unreadable, every GPU no
           readable record holds is put back to its defaults); MPS daemons of completed records
           adopted or restarted, all others stopped; MIG instances on dynamic GPUs that no
           completed record owns destroyed, a completed record whose MIG instance is gone
           unprepared (a crash cut its unprepare short); PrepareStarted → spec removed, record
           deleted (rolled back); a completed record whose spec is missing or differs from it →
           spec rewritten from it; a spec of ours with no record → removed.

The record goes last on unprepare, so a spec never outlives its record: when the spec cannot be
removed (a read-only or full CDI directory) the claim stays prepared and the kubelet's retry of
the unprepare tries again. A failed prepare is rolled back step by step, each step tried even
when an earlier one failed; the device ownership is always released, and the error the claim
gets is the original cause (with what the rollback could not undo after it). File system errors
(ENOSPC, EROFS, EACCES, ...) are expected conditions: per-claim errors naming the file.
"""

from __future__ import annotations

import dataclasses
import errno
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from dra_driver import logs
from dra_driver.devices import holdings
from dra_driver.driver import (
    cdi,
    checkpoint,
    claiminfo,
    claimplan,
    claims,
    devicemeta,
    inventory,
    metadataroots,
    mpspart,
    recordviews,
    recovery,
    results,
    sharing,
)
from dra_driver.driver import mig as mig_mod
from dra_driver.driver import vfio as vfio_mod
from dra_driver.driver.claimplan import DeviceTainted, DeviceTaints
from dra_driver.driver.ownership import ClaimLocks, DeviceBusy, Ownership
from dra_driver.kube import api as kube

__all__ = [
    "ClaimLocks",  # re-exported from .ownership, where they live
    "ClaimState",
    "DeviceBusy",
    "DeviceTainted",  # re-exported from .claimplan, where they live
    "DeviceTaints",
    "FileProblem",
    "Ownership",
    "RollbackIncomplete",
]


class FileProblem(claims.ClaimError):
    """A claim's file (CDI spec) cannot be written or removed; names the claim and the file."""


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
        mps: mpspart.MpsPart[Any] | None = None,
        held_gpus: holdings.HeldGpus | None = None,
        prepared: claiminfo.PreparedClaims | None = None,
        vfio: vfio_mod.VfioPart | None = None,
        metadata_dir: Path | None = None,
    ) -> None:
        """``device_taints``: a device's taints now; a claim whose request does not tolerate
        one (NoSchedule / NoExecute) is refused, naming the taint and why it is there.
        ``held_gpus`` is told which full GPUs each prepared claim holds (the slices' set ranks
        follow it): after every prepare, unprepare and rollback, and by :meth:`recover`;
        ``prepared`` likewise learns each prepared claim's pods and GPUs (per-claim metrics).
        ``metadata_dir``: where new claims' metadata files go (None: next to the checkpoint,
        ``<plugin-dir>/claim-metadata``); a claim prepared earlier keeps its spec's directory."""
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
        self.held = held_gpus or holdings.HeldGpus()
        self.metadata = metadataroots.MetadataRoots(  # docs/metadata.md
            default=store.directory / devicemeta.DIRECTORY,
            primary=metadata_dir,
            driver_name=driver_name,
            devices=devices,
        )
        self.prepared = prepared or claiminfo.PreparedClaims()
        self.vfio = vfio  # GPUs passed through to VMs (docs/passthrough.md); None: none offered
        # The claim when provably current without a GET (dra_driver.slices.claimcache), or None.
        self.cached_claim: Callable[[claims.ClaimRef], kube.Obj | None] = lambda ref: None

    # ---- start-up ----------------------------------------------------------------------------

    def recover(self) -> None:
        """Bring disk back to a consistent state after whatever ended the last run
        (:func:`~dra_driver.driver.recovery.recover`)."""
        recovery.recover(self)
        self.prepared.reset(
            claiminfo.ClaimInfo(
                uid=r.uid,
                namespace=r.namespace,
                name=r.name,
                pods=(),
                gpus=claiminfo.physical_gpus(r, self.devices),
            )
            for r in self.store.records()
            if r.state == checkpoint.PREPARE_COMPLETED
        )

    # ---- prepare / unprepare -------------------------------------------------------------------

    def prepare(self, ref: claims.ClaimRef) -> tuple[results.PreparedDevice, ...]:
        """Prepare one claim (idempotent). Raises :class:`claims.ClaimError` (API errors
        included) or :class:`checkpoint.CheckpointError`, with a message naming the claim."""
        claims.check_ref(ref)
        clog = logs.claim_logger(self.log, uid=ref.uid, namespace=ref.namespace, name=ref.name)
        with self.locks.hold(ref.uid):
            record = self.store.get(ref.uid)
            if record is not None and record.state == checkpoint.PREPARE_COMPLETED:
                clog.debug("claim already prepared; answering from the checkpoint")
                return record.prepared()
            if record is not None:  # a failed earlier attempt in this process
                self._forget(ref)
            try:
                claim = self.cached_claim(ref) or self.api.get_resource_claim(
                    ref.namespace, ref.name
                )
            except kube.NotFound:
                raise claims.ClaimError(f"{ref}: not found in the API server") from None
            except kube.ApiError as exc:
                raise claims.ClaimError(
                    f"{ref}: cannot read it from the API server (HTTP {exc.status}): {exc}"
                ) from None
            allocated = claims.allocated_devices(
                claim, ref=ref, driver=self.driver_name, pool=self.pool_name
            )
            planned = claimplan.plan(
                ref, allocated, devices=self.devices, device_taints=self.device_taints
            )
            needs, planned = mpspart.plan_claim(self.mps, ref, allocated, planned)
            planned, meta = self.metadata.plan(ref, claim, planned), self.metadata.mounts(ref)
            wanted = sharing.targets(ref, planned)
            if self.mps is not None:
                self.mps.check_time_slicing(ref, [t.uuid for t in wanted])
            migs = self.mig.intents(ref, allocated)  # dynamic MIG: specs need the new UUIDs
            vfios = vfio_mod.claim_targets(self.vfio, ref, allocated)  # nodes known once bound
            spec = {} if migs or vfios else self.specs.build(ref, planned, mounts=meta)
            self.ownership.reserve(ref, self.owned(allocated))
            try:
                record = self._record(ref, allocated, planned, spec, migs, needs)
                text = checkpoint.encode_json(spec)  # once, for the record and the spec file
                started = dataclasses.replace(record, state=checkpoint.PREPARE_STARTED)
                self.store.put(started, spec_json=text)
                self.sharing.apply(ref, wanted)
                if self.mps is not None:
                    self.mps.acquire(ref, needs, time_sliced=set(self.sharing.applied()))
                if vfios and self.vfio is not None:
                    nodes = self.vfio.apply(ref, vfios)
                    spec = vfio_mod.spec(self.specs, ref, planned, nodes, mounts=meta)
                    text = checkpoint.encode_json(spec)
                    record = self._record(ref, allocated, planned, spec, migs, needs)
                planned, made = self.mig.apply(ref, planned, allocated)
                if made:
                    spec = self.specs.build(ref, planned, mounts=meta)
                    text = checkpoint.encode_json(spec)
                    record = self._record(ref, allocated, planned, spec, made, needs)
                self.metadata.write(record)  # before the spec that mounts it
                self._write_spec(ref, spec, text)
                self.store.put(record, spec_json=text)
            except BaseException as exc:
                problems = self.rollback(ref)
                if problems and isinstance(exc, claims.ClaimError | checkpoint.CheckpointError):
                    cause = str(exc) if isinstance(exc, claims.ClaimError) else f"{ref}: {exc}"
                    raise RollbackIncomplete(
                        f"{cause}; rolling back left: {'; '.join(problems)}"
                    ) from exc
                raise
            self.held.hold(ref.uid, recordviews.held_by(record, self.devices))  # never waits
            self.prepared.record(record, self.devices, claims.reserved_pods(claim))
            # Debug: the driver loop logs one info event per request (result, devices, time).
            clog.debug(
                "prepared claim",
                devices=[d.device for d in allocated],
                cdi_spec=str(self.specs.spec_path(ref.uid)),
            )
            return record.prepared()

    def unprepare(self, ref: claims.ClaimRef) -> None:
        """Undo :meth:`prepare` (idempotent; unknown claims succeed; needs no API access)."""
        claims.check_ref(ref)
        clog = logs.claim_logger(self.log, uid=ref.uid, namespace=ref.namespace, name=ref.name)
        with self.locks.hold(ref.uid):
            known = self.store.get(ref.uid) is not None
            self._forget(ref)
            clog.debug("unprepared claim" if known else "unprepare of a claim not prepared here")

    def prepared_claims(self) -> list[claims.ClaimRef]:
        return [_ref(r) for r in self.store.records()]

    def release_orphans(self) -> list[str]:
        """Release device ownership held by claims with no record and no operation in
        progress (what a rollback that could not finish leaves); returns their UIDs."""
        released = []
        for uid in self.ownership.holders():
            if self.locks.busy(uid) or self.store.get(uid) is not None:
                continue
            with self.locks.hold(uid):
                if self.store.get(uid) is None:
                    self.ownership.release(uid)
                    released.append(uid)
        return released

    def _forget(self, ref: claims.ClaimRef) -> None:
        """Drop a prepared claim: GPU sharing restored, MIG instances destroyed, CDI spec
        removed, then the record (a failure raises and keeps the record, so the kubelet's retry
        or the next start-up finishes the job), then the device ownership; last its MPS daemons
        stop if no claim left on disk uses them."""
        record = self.store.get(ref.uid)
        if record is not None:
            self.sharing.release(_ref(record), sharing.recorded_targets(record, self.devices))
            self.mig.release(record)
            if self.vfio is not None:  # the GPU back on nvidia before the record goes
                self.vfio.release(ref, self.vfio.targets(d.deviceName for d in record.devices))
        self._remove_spec(ref)
        self.metadata.remove(ref, record)
        self.store.delete(ref.uid)
        self.ownership.release(ref.uid)
        self.held.release(ref.uid)
        self.prepared.remove(ref.uid)
        if record is not None and self.mps is not None:
            self.mps.release(record)

    def rollback(self, ref: claims.ClaimRef) -> list[str]:
        """Undo a failed prepare as far as possible: every step is tried, ownership is always
        released; returns what could not be undone."""
        problems: list[str] = []
        record = self.store.get(ref.uid)
        if record is not None:
            try:
                self.sharing.release(_ref(record), sharing.recorded_targets(record, self.devices))
            except sharing.SharingError as exc:
                problems.append(str(exc))
            try:
                self.mig.release(record)
            except mig_mod.MigError as exc:
                problems.append(str(exc))
            if self.vfio is not None:
                try:
                    self.vfio.release(ref, self.vfio.targets(d.deviceName for d in record.devices))
                except vfio_mod.VfioError as exc:
                    problems.append(str(exc))
        for remove in (self._remove_spec, lambda r: self.metadata.remove(r, record)):
            try:
                remove(ref)
            except claims.ClaimError as exc:  # FileProblem, MetadataError
                problems.append(str(exc))
        try:
            self.store.delete(ref.uid)
        except checkpoint.CheckpointError as exc:
            if os.path.lexists(self.store.path(ref.uid)):
                problems.append(str(exc))
        self.ownership.release(ref.uid)
        self.held.release(ref.uid)
        if record is not None and self.mps is not None:
            self.mps.release(record)  # never raises; a daemon it cannot stop is retried
        if problems:
            self.log.error(
                "rolling back a failed preparation left work for a retry or the next start-up",
                claim_uid=ref.uid,
                claim_namespace=ref.namespace,
                claim_name=ref.name,
                problems=problems,
            )
        return problems

    def _write_spec(self, ref: claims.ClaimRef, spec: dict[str, object], text: str) -> None:
        try:
            self.specs.write(ref.uid, spec, text=text)
        except OSError as exc:
            raise _file_problem(ref, "write", self.specs.spec_path(ref.uid), exc) from None

    def _remove_spec(self, ref: claims.ClaimRef) -> None:
        try:
            self.specs.remove(ref.uid)
        except OSError as exc:
            path = self.specs.spec_path(ref.uid)
            if not os.path.lexists(path):  # nothing to remove (e.g. EROFS for a missing name)
                return
            raise _file_problem(ref, "remove", path, exc) from None

    # ---- helpers -------------------------------------------------------------------------------

    def owned(self, allocated: Sequence[claims.AllocatedDevice]) -> list[claims.AllocatedDevice]:
        """What a claim holds: its devices, and the memory slices of its dynamic MIG devices."""
        vfio = vfio_mod.ownership_keys(self.devices, allocated) if self.vfio else []
        return [*allocated, *self.mig.ownership_keys(allocated), *vfio]

    def _record(
        self,
        ref: claims.ClaimRef,
        allocated: Sequence[claims.AllocatedDevice],
        planned: Sequence[cdi.Planned],
        spec: dict[str, object],
        migs: Mapping[str, checkpoint.MigRecord],
        needs: Sequence[mpspart.Need],
    ) -> checkpoint.ClaimRecord:
        return recordviews.build_record(
            ref,
            boot_id=self.store.boot_id,
            specs=self.specs,
            allocated=allocated,
            planned=planned,
            spec=spec,
            migs=migs,
            daemons={n.device.name: n.daemon for n in needs},
        )


class RollbackIncomplete(claims.ClaimError):
    """A prepare failed and its rollback could not undo everything; the message gives the
    original cause first, then what is left."""


def _file_problem(ref: claims.ClaimRef, action: str, path: object, exc: OSError) -> FileProblem:
    code = errno.errorcode.get(exc.errno or 0, "")
    reason = exc.strerror or str(exc)
    return FileProblem(
        f"{ref}: cannot {action} CDI spec {path}: {reason}" + (f" ({code})" if code else "")
    )


_ref = recordviews.ref_of
