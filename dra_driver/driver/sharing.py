"""Applying a claim's GPU sharing setting to the card at prepare, and taking it back.

:mod:`dra_driver.driver.config` only decodes ``sharing``; this module makes it real, through the
narrow :class:`~dra_driver.devices.control.GpuControl` seam:

* ``Exclusive`` or no ``sharing``: the GPU is left as it is (its baseline) — no call at all,
  so claims that do not ask for anything never need nvidia-smi or root.
* ``TimeSlicing``: compute mode ``Default`` and the time-slice interval
  (Default/Short/Medium/Long → 0/1/2/3) on the full GPU. MIG devices cannot be time-sliced
  (their compute resources are already partitioned): the claim fails, naming the device,
  before anything is touched.
* The baseline a GPU returns to (unprepare, rollback, crash recovery) is compute mode
  ``Default`` with time-slice ``Default``.

Several claims may hold one GPU (admin access, shares of a multi-allocatable device): each
holder's wish is tracked, a different interval on a GPU already time-sliced for another claim is
refused, and a GPU returns to its baseline only when its last holder lets go. Every change to a
GPU is a *sync* of the card with the current holders, under that GPU's lock, so concurrent
applies and releases always leave the card matching the holders.

With two plugin instances on one node (seamless upgrades) a GPU's holders are not all in this
process's memory: :class:`OtherHolders` adds the ones recorded on disk and a lock shared by both
processes, so neither instance resets a GPU the other's claim still wants time-sliced.

A claim applies all or nothing: when one GPU fails, the ones already changed are synced back and
the claim gets an error naming the device and the reason. The intent is in the checkpoint before
any GPU is touched (each device's merged config in the ``PrepareStarted`` record), so crash
recovery can restore GPUs a dead process had changed (:meth:`GpuSharing.recover`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Collection, Mapping, Sequence
from typing import Final, Protocol

import structlog

from dra_driver import records
from dra_driver.devices import control
from dra_driver.driver import cdi, checkpoint, claims, config, inventory

INTERVALS: Final[Mapping[str, int]] = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}
# Time-slicing and the baseline both want every process able to open a context.
COMPUTE_MODE: Final[control.ComputeMode] = "Default"


class SharingError(claims.ClaimError):
    """A claim's sharing setting cannot be applied (or a GPU cannot be put back)."""


@records.record
class Target:
    """One full GPU of a claim that is to be time-sliced."""

    device: str  # published device name, e.g. gpu-5
    uuid: str
    interval: str  # Default / Short / Medium / Long

    def describe(self) -> str:
        return f"TimeSlicing:{self.interval}"


def targets(ref: claims.ClaimRef, planned: Sequence[cdi.Planned]) -> tuple[Target, ...]:
    """The GPUs of a planned claim that need a setting; :class:`SharingError` for MIG ones."""
    found: list[Target] = []
    for item in planned:
        sharing = item.config.sharing
        if sharing is None or sharing.strategy != "TimeSlicing":  # MPS: driver/mps/daemons.py
            continue
        if item.device.kind == "gpu-set":
            interval = sharing.time_slicing.interval if sharing.time_slicing else "Default"
            found += [
                Target(device=m.name, uuid=m.uuid, interval=interval) for m in item.device.members
            ]
            continue
        if item.device.kind != "gpu":
            raise SharingError(
                f"{ref}: device {item.device.name} (request {item.request}) is a MIG device; "
                "sharing strategy TimeSlicing can only be set on a full GPU (a MIG device's "
                "compute is already partitioned: use strategy Exclusive or no sharing)"
            )
        interval = sharing.time_slicing.interval if sharing.time_slicing else "Default"
        found.append(Target(device=item.device.name, uuid=item.device.uuid, interval=interval))
    return tuple(found)


