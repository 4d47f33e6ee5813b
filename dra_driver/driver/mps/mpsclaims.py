"""Which devices of a claim run through MPS, under which daemon, and what their containers get.

Why it exists: it is the policy between a claim's allocation and the MPS daemons
(:mod:`dra_driver.driver.mps.daemons`). For each device of a claim:

* a **share** of a shared GPU (the allocation result has a ``shareID``) runs through that GPU's
  daemon (daemon id = the device name, e.g. ``gpu-3``) with limits from its ``consumedCapacity``:
  ``memory`` → ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``, ``computeShare`` →
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``. A share that takes the whole GPU (all memory, no
  compute cap) is prepared like an exclusive GPU, without a daemon, unless its config asks for
  MPS; a config's MPS limits can only make a share's limits tighter. ``TimeSlicing`` on a share
  is refused (its limits are enforced by MPS).
* a device whose merged config says ``strategy: MPS`` (an exclusive, admin-access or MIG claim)
  runs through a daemon of its own claim (``claim-<uid>``), with the config's limits.

A container reaches one daemon (``CUDA_MPS_PIPE_DIRECTORY``), so the MPS devices of one claim
must all be served by one daemon; a claim that would need two fails with a clear error. Every
MPS device of a claim gets the same CDI edits: the daemon's pipe directory at
``/tmp/nvidia-mps``, its shm directory at ``/dev/shm``, and the claim's limits (summed per GPU
when a claim holds two shares of one GPU).

:class:`MpsClaims` ties this to the daemons and the checkpoint: acquire at prepare, release at
unprepare (the last claim using a daemon stops it), recover at start-up. The claim state reaches
it through :mod:`~dra_driver.driver.mps.lazymps`, which imports this module only when a claim needs
MPS (and plans a claim's devices: :func:`~dra_driver.driver.mps.lazymps.plan_claim`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Final, Literal

import structlog

from dra_driver import records
from dra_driver.devices import model
from dra_driver.driver import checkpoint, claims, config, inventory
from dra_driver.driver.mps import daemons as mps
from dra_driver.driver.mpspart import MpsClaimError  # defined in the core: plan_claim raises it
from dra_driver.slices import shares

CONTAINER_PIPE: Final = "/tmp/nvidia-mps"
CONTAINER_SHM: Final = "/dev/shm"
MOUNT_OPTIONS: Final = ("rw", "nosuid", "nodev", "bind")
_MIB: Final = 1 << 20


@records.record
class Need:
    """One device of a claim that runs through an MPS control daemon."""

    daemon: str
    device: mps.DaemonDevice
    memory_limit: int | None  # bytes; None = no limit
    threads: int | None  # active thread percentage; None = no cap


def plan(
    ref: claims.ClaimRef,
    items: Sequence[tuple[claims.AllocatedDevice, inventory.PreparableDevice, config.GpuConfig]],
    *,
    driver: str,
    gpu_memory: Callable[[str], int],
) -> tuple[Need, ...]:
    """The MPS needs of a claim's devices (empty when it uses no MPS)."""
    mps_configured = [
        (dev, known)
        for dev, known, cfg in items
        if cfg.sharing is not None and cfg.sharing.strategy == "MPS"
    ]
    needs: list[Need] = []
    for dev, known, cfg in items:
        strategy = cfg.sharing.strategy if cfg.sharing is not None else None
        settings = cfg.sharing.mps if cfg.sharing is not None else None
        where = f"{ref}: device {known.name} (request {dev.request})"
        target = mps.DaemonDevice(name=known.name, uuid=known.uuid, kind=_kind(known))
        limit, threads = _config_limits(where, settings, known, mps_configured)
        if dev.share_id is not None:
            if strategy == "TimeSlicing":
                raise MpsClaimError(
                    f"{where} is a share of a shared GPU (share {dev.share_id}); its limits are "
                    "enforced with MPS, so sharing strategy TimeSlicing cannot be applied"
                )
            try:
                share = shares.share_of(dev.consumed_capacity, driver=driver)
            except ValueError as exc:
                raise MpsClaimError(f"{where}: allocation result: {exc}") from None
            if strategy != "MPS" and share.whole_gpu(gpu_memory(known.uuid)):
                continue
            needs.append(
                Need(
                    daemon=known.name,
                    device=target,
                    memory_limit=_tighter(share.memory_bytes or None, limit),
                    threads=_tighter(share.compute_percent or None, threads),
                )
            )
        elif strategy == "MPS":
            needs.append(Need(f"claim-{ref.uid}", target, limit, threads))
    daemons = sorted({n.daemon for n in needs})
    if len(daemons) > 1:
        raise MpsClaimError(
            f"{ref}: its MPS devices would need {len(daemons)} MPS control daemons "
            f"({', '.join(daemons)}); a container reaches one daemon, so one claim can use MPS "
            "on one shared GPU, or on its own devices, but not both (use one claim per GPU)"
        )
    return tuple(needs)


