"""Two plugin instances on one node (seamless upgrades): file locks and state read from disk.

Why it exists: during a rolling update with ``maxSurge`` the old and the new pod run side by
side, each with its own sockets (``--pod-uid``), sharing the plugin directory, the checkpoint and
the CDI directory. The kubelet may send a claim's prepare to one instance and its unprepare to
the other (contracts.md §8.2), so between calls nothing may live only in one process's memory:

- :class:`ClaimFileLocks`: ``fcntl.flock`` on ``<plugin-dir>/locks/<claim-uid>.lock`` around each
  claim's prepare/unprepare, so both processes (and all their threads) take turns per claim, while
  different claims still proceed in parallel. Every claim operation also holds ``_node.lock``
  *shared*; an instance's start-up recovery holds it *exclusive*, so it never rolls back a
  preparation the other instance is in the middle of.
- :class:`SharedCheckpoint`: the checkpoint, but a claim's record is re-read from disk (under its
  lock) instead of trusted from this process's index.
- :class:`SharedOwnership`: device ownership that forgets claims the other instance has
  unprepared, so no device is refused as "busy" on the word of a stale memory.
- :class:`SharedSharing`: the GPU time-slicing holders of both instances (from the records on
  disk) and a per-GPU file lock (``_gpu-<uuid>.lock``), so releasing a claim in one instance
  never resets a GPU a claim of the other still wants time-sliced.

Lock files are removed on release; a waiter that locked a file removed under it notices (the
path no longer names its inode) and tries again. Used only when ``--pod-uid`` is set: a single
instance needs none of it.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import os
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import structlog

from dra_driver.driver import checkpoint, claims, inventory, sharing, state

NODE_LOCK = "_node.lock"  # "_" never appears in a claim UID, so no claim can collide with it
_GPU_UUID = re.compile(r"^[A-Za-z0-9-]{1,128}$")


class LockError(claims.ClaimError):
    """A lock file cannot be created or locked (the message names it)."""


class ClaimFileLocks:
    """Per-claim exclusive file locks under ``directory``, shared between processes."""

    def __init__(self, *, directory: Path) -> None:
        self.directory = directory
        self._guard = threading.Lock()
        self._held: collections.Counter[str] = collections.Counter()

    @contextlib.contextmanager
    def hold(self, uid: str) -> Iterator[None]:
        """Hold claim ``uid``'s lock (blocking) for the duration of the ``with`` block."""
        if not checkpoint.valid_uid(uid):
            raise LockError(f"claim uid {uid!r}: not a valid claim uid")
        with (
            self._flock(self.directory / NODE_LOCK, fcntl.LOCK_SH, remove=False),
            self._flock(self.directory / f"{uid}.lock", fcntl.LOCK_EX, remove=True),
        ):
            with self._guard:
                self._held[uid] += 1
            try:
                yield
            finally:
                with self._guard:
                    self._held[uid] -= 1
                    if not self._held[uid]:
                        del self._held[uid]

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold off every claim operation of every instance (start-up recovery)."""
        with self._flock(self.directory / NODE_LOCK, fcntl.LOCK_EX, remove=False):
            yield

    @contextlib.contextmanager
    def gpu(self, uuid: str) -> Iterator[None]:
        """Hold GPU ``uuid``'s lock (blocking): changes of its settings take turns."""
        if not _GPU_UUID.match(uuid):
            raise LockError(f"GPU uuid {uuid!r}: cannot name a lock file after it")
        with self._flock(self.directory / f"_gpu-{uuid}.lock", fcntl.LOCK_EX, remove=False):
            yield

    def holds(self, uid: str) -> bool:
        """Whether a thread of this process holds ``uid``'s lock now."""
        with self._guard:
            return uid in self._held

    @contextlib.contextmanager
    def _flock(self, path: Path, how: int, *, remove: bool) -> Iterator[None]:
        fd = self._lock_file(path, how)
        try:
            yield
        finally:
            if remove:  # still locked: a waiter on this inode will see it is gone and retry
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            os.close(fd)

    def _lock_file(self, path: Path, how: int) -> int:
        while True:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except OSError as exc:
                raise LockError(f"cannot open lock file {path}: {exc.strerror or exc}") from exc
            try:
                fcntl.flock(fd, how)
                locked = os.fstat(fd)
                try:
                    current = os.stat(path)
                except FileNotFoundError:
                    current = None
            except OSError as exc:
                os.close(fd)
                raise LockError(f"cannot lock {path}: {exc.strerror or exc}") from exc
            if current is not None and (current.st_dev, current.st_ino) == (
                locked.st_dev,
                locked.st_ino,
            ):
                return fd
            os.close(fd)  # removed (or replaced) while we waited: lock the new file