def recorded_targets(
    record: checkpoint.ClaimRecord, devices: inventory.Inventory
) -> tuple[Target, ...]:
    """The targets a checkpoint record asked for (its devices' merged configs).

    Devices no longer on the node, MIG devices and configs that do not decode are skipped: there
    is nothing this node could restore for them.
    """
    found: list[Target] = []
    for dev in record.devices:
        known = devices.get(dev.deviceName)
        raw = dev.config.get("sharing")
        if known is None or known.kind not in ("gpu", "gpu-set") or raw is None:
            continue
        if not isinstance(raw, dict) or raw.get("strategy") != "TimeSlicing":
            continue  # what decodes to anything else needs no restoring: no decoder loaded
        sharing = config.recorded_sharing(raw)
        if sharing is None or sharing.strategy != "TimeSlicing":
            continue
        interval = sharing.time_slicing.interval if sharing.time_slicing else "Default"
        found += [
            Target(device=g.name, uuid=g.uuid, interval=interval) for g in known.members or (known,)
        ]
    return tuple(found)


def full_gpus(devices: inventory.Inventory) -> tuple[tuple[str, str], ...]:
    """(device name, UUID) of every full GPU of the node: what a GPU-wide restore covers."""
    return tuple((d.name, d.uuid) for d in devices.devices.values() if d.kind == "gpu")


class OtherHolders(Protocol):
    """What another plugin instance on the node holds (read from the shared checkpoint)."""

    def holders(self, uuid: str) -> Mapping[str, Target]:
        """Claim uid → target for GPU ``uuid``, as recorded on disk by either instance."""
        ...

    def lock(self, uuid: str) -> contextlib.AbstractContextManager[object]:
        """A lock on GPU ``uuid`` that both processes take before they change it."""
        ...


class _Conflict(control.ControlError):
    """Another holder (of the other instance) wants a different interval."""


