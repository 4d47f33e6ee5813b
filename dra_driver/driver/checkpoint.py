"""The plugin's memory across crashes, restarts and rolling updates: which claims it prepared.

Unprepare may come after the claim is gone from the API server, or to another instance of the
plugin, so everything needed to undo a preparation is kept on disk, one versioned JSON file per
claim under ``<plugins-dir>/<driver>/claims/<uid>.json`` (one file per claim lets claims be
checkpointed in parallel, and lets a second plugin instance read them), every write atomic
(:mod:`~dra_driver.driver.atomicfile`). The record format itself, and the careful reading of
these files, are in :mod:`~dra_driver.driver.claimrecords` (re-exported here).

Two phases: a record is written as ``PrepareStarted`` *before* the claim's CDI spec, and becomes
``PrepareCompleted`` after it. A record still ``PrepareStarted`` at start-up is a preparation a
crash interrupted and is rolled back. A file that does not decode (corrupted, or written by a
newer version) is moved aside to ``claims-aside/`` with a loud error instead of being silently
replaced, and the plugin starts anyway. "Does not decode" covers everything: files larger than
:data:`MAX_FILE_BYTES` are refused before they are parsed, and JSON nested too deeply for the
parser (``RecursionError``) is corruption like any other, never a crash loop at start-up.

Boot scoping: prepared claims do not survive a reboot (device state and the tmpfs
``/var/run/cdi`` are gone), so every record carries the node's boot ID, and ``checkpoint.json``
next to ``claims/`` records the boot the directory belongs to. After a reboot the old records are
discarded (and their specs removed) by file name, without even parsing them, so a file torn by a
power loss cannot matter.

Durability, decided: a *process* crash (SIGKILL, OOM kill, an upgrade) loses nothing we wrote —
the page cache keeps it and every change is one atomic system call — so fsync only matters for a
power loss or kernel crash, which reboots the node and, by boot scoping, discards the records
anyway: every one of them, by name, whatever state a power loss left it in. So no record is
fsynced (issue 46: the commit's fsync and its directory's were a prepare's two slowest system
calls, and 32 claims at once queued on them). What is synced is what boot scoping itself rests
on: the boot marker, written durably at start-up. Where the boot ID cannot be read
(:data:`UNKNOWN_BOOT`: every boot looks the same, so boot scoping cannot tell an earlier boot's
records), the commit point is durable instead: the ``PrepareCompleted`` record the kubelet is
about to be told about is fsynced, then its directory, before :meth:`Checkpoint.put` returns —
the directory fsync group-committed (:class:`~dra_driver.driver.atomicfile.DirSync`), so claims
committing together share one. ``PrepareStarted`` records and removals are atomic but never
synced: losing one to a power loss is harmless (an orphaned spec is swept at start-up; a
resurrected record is discarded with its boot or, with an unreadable boot ID, is unprepared by
the periodic clean-up once its ResourceClaim is gone).

Cost (see ``benchmarks/ingredients.py``): a record is serialised by
:meth:`~dra_driver.driver.claimrecords.ClaimRecord.encode` (its CDI spec, the bulk of it,
encoded once for the record and the spec file: ``spec_json``) and written with one ``write``;
the commit flips the Started record in place (:meth:`Checkpoint.put`). Record files are
recycled: an unprepared claim's file is renamed to a spare name (``claims/.spare-<token>-<n>``,
never ``*.json``, so nothing reads it as a record) instead of unlinked, and the next Started
record is written into a spare and renamed to ``<uid>.json`` — each as atomic as a create or an
unlink (a rename), but with no inode to allocate or free, which on a busy ext4 costs more than
the rest of the record's I/O. Spares are this process's own (the token): start-up removes every
spare it finds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import threading
import time
from pathlib import Path
from typing import Final

import structlog

from dra_driver.driver import atomicfile
from dra_driver.driver.claimrecords import (
    BOOT_ID_FILE,
    FORMAT_VERSION,
    MAX_FILE_BYTES,
    PREPARE_COMPLETED,
    PREPARE_STARTED,
    UNKNOWN_BOOT,
    ClaimRecord,
    DeviceRecord,
    MigRecord,
    RecordError,
    State,
    decode_json,
    decode_record,
    encode_json,
    read_boot_id,
    read_file,
    valid_uid,
)

# The record format lives in :mod:`.claimrecords`; callers keep finding it here.
__all__ = [
    "BOOT_ID_FILE",
    "FORMAT_VERSION",
    "MAX_FILE_BYTES",
    "MAX_SPARES",
    "META_KIND",
    "PREPARE_COMPLETED",
    "PREPARE_STARTED",
    "SPARE_PREFIX",
    "UNKNOWN_BOOT",
    "Checkpoint",
    "CheckpointError",
    "ClaimRecord",
    "DeviceRecord",
    "LoadReport",
    "MigRecord",
    "RecordError",
    "State",
    "decode_json",
    "decode_record",
    "encode_json",
    "read_boot_id",
    "read_file",
    "valid_uid",
]

META_KIND: Final = "GpuDraClaimCheckpoint"
# The state as serialised (ClaimRecord.encode: compact, fields in declaration order, so the first
# match is the record's own field: keys are fixed and quotes inside values are escaped).
_STARTED_FIELD: Final = b'"state":"PrepareStarted"'
_COMPLETED_FIELD: Final = b'"state":"PrepareCompleted"'
_STARTED_PADDED: Final = _STARTED_FIELD.ljust(len(_COMPLETED_FIELD))  # valid JSON whitespace
SPARE_PREFIX: Final = ".spare-"
MAX_SPARES: Final = 256  # recycled record files kept (one inode and block each)


class CheckpointError(Exception):
    """A checkpoint file cannot be written."""


@dataclasses.dataclass(slots=True)
class LoadReport:
    """What start-up found on disk."""

    records: list[ClaimRecord] = dataclasses.field(default_factory=list)
    other_boot: list[str] = dataclasses.field(default_factory=list)  # UIDs of discarded claims
    moved_aside: list[Path] = dataclasses.field(default_factory=list)
    unreadable: list[Path] = dataclasses.field(default_factory=list)  # claim files not decoded


class Checkpoint:
    """Per-claim records on disk with an in-memory index (safe to use from many threads).

    Callers serialise operations on one claim (per-claim locks); this class only guards its index.
    """

    def __init__(
        self,
        *,
        directory: Path,
        boot_id: str,
        log: structlog.typing.FilteringBoundLogger,
        durable: bool | None = None,
    ) -> None:
        """``durable``: fsync each commit (the record file, then its directory) before
        :meth:`put` returns. None (the default): only when the boot ID is
        :data:`UNKNOWN_BOOT`, the one case where a record could outlive a power loss (see
        the module docstring)."""
        self.directory = directory
        self.durable = boot_id == UNKNOWN_BOOT if durable is None else durable
        self.claims_dir = directory / "claims"
        self.aside_dir = directory / "claims-aside"
        self.boot_id = boot_id
        self._log = log
        self._records: dict[str, ClaimRecord] = {}
        self._lock = threading.Lock()
        self._files = os.fspath(self.claims_dir)
        self._dir_sync = atomicfile.DirSync(self.claims_dir)
        # Started records as written and open for their commit in place, until committed.
        self._started: dict[str, tuple[ClaimRecord, bytes, int]] = {}
        self._spares: list[str] = []  # recycled record files, by path (see the module doc)
        self._spare_names = f"{self._files}/{SPARE_PREFIX}{secrets.token_hex(4)}-"
        self._spares_made = 0

    def path(self, uid: str) -> Path:
        return self.claims_dir / f"{uid}.json"

    def _file(self, uid: str) -> str:
        return f"{self._files}/{uid}.json"

    @property
    def meta_path(self) -> Path:
        return self.directory / "checkpoint.json"

    def load(self) -> LoadReport:
        """Read every record (once, at start-up). Records of another boot are deleted from disk
        and their UIDs reported; undecodable files are moved aside and reported."""
        report = LoadReport()
        if self.boot_id == UNKNOWN_BOOT:
            self._log.warning(
                "the node's boot ID cannot be read: prepared claims cannot be told from an "
                "earlier boot's, so every commit is fsynced",
                checkpoint=str(self.directory),
                durable=self.durable,
            )
        self.claims_dir.mkdir(parents=True, exist_ok=True)
        atomicfile.remove_stale_temporaries(self.claims_dir)
        atomicfile.remove_stale_temporaries(self.directory)
        self._remove_spares()
        earlier_boot = self._meta_boot(report) not in (None, self.boot_id)
        for path in sorted(self.claims_dir.glob("*.json")):
            if earlier_boot:  # by name only: files from before a power loss may be torn
                report.other_boot.append(path.stem)
                atomicfile.remove(path, durable=False)
                continue
            try:
                record = decode_record(read_file(path), what=path.name)
                if path.name != f"{record.uid}.json":
                    raise ValueError(f"file name does not match the record's uid {record.uid}")
            except (ValueError, OSError, RecursionError) as exc:
                report.unreadable.append(path)
                report.moved_aside.append(self._move_aside(path, exc))
                continue
            if record.bootId != self.boot_id:
                report.other_boot.append(record.uid)
                atomicfile.remove(path, durable=False)
                continue
            report.records.append(record)
        meta = {"version": FORMAT_VERSION, "kind": META_KIND, "bootId": self.boot_id}
        atomicfile.write_json(self.meta_path, meta, durable=True)
        with self._lock:
            self._records = {r.uid: r for r in report.records}
        return report

    def _meta_boot(self, report: LoadReport) -> str | None:
        """The boot the claim files belong to; None when unknown (then each record says)."""
        try:
            meta = decode_json(read_file(self.meta_path), what=self.meta_path.name)
        except FileNotFoundError:
            return None
        except (ValueError, OSError) as exc:
            report.moved_aside.append(self._move_aside(self.meta_path, exc))
            return None
        if (
            not isinstance(meta, dict)
            or meta.get("version") != FORMAT_VERSION
            or meta.get("kind") != META_KIND
            or not isinstance(meta.get("bootId"), str)
        ):
            error = ValueError(f"unknown checkpoint format {str(meta)[:200]}")
            report.moved_aside.append(self._move_aside(self.meta_path, error))
            return None
        boot: str = meta["bootId"]
        return boot

    def _move_aside(self, path: Path, exc: Exception) -> Path:
        self.aside_dir.mkdir(parents=True, exist_ok=True)
        stamp = f"{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}"
        target = self.aside_dir / f"{path.name}.{stamp}"
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        try:
            path.replace(target)
        except OSError as move_error:
            self._log.error(
                "checkpoint file is unreadable and cannot be moved aside; ignoring it",
                file=str(path),
                reason=reason,
                move_error=str(move_error),
            )
            return path
        self._log.error(
            "checkpoint file is corrupted or of an unknown version; moved aside. The claim it "
            "described is no longer tracked (unprepare of it will still succeed)",
            file=str(path),
            moved_to=str(target),
            reason=reason,
        )
        return target

    def get(self, uid: str) -> ClaimRecord | None:
        with self._lock:
            return self._records.get(uid)

    def records(self) -> list[ClaimRecord]:
        with self._lock:
            return list(self._records.values())

    def put(self, record: ClaimRecord, *, spec_json: str | None = None) -> None:
        """Write ``record``, then index it; durably only at the commit point (Completed), and only
        where the checkpoint is :attr:`durable` (no readable boot ID).

        The usual sequence — the ``PrepareStarted`` record, then the same record
        ``PrepareCompleted`` — commits in place: the Started record is written with its state
        padded (JSON whitespace) to the width of the Completed one, and the commit overwrites
        just those bytes (one ``pwrite`` within the first page; fsync where durable). That
        spares a new inode, a rename and freeing the old inode — on ext4 the allocation of
        inodes at a high churn rate is the single most expensive thing a prepare does in the
        kernel. Anything else (a record that differs in more than its state) is replaced
        atomically as a whole.
        ``spec_json``: the record's CDI spec already encoded (:func:`encode_json`), if at hand.
        """
        if record.bootId != self.boot_id:
            raise CheckpointError(f"record for claim {record.uid} has a foreign boot ID")
        uid = record.uid
        try:
            if record.state == PREPARE_STARTED:
                data = record.encode(spec_json=spec_json) + b"\n"
                data = data.replace(_STARTED_FIELD, _STARTED_PADDED, 1)
                self._drop_started(uid)
                self._started[uid] = (record, data, self._write_started(uid, data))
            elif not self._commit_in_place(record):
                data = record.encode(spec_json=spec_json) + b"\n"
                atomicfile.write_bytes(
                    self._file(uid), data, durable=self.durable, dir_sync=self._dir_sync
                )
        except OSError as exc:
            raise CheckpointError(f"cannot write checkpoint for claim {uid}: {exc}") from exc
        with self._lock:
            self._records[uid] = record

    def _write_started(self, uid: str, data: bytes) -> int:
        """Write ``data`` as ``<uid>.json`` through a spare (or new) file renamed into place;
        return a descriptor open for writing to it (for the commit in place)."""
        target = self._file(uid)
        while True:
            with self._lock:
                spare = self._spares.pop() if self._spares else None
            name = spare or self._new_spare_name()
            flags = os.O_WRONLY | os.O_CLOEXEC | (0 if spare else os.O_CREAT | os.O_EXCL)
            try:
                fd = os.open(name, flags, 0o644)
            except FileNotFoundError:
                if spare is None:
                    raise
                continue  # removed behind our back (another instance's start-up): next one
            try:
                written = os.pwrite(fd, data, 0)
                while written < len(data):
                    written += os.pwrite(fd, memoryview(data)[written:], written)
                if spare is not None:
                    os.ftruncate(fd, len(data))
                os.rename(name, target)
            except BaseException:
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(name)
                raise
            return fd

    def _new_spare_name(self) -> str:
        with self._lock:
            self._spares_made += 1
            return f"{self._spare_names}{self._spares_made}"

    def _remove_spares(self) -> None:
        with self._lock:
            self._spares.clear()
        for entry in os.scandir(self._files):
            if entry.name.startswith(SPARE_PREFIX):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)

    def _commit_in_place(self, completed: ClaimRecord) -> bool:
        """Flip the Started record on disk to ``completed`` if that is its only difference."""
        started = self._started.pop(completed.uid, None)
        if started is None:
            return False
        record, data, fd = started
        try:
            if not _same_but_state(record, completed):
                return False
            os.pwrite(fd, _COMPLETED_FIELD, data.index(_STARTED_PADDED))
            if self.durable:
                os.fsync(fd)
            st = os.fstat(fd)
            # Removed or replaced behind our back: write it whole again.
            if st.st_nlink == 0 or os.stat(self._file(completed.uid)).st_ino != st.st_ino:
                return False
        except FileNotFoundError:
            return False
        finally:
            os.close(fd)
        if self.durable:
            self._dir_sync.sync()  # the Started record's name was not synced when linked
        return True

    def _drop_started(self, uid: str) -> None:
        started = self._started.pop(uid, None)
        if started is not None:
            os.close(started[2])

    def delete(self, uid: str) -> None:
        """Forget ``uid`` (idempotent). Its file becomes a spare (or, with enough, goes)."""
        self._drop_started(uid)
        path = self._file(uid)
        with self._lock:
            keep = len(self._spares) < MAX_SPARES
        spare = self._new_spare_name() if keep else None
        try:
            if spare is None:
                atomicfile.remove(path, durable=False)
            else:
                os.rename(path, spare)
                with self._lock:
                    self._spares.append(spare)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise CheckpointError(f"cannot remove checkpoint of claim {uid}: {exc}") from exc
        with self._lock:
            self._records.pop(uid, None)


_BUT_STATE: Final = tuple(f.name for f in dataclasses.fields(ClaimRecord) if f.name != "state")


def _same_but_state(a: ClaimRecord, b: ClaimRecord) -> bool:
    """Whether two records differ at most in their state (fields compared directly: a Started
    record is usually a shallow copy of the Completed one)."""
    for name in _BUT_STATE:
        mine, theirs = getattr(a, name), getattr(b, name)
        if mine is not theirs and mine != theirs:
            return False
    return True