class SharedCheckpoint(checkpoint.Checkpoint):
    """A checkpoint another process writes too: reads go to disk, the index follows them.

    Callers hold the claim's :class:`ClaimFileLocks` lock around :meth:`get` and what follows,
    so a record read here cannot change under them.
    """

    def __init__(
        self, *, directory: Path, boot_id: str, log: structlog.typing.FilteringBoundLogger
    ) -> None:
        super().__init__(directory=directory, boot_id=boot_id, log=log)
        self._shared_log = log

    def get(self, uid: str) -> checkpoint.ClaimRecord | None:
        record = self._read(self.path(uid), strict=True)
        with self._lock:
            if record is None:
                self._records.pop(uid, None)
            else:
                self._records[uid] = record
        return record

    def records(self) -> list[checkpoint.ClaimRecord]:
        found: dict[str, checkpoint.ClaimRecord] = {}
        for path in sorted(self.claims_dir.glob("*.json")):
            try:
                record = self._read(path, strict=False)
            except checkpoint.CheckpointError as exc:
                self._shared_log.warning("skipping an unreadable checkpoint file", error=str(exc))
                continue
            if record is not None:
                found[record.uid] = record
        with self._lock:
            self._records = dict(found)
        return list(found.values())

    def _read(self, path: Path, *, strict: bool) -> checkpoint.ClaimRecord | None:
        try:
            data = checkpoint.read_file(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise checkpoint.CheckpointError(f"cannot read {path}: {exc.strerror or exc}") from exc
        try:
            record = checkpoint.decode_record(data, what=str(path))
        except (ValueError, RecursionError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise checkpoint.CheckpointError(
                f"checkpoint file {path} is unreadable: {reason}"
            ) from None
        if record.bootId != self.boot_id:
            return None  # of an earlier boot: start-up removes those
        if strict and path != self.path(record.uid):
            raise checkpoint.CheckpointError(f"checkpoint file {path} holds claim {record.uid}")
        return record


class SharedOwnership(state.Ownership):
    """Ownership that drops claims which no longer exist on disk before it checks a device."""

    def __init__(self, *, store: checkpoint.Checkpoint, locks: ClaimFileLocks) -> None:
        super().__init__()
        self._store = store
        self._file_locks = locks

    def reserve(self, ref: claims.ClaimRef, devices: Sequence[claims.AllocatedDevice]) -> None:
        keys = {(d.pool, d.device) for d in devices}
        with self._guard:
            others = {u.uid for k in keys for u in self._uses.get(k, ()) if u.uid != ref.uid}
        for uid in others:
            # In prepare here (its record may not be written yet), or prepared by anyone: keep.
            if not self._file_locks.holds(uid) and not self._store.path(uid).exists():
                self.release(uid)
        super().reserve(ref, devices)


class SharedSharing:
    """:class:`~dra_driver.driver.sharing.OtherHolders` from the shared checkpoint on disk."""

    def __init__(
        self, *, store: checkpoint.Checkpoint, locks: ClaimFileLocks, devices: inventory.Inventory
    ) -> None:
        self._store = store
        self._locks = locks
        self._devices = devices

    def holders(self, uuid: str) -> Mapping[str, sharing.Target]:
        found: dict[str, sharing.Target] = {}
        for record in self._store.records():
            for target in sharing.recorded_targets(record, self._devices):
                if target.uuid == uuid:
                    found[record.uid] = target
        return found

    def lock(self, uuid: str) -> contextlib.AbstractContextManager[object]:
        return self._locks.gpu(uuid)