class GpuSharing:
    """Which claims hold which GPU settings, and the card kept in line with them."""

    def __init__(
        self,
        *,
        gpu_control: control.GpuControl | None,
        log: structlog.typing.FilteringBoundLogger,
        others: OtherHolders | None = None,
    ) -> None:
        """``others``: the holders another instance on this node recorded (two instances)."""
        self._control = gpu_control
        self._others = others
        self._log = log
        self._guard = threading.Lock()
        self._holders: dict[str, dict[str, Target]] = {}  # GPU uuid → claim uid → target
        self._gpu_locks: dict[str, threading.Lock] = {}  # one per GPU ever touched

    def applied(self) -> dict[str, str]:
        """GPU uuid → the setting its holders asked for (GPUs at their baseline are absent)."""
        with self._guard:
            return {
                uuid: next(iter(h.values())).describe() for uuid, h in self._holders.items() if h
            }

    def apply(self, ref: claims.ClaimRef, wanted: Sequence[Target]) -> None:
        """Hold and apply ``wanted`` for ``ref`` — all of it, or nothing (rolled back)."""
        if not wanted:
            return
        if self._control is None:
            raise SharingError(
                f"{ref}: device {wanted[0].device} asks for {wanted[0].describe()}, but this "
                "plugin runs without GPU control"
            )
        with self._guard:
            for target in wanted:
                for uid, other in self._holders.get(target.uuid, {}).items():
                    if uid != ref.uid and other.interval != target.interval:
                        raise SharingError(
                            f"{ref}: device {target.device} is already time-sliced with interval "
                            f"{other.interval} for claim uid {uid}; cannot also set "
                            f"{target.interval}"
                        )
            for target in wanted:
                self._holders.setdefault(target.uuid, {})[ref.uid] = target
        for target in wanted:
            try:
                self._sync(target.uuid, claimant=(ref.uid, target))
            except control.ControlError as exc:
                problems = self._drop(ref.uid, wanted)
                outcome = (
                    "rolling back failed too: " + "; ".join(problems)
                    if problems
                    else "GPUs of the claim rolled back to their defaults"
                )
                raise SharingError(
                    f"{ref}: cannot apply {target.describe()} to device {target.device} "
                    f"({target.uuid}): {exc}; {outcome}"
                ) from None
        for target in wanted:
            self._log.info(
                "applied GPU sharing",
                claim_uid=ref.uid,
                device=target.device,
                gpu_uuid=target.uuid,
                setting=target.describe(),
            )

    def release(self, ref: claims.ClaimRef, held: Sequence[Target]) -> None:
        """Let go of ``held`` and put GPUs nobody else holds back to their baseline.

        Idempotent (the card is synced every time, so a retry repairs an earlier failure);
        :class:`SharingError` names every GPU that could not be restored.
        """
        problems = self._drop(ref.uid, held)
        if problems:
            raise SharingError(
                f"{ref}: cannot restore the default sharing settings: {'; '.join(problems)}"
            )

    def recover(
        self,
        *,
        held: Mapping[str, Sequence[Target]],
        interrupted: Mapping[str, Sequence[Target]],
        restore: Collection[tuple[str, str]] = (),
    ) -> list[str]:
        """Start-up: ``held`` (prepared claims) are re-applied, ``interrupted`` (preparations a
        crash cut short) released, and the GPUs of ``restore`` ((device, uuid) pairs) that
        nobody holds put back to their baseline; returns the problems, which are also logged."""
        with self._guard:
            for uid, wanted in held.items():
                for target in wanted:
                    self._holders.setdefault(target.uuid, {})[uid] = target
        problems: list[str] = []
        for uid, wanted in interrupted.items():
            problems += [f"claim uid {uid}: {p}" for p in self._drop(uid, wanted)]
        for uid, wanted in held.items():
            for target in wanted:
                try:
                    self._sync(target.uuid)
                except control.ControlError as exc:
                    problems.append(f"claim uid {uid}: device {target.device}: {exc}")
        with self._guard:
            unheld = [(name, uuid) for name, uuid in restore if not self._holders.get(uuid)]
        for name, uuid in unheld:
            try:
                self._sync(uuid)
            except control.ControlError as exc:
                problems.append(f"device {name} ({uuid}): {exc}")
        if unheld:
            self._log.warning(
                "restored GPU sharing defaults of GPUs no readable claim record holds",
                devices=[name for name, _ in unheld],
            )
        for problem in problems:
            self._log.error("GPU sharing settings could not be recovered", problem=problem)
        if interrupted and not problems:
            self._log.warning(
                "restored GPU sharing defaults after interrupted preparations",
                claims=sorted(interrupted),
            )
        return problems

    # ---- helpers -------------------------------------------------------------------------------

    def _drop(self, uid: str, held: Sequence[Target]) -> list[str]:
        with self._guard:
            for target in held:
                holders = self._holders.get(target.uuid)
                if holders is not None:
                    holders.pop(uid, None)
                    if not holders:
                        del self._holders[target.uuid]
        problems: list[str] = []
        for target in held:
            try:
                self._sync(target.uuid, leaving=uid)
            except control.ControlError as exc:
                problems.append(f"device {target.device} ({target.uuid}): {exc}")
        return problems

    def _sync(
        self, uuid: str, *, leaving: str = "", claimant: tuple[str, Target] | None = None
    ) -> None:
        """Make the card match its holders' wish (the baseline when there are none).

        Holders are this process's plus, with two instances, those on disk (less ``leaving``,
        whose record goes only after this); ``claimant`` (uid, target) must agree with them.
        """
        with self._guard:
            lock = self._gpu_locks.setdefault(uuid, threading.Lock())
        shared = self._others.lock(uuid) if self._others else contextlib.nullcontext()
        with lock, shared:
            with self._guard:
                holders = dict(self._holders.get(uuid) or {})
            if self._others is not None:
                for uid, target in self._others.holders(uuid).items():
                    if uid != leaving:
                        holders.setdefault(uid, target)
            if claimant is not None:
                for uid, other in holders.items():
                    if uid != claimant[0] and other.interval != claimant[1].interval:
                        raise _Conflict(
                            f"already time-sliced with interval {other.interval} for claim uid "
                            f"{uid}; cannot also set {claimant[1].interval}"
                        )
            wish = next(iter(holders.values()), None)
            if self._control is None:
                raise control.ControlError(f"GPU {uuid}: this plugin runs without GPU control")
            interval = INTERVALS[wish.interval] if wish is not None else control.TIMESLICE_DEFAULT
            self._control.set_compute_mode(uuid, COMPUTE_MODE)
            self._control.set_timeslice(uuid, interval)
