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

A claim applies all or nothing: when one GPU fails, the ones already changed are synced back and
the claim gets an error naming the device and the reason. The intent is in the checkpoint before
any GPU is touched (each device's merged config in the ``PrepareStarted`` record), so crash
recovery can restore GPUs a dead process had changed (:meth:`GpuSharing.recover`).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping, Sequence
from typing import Final

import pydantic
import structlog

from dra_driver.devices import control
from dra_driver.driver import cdi, checkpoint, claims, config, inventory

INTERVALS: Final[Mapping[str, int]] = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}
# Time-slicing and the baseline both want every process able to open a context.
COMPUTE_MODE: Final[control.ComputeMode] = "Default"


class SharingError(claims.ClaimError):
    """A claim's sharing setting cannot be applied (or a GPU cannot be put back)."""


@dataclasses.dataclass(frozen=True, slots=True)
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
        if sharing is None or sharing.strategy != "TimeSlicing":  # MPS: driver/mps.py
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
        try:
            sharing = config.Sharing.model_validate(raw)
        except pydantic.ValidationError:
            continue
        if sharing.strategy != "TimeSlicing":
            continue
        interval = sharing.time_slicing.interval if sharing.time_slicing else "Default"
        found += [
            Target(device=g.name, uuid=g.uuid, interval=interval) for g in known.members or (known,)
        ]
    return tuple(found)


class GpuSharing:
    """Which claims hold which GPU settings, and the card kept in line with them."""

    def __init__(
        self,
        *,
        gpu_control: control.GpuControl | None,
        log: structlog.typing.FilteringBoundLogger,
    ) -> None:
        self._control = gpu_control
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
                self._sync(target.uuid)
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
    ) -> list[str]:
        """Start-up: ``held`` (prepared claims) are re-applied, ``interrupted`` (preparations a
        crash cut short) released; returns the problems, which are also logged."""
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
                self._sync(target.uuid)
            except control.ControlError as exc:
                problems.append(f"device {target.device} ({target.uuid}): {exc}")
        return problems

    def _sync(self, uuid: str) -> None:
        """Make the card match its holders' wish (the baseline when there are none)."""
        with self._guard:
            lock = self._gpu_locks.setdefault(uuid, threading.Lock())
        with lock:
            with self._guard:
                holders = self._holders.get(uuid) or {}
                wish = next(iter(holders.values()), None)
            if self._control is None:
                raise control.ControlError(f"GPU {uuid}: this plugin runs without GPU control")
            interval = INTERVALS[wish.interval] if wish is not None else control.TIMESLICE_DEFAULT
            self._control.set_compute_mode(uuid, COMPUTE_MODE)
            self._control.set_timeslice(uuid, interval)