def edits(needs: Sequence[Need], *, dirs: mps.Dirs) -> dict[str, Any]:
    """The CDI container edits every MPS device of the claim gets (env and mounts)."""
    per_gpu: dict[str, list[Need]] = {}
    for need in needs:
        per_gpu.setdefault(need.device.uuid, []).append(need)
    memory = {uuid: _total([n.memory_limit for n in group]) for uuid, group in per_gpu.items()}
    threads = {uuid: _total([n.threads for n in group]) for uuid, group in per_gpu.items()}
    env = [f"CUDA_MPS_PIPE_DIRECTORY={CONTAINER_PIPE}"]
    limits = [f"{uuid}={value // _MIB}M" for uuid, value in memory.items() if value is not None]
    if limits:
        env.append(f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={','.join(limits)}")
    if threads and all(value is not None for value in threads.values()):
        percent = max(min(shares.COMPUTE_FULL, value or 0) for value in threads.values())
        env.append(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={percent}")
    mounts = [
        {"hostPath": str(host), "containerPath": path, "options": list(MOUNT_OPTIONS)}
        for host, path in ((dirs.pipe, CONTAINER_PIPE), (dirs.shm, CONTAINER_SHM))
    ]
    return {"env": env, "mounts": mounts}


def gpu_memory(devices: model.NodeDevices) -> dict[str, int]:
    """GPU and MIG device UUID → memory in bytes (to tell a whole-GPU share)."""
    sizes = {gpu.uuid: gpu.memory_bytes for gpu in devices.gpus}
    sizes.update({m.uuid: m.memory_bytes for gpu in devices.gpus for m in gpu.mig_devices})
    return sizes


def recorded_daemons(
    records: Sequence[checkpoint.ClaimRecord], devices: inventory.Inventory
) -> dict[str, list[mps.DaemonDevice]]:
    """Daemon id → its devices, for the devices these records say run through MPS."""
    wanted: dict[str, list[mps.DaemonDevice]] = {}
    for record in records:
        for dev in record.devices:
            known = devices.get(dev.deviceName)
            if dev.mpsDaemon is None or known is None:
                continue
            members = wanted.setdefault(dev.mpsDaemon, [])
            if all(m.uuid != known.uuid for m in members):
                members.append(
                    mps.DaemonDevice(name=known.name, uuid=known.uuid, kind=_kind(known))
                )
    return wanted


class MpsClaims:
    """MPS for claims: plan and edits at prepare, daemons acquired and released, recovery."""

    def __init__(
        self,
        *,
        daemons: mps.MpsDaemons,
        store: checkpoint.Checkpoint,
        devices: inventory.Inventory,
        gpu_memory: Mapping[str, int],
        driver_name: str,
        log: structlog.typing.FilteringBoundLogger,
    ) -> None:
        self.daemons = daemons
        self.store = store
        self.devices = devices
        self.gpu_memory = dict(gpu_memory)
        self.driver_name = driver_name
        self.log = log

    def plan(
        self,
        ref: claims.ClaimRef,
        items: Sequence[
            tuple[claims.AllocatedDevice, inventory.PreparableDevice, config.GpuConfig]
        ],
    ) -> tuple[tuple[Need, ...], dict[str, Any]]:
        """(the claim's MPS needs, the CDI edits each of those devices gets)."""
        needs = plan(ref, items, driver=self.driver_name, gpu_memory=self._memory)
        if not needs:
            return (), {}
        return needs, edits(needs, dirs=self.daemons.dirs(needs[0].daemon))

    def check_time_slicing(self, ref: claims.ClaimRef, uuids: Collection[str]) -> None:
        """Refuse time-slicing a GPU that an MPS daemon serves."""
        if not uuids:
            return  # the common case: no daemon records to read
        served = self.daemons.gpus()
        for uuid in uuids:
            if uuid in served:
                raise MpsClaimError(
                    f"{ref}: GPU {uuid} runs MPS control daemon {served[uuid]}; it cannot be "
                    "time-sliced at the same time"
                )

    def acquire(
        self, ref: claims.ClaimRef, needs: Sequence[Need], *, time_sliced: Collection[str]
    ) -> None:
        """Make sure the claim's daemon runs (started if it is the first user)."""
        if not needs:
            return
        devices = list({n.device.uuid: n.device for n in needs}.values())
        self.daemons.ensure(needs[0].daemon, devices, time_sliced=time_sliced, context=str(ref))

    def release(self, record: checkpoint.ClaimRecord) -> None:
        """After ``record`` is gone from disk: stop its daemons that no claim on disk uses.

        Never raises: a daemon that cannot be stopped (e.g. its GPU's compute mode cannot be
        restored) is logged and stopped by the next :meth:`check`."""
        for daemon_id in sorted({d.mpsDaemon for d in record.devices if d.mpsDaemon}):
            self._stop_if_unused(daemon_id, claim_uid=record.uid)

    def check(self) -> None:
        """Periodically: stop daemons no claim uses any more, restart those that died (their
        clients are logged and counted as lost), end daemons no record names."""
        for daemon_id in sorted(self.daemons.records()):
            self._stop_if_unused(daemon_id, claim_uid=None)
        self.daemons.supervise(clients=self._users)
        self._start_missing()
        for problem in self.daemons.end_strays():
            self.log.error("MPS daemon no record names could not be ended", problem=problem)

    def _stop_if_unused(self, daemon_id: str, *, claim_uid: str | None) -> None:
        """Stop ``daemon_id`` if no claim uses it; ``claim_uid``: the claim whose unprepare asks
        (its lines carry it), None for the periodic check."""
        claim = {"claim_uid": claim_uid} if claim_uid else {}
        try:
            stopped = self.daemons.release(
                daemon_id, still_wanted=functools.partial(self._in_use, daemon_id)
            )
        except (claims.ClaimError, OSError) as exc:
            self.log.error(
                "MPS daemon not stopped; will retry", daemon=daemon_id, error=str(exc), **claim
            )
            return
        if stopped:
            self.log.info("no claim uses the MPS daemon any more", daemon=daemon_id, **claim)

    def recover(self, prepared: Sequence[checkpoint.ClaimRecord]) -> list[str]:
        """Start-up: the daemons of prepared claims run (adopted or restarted), no others."""
        users: dict[str, list[str]] = {}
        for record in prepared:
            for daemon_id in sorted({d.mpsDaemon for d in record.devices if d.mpsDaemon}):
                users.setdefault(daemon_id, []).append(record.uid)
        return self.daemons.recover(
            recorded_daemons(prepared, self.devices), clients=lambda d: users.get(d, [])
        )

    def _start_missing(self) -> None:
        """Start the daemons prepared claims use that have no record at all (a start at
        recovery or supervision failed and was undone): their clients are without a server."""
        completed = [r for r in self.store.records() if r.state == checkpoint.PREPARE_COMPLETED]
        have = self.daemons.records()
        for daemon_id, devices in recorded_daemons(completed, self.devices).items():
            if daemon_id in have:
                continue
            users = functools.partial(self._users, daemon_id)
            try:
                started = self.daemons.ensure(
                    daemon_id,
                    devices,
                    context="supervision",
                    only_if=functools.partial(_any, users),
                )
            except claims.ClaimError as exc:
                self.log.error(
                    "cannot start a missing MPS daemon", daemon=daemon_id, error=str(exc)
                )
                continue
            if started:
                lost = users()
                self.log.error(
                    "started the missing MPS daemon of prepared claims",
                    daemon=daemon_id,
                    lost_clients=len(lost),
                    claims=lost,
                )
                self.daemons.count_restart("missing", len(lost))

    def _in_use(self, daemon_id: str) -> bool:
        """Whether a claim record on disk (being prepared, or prepared) uses ``daemon_id``."""
        return any(d.mpsDaemon == daemon_id for r in self.store.records() for d in r.devices)

    def _users(self, daemon_id: str) -> list[str]:
        """The claims (UIDs) prepared with ``daemon_id``: its clients."""
        return sorted(
            r.uid
            for r in self.store.records()
            if r.state == checkpoint.PREPARE_COMPLETED
            and any(d.mpsDaemon == daemon_id for d in r.devices)
        )

    def _memory(self, uuid: str) -> int:
        return self.gpu_memory.get(uuid, 0)


def _any(found: Callable[[], Sequence[str]]) -> bool:
    return bool(found())


def _kind(device: inventory.PreparableDevice) -> Literal["gpu", "mig"]:
    return "mig" if device.kind == "mig" else "gpu"


def _total(values: Sequence[int | None]) -> int | None:
    """The sum, or None (no limit) when any share of the GPU has none."""
    return None if any(v is None for v in values) else sum(v or 0 for v in values)


def _tighter(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else min(a, b)


def _config_limits(
    where: str,
    settings: config.Mps | None,
    known: inventory.PreparableDevice,
    group: Sequence[tuple[claims.AllocatedDevice, inventory.PreparableDevice]],
) -> tuple[int | None, int | None]:
    """(pinned memory limit, thread percentage) the MPS config gives this device."""
    if settings is None:
        return None, None
    uuids = [k.uuid for _, k in group]
    per_device = settings.per_device_pinned_memory_limits or {}
    for key in per_device:
        if key not in uuids and not (key.isdigit() and int(key) < len(uuids)):
            raise MpsClaimError(
                f"{where}: mps.perDevicePinnedMemoryLimits key {key!r} names no device of this "
                f"claim that uses MPS (UUIDs {', '.join(uuids) or 'none'}, or an index below "
                f"{len(uuids)})"
            )
    limit_text: str | None = settings.pinned_device_memory_limit
    index = str(uuids.index(known.uuid)) if known.uuid in uuids else None
    for name in (index, known.uuid):
        if name is not None and name in per_device:
            limit_text = per_device[name]
    limit = config.memory_limit(limit_text) if limit_text is not None else None
    return limit, settings.active_thread_percentage
