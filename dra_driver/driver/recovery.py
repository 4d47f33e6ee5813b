"""Start-up recovery of the claim state: whatever ended the last run, disk made consistent.

Why its own module: :mod:`~dra_driver.driver.state` prepares and unprepares claims while the
plugin runs; this is the other half of its crash-safety argument (the order of effects is in
that module's docstring), run once before the plugin serves: records of an earlier boot are
forgotten, unreadable files moved aside (:mod:`~dra_driver.driver.checkpoint`), GPU sharing
re-applied or restored, MPS daemons adopted or stopped, dynamic MIG instances reconciled with the
records (unprepares a crash cut short are finished), interrupted preparations rolled back,
missing or differing CDI specs of prepared claims rewritten from their records (their metadata
files first, :mod:`~dra_driver.driver.devicemeta`, in the directory each spec mounts them from:
:mod:`~dra_driver.driver.metadataroots`), specs and metadata of ours without a record removed,
and the GPUs the prepared claims hold handed to the slices' set ranks
(:mod:`dra_driver.devices.holdings`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import structlog

from dra_driver import logs
from dra_driver.devices import holdings
from dra_driver.driver import cdi, checkpoint, claims, inventory, metadataroots, mpspart, sharing
from dra_driver.driver import mig as mig_mod
from dra_driver.driver import vfio as vfio_mod
from dra_driver.driver.ownership import Ownership
from dra_driver.driver.recordviews import allocated_of, held_by, ref_of
from dra_driver.driver.sharing import GpuSharing

# Record views used to live here; callers keep finding them.
__all__ = ["ClaimStateParts", "allocated_of", "held_by", "recover", "ref_of", "refresh_held"]


class ClaimStateParts(Protocol):
    """What recovery needs of :class:`~dra_driver.driver.state.ClaimState` (handed in, so this
    module never imports the one that calls it)."""

    @property
    def store(self) -> checkpoint.Checkpoint: ...

    @property
    def specs(self) -> cdi.CdiSpecs: ...

    @property
    def metadata(self) -> metadataroots.MetadataRoots: ...

    @property
    def devices(self) -> inventory.Inventory: ...

    @property
    def sharing(self) -> GpuSharing: ...

    @property
    def mps(self) -> mpspart.MpsPart[Any] | None: ...

    @property
    def mig(self) -> mig_mod.MigInstances: ...

    @property
    def vfio(self) -> vfio_mod.VfioPart | None: ...

    @property
    def ownership(self) -> Ownership: ...

    @property
    def held(self) -> holdings.HeldGpus: ...

    @property
    def log(self) -> structlog.typing.FilteringBoundLogger: ...

    def rollback(self, ref: claims.ClaimRef) -> list[str]: ...

    def owned(
        self, allocated: Sequence[claims.AllocatedDevice]
    ) -> list[claims.AllocatedDevice]: ...


def recover(state: ClaimStateParts) -> None:
    """Bring disk back to a consistent state after whatever ended the last run."""
    report = state.store.load()
    state.specs.remove_stale_temporaries()
    state.metadata.remove_stale_temporaries()
    for uid in report.other_boot:
        if checkpoint.valid_uid(uid):
            state.specs.remove(uid)
            state.metadata.remove(claims.ClaimRef(uid=uid, namespace="", name=""))
    if report.other_boot:
        state.log.info(
            "node rebooted since these claims were prepared; forgot them",
            claims=report.other_boot,
        )
    # GPUs of claims we cannot read (or that an earlier boot left) go back to their defaults.
    _recover_sharing(state, report.records, unknown=bool(report.unreadable or report.other_boot))
    if state.mps is not None:  # daemons of prepared claims adopted or restarted, others stopped
        state.mps.recover([r for r in report.records if r.state == checkpoint.PREPARE_COMPLETED])
    unprepared = state.mig.recover(report.records)  # records whose MIG instance is gone
    if state.vfio is not None:  # GPUs on vfio-pci: kept for prepared claims, others given back
        unprepared |= state.vfio.recover(report.records)
    for record in report.records:
        clog = logs.claim_logger(
            state.log, uid=record.uid, namespace=record.namespace, name=record.name
        )
        if record.state == checkpoint.PREPARE_STARTED:
            state.specs.remove(record.uid)
            state.metadata.remove(ref_of(record), record)
            state.store.delete(record.uid)
            clog.warning("rolled back a preparation interrupted by a crash")
            continue
        if record.uid in unprepared:
            state.rollback(ref_of(record))  # every step tried; what is left is logged
            clog.warning("finished an unprepare interrupted by a crash (MIG instance gone)")
            continue
        try:
            if state.metadata.restore(record):  # before the spec that mounts them
                clog.warning("restored the metadata files of a prepared claim")
            path = state.specs.spec_path(record.uid)
            if not os.path.lexists(path):
                state.specs.write(record.uid, record.cdiSpec)
                clog.warning("restored the missing CDI spec of a prepared claim")
            elif not _same_spec(path, record.cdiSpec):
                state.specs.write(record.uid, record.cdiSpec)
                clog.warning("rewrote a CDI spec that differed from its prepared claim's")
            state.ownership.reserve(ref_of(record), state.owned(allocated_of(record)))
        except (OSError, claims.ClaimError) as exc:
            clog.error("prepared claim is inconsistent after restart", error=str(exc))
    records = state.store.records()
    known = {r.uid for r in records}
    for uid in state.specs.claim_uids_on_disk():
        if uid not in known:
            state.specs.remove(uid)
            state.log.info("removed a CDI spec of ours without a prepared claim", claim_uid=uid)
    for uid in state.metadata.uids_on_disk():
        if uid not in known:
            state.metadata.remove(claims.ClaimRef(uid=uid, namespace="", name=""))
            state.log.info("removed claim metadata without a prepared claim", claim_uid=uid)
    # The slices' set ranks start from what the prepared claims hold (the first write is right).
    state.held.reset(
        {
            r.uid: held_by(r, state.devices)
            for r in records
            if r.state == checkpoint.PREPARE_COMPLETED
        }
    )


def _recover_sharing(
    state: ClaimStateParts, records: list[checkpoint.ClaimRecord], *, unknown: bool
) -> None:
    """Re-apply what prepared claims hold, release what interrupted ones took; when some
    claims are ``unknown`` (an unreadable file, records of an earlier boot), also restore every
    full GPU no readable record holds, so none stays time-sliced for the next exclusive claim."""
    by_state: dict[str, dict[str, tuple[sharing.Target, ...]]] = {}
    for record in records:
        wanted = sharing.recorded_targets(record, state.devices)
        if wanted:
            by_state.setdefault(record.state, {})[record.uid] = wanted
    state.sharing.recover(
        held=by_state.get(checkpoint.PREPARE_COMPLETED, {}),
        interrupted=by_state.get(checkpoint.PREPARE_STARTED, {}),
        restore=sharing.full_gpus(state.devices) if unknown else (),
    )


def refresh_held(state: ClaimStateParts) -> bool:
    """Re-read which GPUs prepared claims hold from the checkpoint, which every instance of the
    agent on this node shares: during a seamless upgrade the kubelet may prepare through the
    instance that does not publish. A claim this instance is preparing right now (its record
    not yet completed) keeps what it holds here. Returns whether the held set changed."""
    records = state.store.records()
    fresh = {
        r.uid: held_by(r, state.devices) for r in records if r.state == checkpoint.PREPARE_COMPLETED
    }
    for uid, gpus in state.held.claims().items():
        if uid not in fresh and any(r.uid == uid for r in records):
            fresh[uid] = gpus
    return state.held.reset(fresh)


def _same_spec(path: Path, spec: dict[str, object]) -> bool:
    """Whether the spec file at ``path`` holds ``spec`` (anything unreadable does not)."""
    try:
        return bool(checkpoint.decode_json(checkpoint.read_file(path), what=path.name) == spec)
    except (OSError, ValueError):
        return False
