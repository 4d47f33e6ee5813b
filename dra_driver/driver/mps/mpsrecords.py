"""The MPS control daemons' records on disk, their directories and their locks.

Why its own module: :mod:`~.daemons` decides when a daemon starts, stops, is adopted
or restarted; the daemon runners (:mod:`~dra_driver.driver.mps.mpsprocess` for processes,
:mod:`~dra_driver.driver.mps.mpspod` for Pods) decide how it runs. Both halves read and write the
same thing — one record per daemon, ``<plugin dir>/mps/daemons/<id>.json``, under a file lock
per daemon that every agent instance on the node takes (seamless upgrades run two) — so it is
kept here, below both.

A record is written *before* anything is changed and removed *after* everything is undone, so
after a crash it names every daemon that may exist: its devices (whose compute mode may be
``ExclusiveProcess``), and what runs it — a process (``pid`` plus its start time, once spawned)
or a Pod (``pod``, its deterministic name, recorded *before* the Pod is created, and ``podUid``
once it exists). Records are never fsynced: they mean nothing after a reboot (boot scoping).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Final, Literal

import pydantic

from dra_driver import records
from dra_driver.driver import atomicfile, claims

RECORD_KIND: Final = "MpsDaemon"
State = Literal["Starting", "Running", "Stopping"]
_STRICT = pydantic.ConfigDict(extra="forbid", frozen=True)


class MpsError(claims.ClaimError):
    """A daemon cannot be started or stopped; the message names the daemon and the reason."""


class DaemonDevice(pydantic.BaseModel):
    model_config = _STRICT
    name: str  # published device name
    uuid: str
    kind: Literal["gpu", "mig"]


class DaemonRecord(pydantic.BaseModel):
    model_config = _STRICT
    version: Literal[1] = 1
    kind: Literal["MpsDaemon"] = RECORD_KIND
    id: str
    bootId: str
    state: State
    devices: tuple[DaemonDevice, ...]
    pid: int | None = None  # a process: its pid ...
    startTime: int | None = None  # ... and /proc/<pid>/stat field 22: tells a reused pid apart
    pod: str | None = None  # a Pod: its name, recorded before it is created ...
    podUid: str | None = None  # ... and its UID once it exists


@records.record
class Dirs:
    root: Path
    pipe: Path
    log: Path
    shm: Path


def dir_name(daemon_id: str) -> str:
    """A short directory name for a daemon (socket paths inside it must stay short)."""
    if len(daemon_id) <= 16:
        return daemon_id
    return "d-" + hashlib.sha256(daemon_id.encode()).hexdigest()[:12]


class Records:
    """The records, directories and locks under ``root`` (``<plugin dir>/mps``)."""

    def __init__(self, *, root: Path, boot_id: str) -> None:
        self.root = root
        self.boot_id = boot_id
        self.records_dir = root / "daemons"
        self.locks_dir = root / "locks"

    def dirs(self, daemon_id: str) -> Dirs:
        base = self.root / dir_name(daemon_id)
        return Dirs(root=base, pipe=base / "pipe", log=base / "log", shm=base / "shm")

    def all(self) -> dict[str, DaemonRecord]:
        """Every daemon record of this boot on disk, by daemon id (unreadable ones skipped)."""
        found: dict[str, DaemonRecord] = {}
        if not self.records_dir.is_dir():
            return found
        for path in sorted(self.records_dir.glob("*.json")):
            record = read(path)
            if record is not None and record.bootId == self.boot_id:
                found[record.id] = record
        return found

    def get(self, daemon_id: str) -> DaemonRecord | None:
        return self.all().get(daemon_id)

    def gpus(self) -> dict[str, str]:
        """GPU/MIG UUID → id of the daemon serving it."""
        return {d.uuid: r.id for r in self.all().values() for d in r.devices}

    def write(self, record: DaemonRecord) -> None:
        self.records_dir.mkdir(parents=True, exist_ok=True)
        atomicfile.write_json(self.path(record.id), record.model_dump(mode="json"), durable=False)

    def remove(self, daemon_id: str) -> None:
        """The record goes, with the daemon's directories (the last step of a stop)."""
        shutil.rmtree(self.dirs(daemon_id).root, ignore_errors=True)
        atomicfile.remove(self.path(daemon_id), durable=False)

    def path(self, daemon_id: str) -> Path:
        return self.records_dir / f"{dir_name(daemon_id)}.json"

    @contextlib.contextmanager
    def lock(self, daemon_id: str) -> Iterator[None]:
        """The daemon's lock, shared by every agent instance on the node (a file lock)."""
        self.locks_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(
            self.locks_dir / f"{dir_name(daemon_id)}.lock",
            os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
            0o600,
        )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def files(self) -> list[tuple[Path, DaemonRecord | None]]:
        """Every record file (stale temporaries removed first), decoded or None."""
        if not self.records_dir.is_dir():
            return []
        atomicfile.remove_stale_temporaries(self.records_dir)
        return [(path, read(path)) for path in sorted(self.records_dir.glob("*.json"))]

    def remove_file(self, path: Path) -> None:
        """A record file of another boot, or one that does not decode, and its directories."""
        shutil.rmtree(self.root / path.stem, ignore_errors=True)
        atomicfile.remove(path, durable=False)

    def remove_stray_dirs(self) -> None:
        """Daemon directories no record names (a crash after the record went)."""
        if not self.root.is_dir():
            return
        known = {dir_name(i) for i in self.all()} | {"daemons", "locks"}
        for entry in self.root.iterdir():
            if entry.is_dir() and entry.name not in known:
                shutil.rmtree(entry, ignore_errors=True)


def read(path: Path) -> DaemonRecord | None:
    """The record in ``path``; None when it does not decode (start-up deals with it, once)."""
    try:
        return DaemonRecord.model_validate(json.loads(path.read_bytes()))
    except (OSError, ValueError):
        return None
