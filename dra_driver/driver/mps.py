"""MPS control daemons: started, supervised, adopted and stopped by the node agent.

Why it exists: a GPU shared by several claims (consumable capacity) enforces each share's memory
and compute limits through NVIDIA's Multi-Process Service. One control daemon
(``nvidia-cuda-mps-control -f``) runs per shared GPU, or per claim that asks for MPS on its own
devices; containers reach it through its pipe directory (:mod:`dra_driver.driver.mpsclaims` puts
that into their CDI spec). This module owns the daemons' life: the GPU's compute mode
(``ExclusiveProcess`` while a daemon runs, ``Default`` again after), the pipe, log and shm
directories under ``<plugin dir>/mps/``, the process, and a record of each daemon on disk.

Crash safety. Every daemon has a record ``<plugin dir>/mps/daemons/<id>.json`` written *before*
anything is changed and removed *after* everything is undone:

start: record Starting → compute mode ExclusiveProcess → directories → spawn → record Running
       (pid, start time) → wait until the ``control`` socket appears
stop:  record Stopping → ``quit`` (then SIGTERM, SIGKILL) → compute mode Default → directories
       removed → record removed

So after a crash at any point, :meth:`MpsDaemons.recover` knows each daemon that may exist. A
daemon still wanted by a prepared claim and running is *adopted* (same pid and start time, so a
reused pid is never mistaken for it); anything else is stopped and its GPU put back. A crash
between spawn and the Running record leaves a process the record has no pid for: it is found by
the marker variable ``DRA_DRIVER_MPS_DAEMON=<pipe dir>`` in its environment. Records of an
earlier boot are dropped without killing anything (pids mean nothing across boots).

Two agents on one node (rolling update) share the records; each daemon's start and stop run
under a file lock, and the caller decides "still wanted?" from the claim checkpoint on disk
under that lock (:meth:`MpsDaemons.release`).

The program is a command prefix: the real ``nvidia-cuda-mps-control`` under the driver root, or
on fake nodes the stand-in :mod:`dra_driver.devices.fake.fakemps`, which speaks the same commands.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Final, Literal

import pydantic
import structlog

from dra_driver.devices import control
from dra_driver.driver import atomicfile, claims, mpsprocess

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
    pid: int | None = None
    startTime: int | None = None  # /proc/<pid>/stat field 22: tells a reused pid apart


@dataclasses.dataclass(frozen=True, slots=True)
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


class MpsDaemons:
    """The daemons under ``root``; methods are safe to call from many threads and processes."""

    def __init__(
        self,
        *,
        root: Path,
        command: Sequence[str],
        gpu_control: control.GpuControl | None,
        boot_id: str,
        log: structlog.typing.FilteringBoundLogger,
        env: Mapping[str, str] | None = None,
        isolate_shm: bool = False,
        ready_timeout_s: float = 15.0,
        stop_timeout_s: float = 10.0,
    ) -> None:
        self.root = root
        self.gpu_control = gpu_control
        self.boot_id = boot_id
        self.log = log
        self.ready_timeout_s = ready_timeout_s
        self.processes = mpsprocess.Processes(
            command=command, env=env, isolate_shm=isolate_shm, stop_timeout_s=stop_timeout_s
        )
        self.records_dir = root / "daemons"
        self.locks_dir = root / "locks"

    # ---- queries -----------------------------------------------------------------------------

    def dirs(self, daemon_id: str) -> Dirs:
        base = self.root / dir_name(daemon_id)
        return Dirs(root=base, pipe=base / "pipe", log=base / "log", shm=base / "shm")

    def records(self) -> dict[str, DaemonRecord]:
        """Every daemon record of this boot on disk, by daemon id (unreadable ones skipped)."""
        found: dict[str, DaemonRecord] = {}
        if not self.records_dir.is_dir():
            return found
        for path in sorted(self.records_dir.glob("*.json")):
            record = self._read(path)
            if record is not None and record.bootId == self.boot_id:
                found[record.id] = record
        return found

    def gpus(self) -> dict[str, str]:
        """GPU/MIG UUID → id of the daemon serving it."""
        return {d.uuid: r.id for r in self.records().values() for d in r.devices}

    def alive(self, record: DaemonRecord) -> bool:
        return record.pid is not None and self.processes.alive(record.pid, record.startTime)

    # ---- start / stop ------------------------------------------------------------------------

    def ensure(
        self,
        daemon_id: str,
        devices: Sequence[DaemonDevice],
        *,
        time_sliced: Collection[str] = (),
        context: str = "",
        restart_only: bool = False,
    ) -> None:
        """Make sure ``daemon_id`` runs for ``devices`` (start it, or keep the running one).

        ``restart_only``: only restart a daemon whose record still exists (supervision must never
        bring back one that was just released). :class:`MpsError` when a device is served by
        another daemon or time-sliced, or the daemon does not come up (then everything it
        changed is undone)."""
        where = f"{context}: " if context else ""
        with self._lock(daemon_id):
            current = self.records().get(daemon_id)
            if current is not None and current.state == "Running" and self.alive(current):
                missing = {d.uuid for d in devices} - {d.uuid for d in current.devices}
                if not missing:
                    return
            if restart_only and (current is None or current.state != "Running"):
                return
            taken = {u: i for u, i in self.gpus().items() if i != daemon_id}
            for dev in devices:
                if dev.uuid in taken:
                    raise MpsError(
                        f"{where}device {dev.name} is already served by MPS control daemon "
                        f"{taken[dev.uuid]}; one GPU can have one MPS daemon only"
                    )
                if dev.uuid in time_sliced:
                    raise MpsError(
                        f"{where}device {dev.name} is time-sliced for another claim; it cannot "
                        "run MPS at the same time"
                    )
            if current is not None:
                self._stop(current)
            try:
                self._start(daemon_id, tuple(devices))
            except (MpsError, OSError, control.ControlError) as exc:
                problem = str(exc)
                leftover = self.records().get(daemon_id)
                if leftover is not None:
                    with contextlib.suppress(MpsError, OSError, control.ControlError):
                        self._stop(leftover)
                raise MpsError(
                    f"{where}cannot start MPS control daemon {daemon_id}: {problem}"
                ) from None

    def release(self, daemon_id: str, *, still_wanted: Callable[[], bool]) -> bool:
        """Stop ``daemon_id`` unless ``still_wanted()`` (asked under the daemon's lock);
        returns whether it was stopped. :class:`MpsError` if stopping fails (record kept)."""
        with self._lock(daemon_id):
            record = self.records().get(daemon_id)
            if record is None or still_wanted():
                return False
            self._stop(record)
            return True

    def recover(self, wanted: Mapping[str, Sequence[DaemonDevice]]) -> list[str]:
        """Start-up: adopt the wanted daemons that run, (re)start the others, stop the rest.

        Returns the problems (also logged); a problem never stops the agent."""
        problems: list[str] = []
        self._drop_other_boots()
        records = self.records()
        for daemon_id, record in records.items():
            if daemon_id in wanted:
                continue
            try:
                with self._lock(daemon_id):
                    self._stop(record)
                self.log.warning("stopped an MPS daemon no prepared claim uses", daemon=daemon_id)
            except (MpsError, OSError, control.ControlError) as exc:
                problems.append(f"MPS daemon {daemon_id}: {exc}")
        for daemon_id, devices in wanted.items():
            found = records.get(daemon_id)
            if (
                found is not None
                and found.state == "Running"
                and self.alive(found)
                and self.dirs(daemon_id).pipe.joinpath("control").exists()
            ):
                self.log.info("adopted a running MPS daemon", daemon=daemon_id, pid=found.pid)
                continue
            try:
                self.ensure(daemon_id, devices, context="recovery")
                self.log.warning("restarted an MPS daemon of a prepared claim", daemon=daemon_id)
            except MpsError as exc:
                problems.append(str(exc))
        self._remove_stray_dirs()
        for problem in problems:
            self.log.error("MPS daemons could not be recovered", problem=problem)
        return problems

    def supervise(self) -> list[str]:
        """Restart daemons that died while still in use; returns their ids."""
        restarted: list[str] = []
        for daemon_id, record in self.records().items():
            if record.state != "Running" or self.alive(record):
                continue
            self.log.error("MPS daemon died; restarting it", daemon=daemon_id, pid=record.pid)
            try:
                self.ensure(daemon_id, record.devices, context="supervision", restart_only=True)
                restarted.append(daemon_id)
            except MpsError as exc:
                self.log.error("cannot restart MPS daemon", daemon=daemon_id, error=str(exc))
        return restarted

    # ---- the steps ---------------------------------------------------------------------------

    def _start(self, daemon_id: str, devices: tuple[DaemonDevice, ...]) -> None:
        if not self.processes.command:
            raise MpsError("nvidia-cuda-mps-control was not found under the driver root")
        record = DaemonRecord(id=daemon_id, bootId=self.boot_id, state="Starting", devices=devices)
        self._write(record)
        for dev in devices:
            if dev.kind == "gpu":
                self._compute_mode(dev.uuid, "ExclusiveProcess")
        dirs = self.dirs(daemon_id)
        for path in (dirs.pipe, dirs.log, dirs.shm):
            path.mkdir(parents=True, exist_ok=True)
        pid = self.processes.spawn(
            pipe=dirs.pipe, log=dirs.log, shm=dirs.shm, visible=[d.uuid for d in devices]
        )
        record = record.model_copy(
            update={"state": "Running", "pid": pid, "startTime": mpsprocess.start_time(pid)}
        )
        self._write(record)
        self._wait_ready(record, dirs)
        self.log.info(
            "started MPS control daemon",
            daemon=daemon_id,
            pid=pid,
            devices=[d.name for d in devices],
            pipe_dir=str(dirs.pipe),
        )

    def _wait_ready(self, record: DaemonRecord, dirs: Dirs) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        control_socket = dirs.pipe / "control"
        while not control_socket.exists():
            if not self.alive(record):
                raise MpsError(f"the daemon exited at start: {self._log_tail(dirs)}")
            if time.monotonic() > deadline:
                raise MpsError(
                    f"no control socket after {self.ready_timeout_s:g}s: {self._log_tail(dirs)}"
                )
            time.sleep(mpsprocess.POLL_S)

    def _stop(self, record: DaemonRecord) -> None:
        if record.state != "Stopping":
            record = record.model_copy(update={"state": "Stopping"})
            self._write(record)
        dirs = self.dirs(record.id)
        pid = record.pid if self.alive(record) else self.processes.find(dirs.pipe)
        if pid is not None:
            self.processes.end(dirs.pipe, pid, record.startTime if pid == record.pid else None)
        problems = []
        for dev in record.devices:
            if dev.kind == "gpu":
                try:
                    self._compute_mode(dev.uuid, "Default")
                except control.ControlError as exc:
                    problems.append(str(exc))
        if problems:
            raise MpsError(
                f"MPS daemon {record.id}: cannot restore the compute mode: {'; '.join(problems)}"
            )
        shutil.rmtree(dirs.root, ignore_errors=True)
        atomicfile.remove(self._path(record.id), durable=False)
        self.log.info("stopped MPS control daemon", daemon=record.id, pid=pid)

    def _compute_mode(self, uuid: str, mode: control.ComputeMode) -> None:
        if self.gpu_control is None:
            raise control.ControlError(f"GPU {uuid}: this plugin runs without GPU control")
        self.gpu_control.set_compute_mode(uuid, mode)

    # ---- files -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _lock(self, daemon_id: str) -> Iterator[None]:
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

    def _path(self, daemon_id: str) -> Path:
        return self.records_dir / f"{dir_name(daemon_id)}.json"

    def _write(self, record: DaemonRecord) -> None:
        self.records_dir.mkdir(parents=True, exist_ok=True)
        atomicfile.write_json(self._path(record.id), record.model_dump(mode="json"), durable=False)

    def _read(self, path: Path) -> DaemonRecord | None:
        try:
            return DaemonRecord.model_validate(json.loads(path.read_bytes()))
        except (OSError, ValueError):
            return None  # start-up (recover) deals with it, once

    def _drop_other_boots(self) -> None:
        """Records of an earlier boot go (nothing of theirs runs); an unreadable record goes
        too, after its daemon, if one runs, is ended (found by its marker)."""
        if not self.records_dir.is_dir():
            return
        atomicfile.remove_stale_temporaries(self.records_dir)
        for path in sorted(self.records_dir.glob("*.json")):
            record = self._read(path)
            if record is None:
                pipe = self.root / path.stem / "pipe"
                pid = self.processes.find(pipe)
                if pid is not None:
                    self.processes.end(pipe, pid, None)
                self.log.error(
                    "unreadable MPS daemon record removed; its daemon is ended, but the compute "
                    "mode of its GPU is unknown and may still be ExclusiveProcess",
                    file=str(path),
                    daemon_pid=pid,
                )
            elif record.bootId == self.boot_id:
                continue
            shutil.rmtree(self.root / path.stem, ignore_errors=True)
            atomicfile.remove(path, durable=False)

    def _remove_stray_dirs(self) -> None:
        """Daemon directories no record names (a crash after the record went)."""
        if not self.root.is_dir():
            return
        known = {dir_name(i) for i in self.records()} | {"daemons", "locks"}
        for entry in self.root.iterdir():
            if entry.is_dir() and entry.name not in known:
                shutil.rmtree(entry, ignore_errors=True)

    def _log_tail(self, dirs: Dirs) -> str:
        try:
            text = (dirs.log / "daemon.out").read_text(errors="replace")
        except OSError:
            text = ""
        return " ".join(text.split())[-300:] or "no output"
