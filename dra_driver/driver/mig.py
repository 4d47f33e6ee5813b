"""Dynamic MIG at prepare time: make the allocated MIG instance, take it away again, recover.

Why it exists: with dynamic MIG the scheduler allocates a *placement* (``gpu-0-mig-3g-40gb-4``)
that does not exist yet; this module makes it real through the
:class:`~dra_driver.devices.migcontrol.MigControl` seam, and is the only driver code that
changes a GPU's MIG layout. :mod:`dra_driver.driver.state` calls it at fixed points:

* :meth:`MigInstances.intents` before anything is touched: the instances a claim needs, recorded
  in the ``PrepareStarted`` checkpoint record *before* they are created (two-phase: whatever
  happens next, recovery knows what may exist).
* :meth:`MigInstances.ownership_keys`: every memory slice a device covers (a full dynamic GPU,
  alone or in a GPU set, covers all of them) becomes an ownership key, so a placement
  overlapping another claim's, or the full GPU (or a set with it) while a MIG device of it is
  prepared (and the reverse), is refused per claim.
* :meth:`MigInstances.apply`: turns MIG mode on (or off, for a full GPU handed out whole, alone
  or in a GPU set) when needed — only on an idle GPU, else the claim fails naming the processes
  — and creates the GPU and compute instances; the claim's devices come back with their UUIDs
  and capability nodes.
* :meth:`MigInstances.release` at unprepare (and rollback): destroys the claim's instances; a
  failure keeps the checkpoint record, so a retry or the next start-up finishes the job.
* :meth:`MigInstances.recover` at start-up: on every dynamic GPU, instances that no prepared
  (``PrepareCompleted``) claim owns are destroyed — those of interrupted preparations and any
  left by a crash between "created" and "recorded" — and those one owns are kept. A prepared
  claim whose instances are already (partly) gone was being unprepared when the plugin died
  (instances go before the record): the caller finishes that unprepare.

Per GPU, mode changes, creation and destruction run one at a time (a lock per GPU).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence

import structlog

from dra_driver.devices import migcontrol
from dra_driver.driver import cdi, checkpoint, claims, inventory


class MigError(claims.ClaimError):
    """A claim's dynamic MIG device cannot be created (or a GPU's MIG mode not changed)."""


def _slice_key(gpu: str, index: int) -> str:
    return f"{gpu} memory slice {index}"


class MigInstances:
    """The MIG instances of prepared claims on the GPUs handed to dynamic MIG."""

    def __init__(
        self,
        *,
        control: migcontrol.MigControl | None,
        devices: inventory.Inventory,
        log: structlog.typing.FilteringBoundLogger,
    ) -> None:
        self._control = control
        self._devices = devices
        self._log = log
        self._guard = threading.Lock()
        self._gpu_locks: dict[str, threading.Lock] = {}
        self._gpu_names = {d.uuid: d.name for d in devices.devices.values() if d.kind == "gpu"}
        self._dynamic_gpus = sorted(
            d.uuid for d in devices.devices.values() if d.kind == "gpu" and d.dynamic
        )

    # ---- planning ------------------------------------------------------------------------------

    def intents(
        self, ref: claims.ClaimRef, allocated: Sequence[claims.AllocatedDevice]
    ) -> dict[str, checkpoint.MigRecord]:
        """Device name → the instance to create for it (nothing created yet)."""
        found: dict[str, checkpoint.MigRecord] = {}
        for dev in allocated:
            known = self._devices.get(dev.device)
            if known is None or known.placement is None:
                continue
            if dev.admin_access:
                raise MigError(
                    f"{ref}: device {dev.device} is a dynamic MIG placement; adminAccess to a "
                    "MIG instance another claim creates is not supported"
                )
            place = known.placement
            found[dev.device] = checkpoint.MigRecord(
                parentUUID=place.parent_uuid,
                profile=place.profile,
                profileId=place.profile_id,
                placementStart=place.start,
                placementSize=place.size,
            )
        return found

    def ownership_keys(
        self, allocated: Sequence[claims.AllocatedDevice]
    ) -> list[claims.AllocatedDevice]:
        """Extra ownership entries: the memory slices each dynamic device covers (a full
        dynamic GPU, alone or in a GPU set, covers all of them)."""
        keys: list[claims.AllocatedDevice] = []
        for dev in allocated:
            known = self._devices.get(dev.device)
            if known is None:
                continue
            covered: list[tuple[str, int]] = []
            if known.placement is not None:
                place = known.placement
                gpu = self._gpu_names.get(place.parent_uuid, place.parent_uuid)
                covered = [(gpu, i) for i in range(place.start, place.start + place.size)]
            for whole in (*known.members, known) if known.placement is None else ():
                if whole.dynamic:
                    covered += [(whole.name, i) for i in range(self._memory_slices(whole.uuid))]
            keys += [
                claims.AllocatedDevice(
                    request=dev.request,
                    pool=dev.pool,
                    device=_slice_key(gpu, index),
                    admin_access=dev.admin_access,
                    share_id=None,
                    configs=(),
                )
                for gpu, index in covered
            ]
        return keys

    def _memory_slices(self, gpu_uuid: str) -> int:
        ends = [
            d.placement.start + d.placement.size
            for d in self._devices.devices.values()
            if d.placement is not None and d.placement.parent_uuid == gpu_uuid
        ]
        return max(ends, default=0)

    # ---- prepare / unprepare -------------------------------------------------------------------

    def apply(
        self,
        ref: claims.ClaimRef,
        planned: Sequence[cdi.Planned],
        allocated: Sequence[claims.AllocatedDevice],
    ) -> tuple[list[cdi.Planned], dict[str, checkpoint.MigRecord]]:
        """Make the claim's dynamic devices real: the planned devices with UUIDs and nodes, and
        the records of the instances made. Raises :class:`MigError` naming the device."""
        out: list[cdi.Planned] = []
        made: dict[str, checkpoint.MigRecord] = {}
        for item, dev in zip(planned, allocated, strict=True):
            known = item.device
            if known.placement is not None:
                instance = self._create(ref, known)
                created = self._devices.created(known, instance)
                if created.problem:
                    raise MigError(
                        f"{ref}: device {known.name} cannot be prepared: {created.problem}"
                    )
                out.append(
                    cdi.Planned(
                        device=created, request=item.request, config=item.config, edits=item.edits
                    )
                )
                made[known.name] = checkpoint.MigRecord(
                    parentUUID=known.placement.parent_uuid,
                    profile=known.placement.profile,
                    profileId=known.placement.profile_id,
                    placementStart=known.placement.start,
                    placementSize=known.placement.size,
                    gpuInstanceId=instance.gpu_instance_id,
                    computeInstanceId=instance.compute_instance_id,
                    uuid=instance.uuid,
                )
                continue
            if not dev.admin_access:
                for whole in (*known.members, known):
                    if whole.dynamic:
                        self._whole(ref, whole)
            out.append(item)
        return out, made

    def _create(
        self, ref: claims.ClaimRef, known: inventory.PreparableDevice
    ) -> migcontrol.Instance:
        place = known.placement
        if place is None:
            raise RuntimeError(f"device {known.name} has no MIG placement to create")
        control = self._need_control(ref, known.name)
        with self._gpu(place.parent_uuid):
            try:
                if not control.mig_enabled(place.parent_uuid):
                    control.set_mig_mode(place.parent_uuid, True)
                    self._log.info(
                        "enabled MIG mode", claim_uid=ref.uid, gpu_uuid=place.parent_uuid
                    )
                instance = control.create(place)
            except migcontrol.MigControlError as exc:
                raise MigError(f"{ref}: device {known.name}: {exc}") from None
        self._log.info(
            "created MIG instance",
            claim_uid=ref.uid,
            device=known.name,
            gpu_uuid=place.parent_uuid,
            gpu_instance=instance.gpu_instance_id,
            compute_instance=instance.compute_instance_id,
            mig_uuid=instance.uuid,
        )
        return instance

    def _whole(self, ref: claims.ClaimRef, known: inventory.PreparableDevice) -> None:
        """A dynamic GPU handed out whole: MIG mode must be off (no instances may exist)."""
        control = self._need_control(ref, known.name)
        with self._gpu(known.uuid):
            try:
                if not control.mig_enabled(known.uuid):
                    return
                left = control.instances(known.uuid)
                if left:
                    raise MigError(
                        f"{ref}: device {known.name} cannot be handed out whole: it still has "
                        f"{len(left)} MIG instance(s) (GPU instance ids "
                        f"{', '.join(str(i.gpu_instance_id) for i in left)})"
                    )
                control.set_mig_mode(known.uuid, False)
            except migcontrol.MigControlError as exc:
                raise MigError(f"{ref}: device {known.name}: {exc}") from None
        self._log.info("disabled MIG mode", claim_uid=ref.uid, gpu_uuid=known.uuid)

    def release(self, record: checkpoint.ClaimRecord) -> None:
        """Destroy the claim's instances (idempotent); :class:`MigError` names what is left."""
        problems: list[str] = []
        for dev in record.devices:
            if dev.mig is None:
                continue
            try:
                self._destroy(dev.mig, claim_uid=record.uid, device=dev.deviceName)
            except migcontrol.MigControlError as exc:
                problems.append(f"device {dev.deviceName}: {exc}")
        if problems:
            ref = claims.ClaimRef(uid=record.uid, namespace=record.namespace, name=record.name)
            raise MigError(f"{ref}: cannot destroy its MIG instances: {'; '.join(problems)}")

    def _destroy(self, mig: checkpoint.MigRecord, **context: str) -> bool:
        if self._control is None:
            raise migcontrol.MigControlError("this plugin runs without MIG control")
        with self._gpu(mig.parentUUID):
            gone = self._control.destroy(
                mig.parentUUID, profile_id=mig.profileId, start=mig.placementStart
            )
        if gone:
            self._log.info(
                "destroyed MIG instance",
                gpu_uuid=mig.parentUUID,
                profile=mig.profile,
                placement_start=mig.placementStart,
                **context,
            )
        return gone

    # ---- start-up ------------------------------------------------------------------------------

    def recover(self, records: Sequence[checkpoint.ClaimRecord]) -> set[str]:
        """Start-up: destroy every instance on a dynamic GPU that no prepared claim owns.

        Returns the UIDs of prepared claims whose instances are (partly) gone — an unprepare
        that a crash cut short after destroying them: the caller finishes it (their remaining
        instances count as unowned and are destroyed here)."""
        if not self._dynamic_gpus or self._control is None:
            return set()
        found: dict[str, list[migcontrol.Instance]] = {}
        for gpu in self._dynamic_gpus:
            try:
                found[gpu] = self._control.instances(gpu)
            except migcontrol.MigControlError as exc:
                self._log.error("MIG instances could not be listed", error=str(exc))
        present = {(g, i.profile_id, i.start) for g, items in found.items() for i in items}
        owned: set[tuple[str, int, int]] = set()
        incomplete: set[str] = set()
        for record in records:
            if record.state != checkpoint.PREPARE_COMPLETED:
                continue
            keys = {
                (d.mig.parentUUID, d.mig.profileId, d.mig.placementStart)
                for d in record.devices
                if d.mig is not None
            }
            listed = {k for k in keys if k[0] in found}
            if listed - present:
                incomplete.add(record.uid)
            else:
                owned |= keys
        for gpu, items in found.items():
            for instance in items:
                if (gpu, instance.profile_id, instance.start) in owned:
                    continue
                orphan = checkpoint.MigRecord(
                    parentUUID=gpu,
                    profile=str(instance.profile_id),
                    profileId=instance.profile_id,
                    placementStart=instance.start,
                    placementSize=instance.size,
                )
                try:
                    self._destroy(orphan, reason="no prepared claim owns it")
                except migcontrol.MigControlError as exc:
                    self._log.error("MIG instance could not be destroyed", error=str(exc))
        return incomplete

    # ---- helpers -------------------------------------------------------------------------------

    def _need_control(self, ref: claims.ClaimRef, device: str) -> migcontrol.MigControl:
        if self._control is None:
            raise MigError(f"{ref}: device {device} needs MIG control, which this plugin lacks")
        return self._control

    @contextlib.contextmanager
    def _gpu(self, uuid: str) -> Iterator[None]:
        with self._guard:
            lock = self._gpu_locks.setdefault(uuid, threading.Lock())
        with lock:
            yield
