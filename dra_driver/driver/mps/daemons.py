"""MPS control daemons: started, supervised, adopted and stopped by the node agent.

Why it exists: a GPU shared by several claims (consumable capacity) enforces each share's memory
and compute limits through NVIDIA's Multi-Process Service. One control daemon
(``nvidia-cuda-mps-control -f``) runs per shared GPU, or per claim that asks for MPS on its own
devices; containers reach it through its pipe directory (:mod:`dra_driver.driver.mps.mpsclaims` puts
that into their CDI spec). This module owns the daemons' life: the GPU's compute mode
(``ExclusiveProcess`` while a daemon runs, ``Default`` again after — always set and restored by
the agent, never by the daemon), the pipe, log and shm directories under ``<plugin dir>/mps/``,
and a record of each daemon on disk (:mod:`~dra_driver.driver.mps.mpsrecords`). *What* runs the
daemon is a :class:`~dra_driver.driver.mps.mpsrunner.DaemonRunner`: a process of the agent
(:mod:`~.mpsprocess`) or a Pod of its own (:mod:`~.mpspod`).

Crash safety. Every daemon has a record written *before* anything is changed and removed
*after* everything is undone:

start: record Starting (naming the Pod, with the Pod runner) → compute mode ExclusiveProcess →
       directories → process spawned / Pod created → record Running (pid and start time / Pod
       UID) → wait until the daemon answers on its ``control`` socket (the Pod is Ready)
stop:  record Stopping → ``quit`` (then SIGTERM, SIGKILL / the Pod deleted, by UID, and gone)
       → compute mode Default → directories removed → record removed

So after a crash at any point, :meth:`MpsDaemons.recover` knows each daemon that may exist. A
daemon still wanted by a prepared claim and running is *adopted* (same pid and start time, so a
reused pid is never mistaken for it; the same Pod UID); anything else is stopped and its GPU
put back. A crash between the start and the Running record leaves a daemon the record has no
pid or UID for: a process is found by the marker ``DRA_DRIVER_MPS_DAEMON=<pipe dir>`` in its
environment, a Pod by the name the record already holds. Pods of this node that no record names
at all are ended, and their GPUs put back. Records of an earlier boot are dropped without
killing anything (pids mean nothing across boots; their Pods are such strays).

Two agents on one node (rolling update) share the records; each daemon's start and stop run
under a file lock, and the caller decides "still wanted?" from the claim checkpoint on disk
under that lock (:meth:`MpsDaemons.release`). Pods add the API server's own locks: a Pod name
exists once (a second create gets AlreadyExists), and deletes carry the UID seen.

The program is a command prefix: the real ``nvidia-cuda-mps-control`` under the driver root, or
on fake nodes the stand-in :mod:`dra_driver.devices.fake.fakemps`, which speaks the same commands.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dra_driver.devices import control
from dra_driver.driver.mps import mpsprocess
from dra_driver.driver.mps.mpsrecords import (
    RECORD_KIND,
    DaemonDevice,
    DaemonRecord,
    Dirs,
    MpsError,
    State,
    dir_name,
)
from dra_driver.driver.mps.mpsrunner import Launch, Stray
from dra_driver.driver.mps.mpssteps import Clients, DaemonSteps, MpsMetrics

__all__ = [
    "RECORD_KIND",
    "DaemonDevice",
    "DaemonRecord",
    "Dirs",
    "MpsDaemons",
    "MpsError",
    "MpsMetrics",
    "State",
    "dir_name",
]


class MpsDaemons(DaemonSteps):
    """The daemons under ``root``: the steps of :class:`~.mpssteps.DaemonSteps`, and start-up
    recovery; methods are safe to call from many threads and processes."""

    def recover(
        self, wanted: Mapping[str, Sequence[DaemonDevice]], *, clients: Clients | None = None
    ) -> list[str]:
        """Start-up: adopt the wanted daemons that run, (re)start the others, stop the rest,
        and end daemons no record names. ``clients``: who used a daemon (lost if it must be
        restarted). Returns the problems (also logged); a problem never stops the agent."""
        problems: list[str] = []
        self._drop_other_boots()
        records = self.records()
        for daemon_id, record in records.items():
            if daemon_id in wanted:
                continue
            try:
                with self.files.lock(daemon_id):
                    self._stop(record)
                self.log.warning("stopped an MPS daemon no prepared claim uses", daemon=daemon_id)
            except (MpsError, OSError, control.ControlError) as exc:
                problems.append(f"MPS daemon {daemon_id}: {exc}")
        for daemon_id, devices in wanted.items():
            found = records.get(daemon_id)
            try:
                if found is not None and self._adopt(found):
                    continue
                self.ensure(daemon_id, devices, context="recovery")
                lost = list(clients(daemon_id)) if clients else []
                self.log.warning(
                    "restarted an MPS daemon of a prepared claim",
                    daemon=daemon_id,
                    runner=self.runner.kind,
                    lost_clients=len(lost),
                    claims=lost,
                )
                self.count_restart("gone-at-start", len(lost))
            except MpsError as exc:
                problems.append(str(exc))
        problems += self.end_strays()
        self.files.remove_stray_dirs()
        for problem in problems:
            self.log.error("MPS daemons could not be recovered", problem=problem)
        return problems

    def end_strays(self) -> list[str]:
        """End daemons of this node that no record names (their GPUs go back to compute mode
        Default unless another daemon serves them); returns the problems."""
        problems: list[str] = []
        try:
            strays = self.runner.strays(self.records())
        except MpsError as exc:
            return [str(exc)]
        for stray in strays:
            with self.files.lock(stray.daemon_id):
                if self._named(stray):
                    continue  # started meanwhile, under its record
                try:
                    self.runner.end_stray(stray)
                    served = self.gpus()
                    for dev in stray.devices:
                        if dev.kind == "gpu" and dev.uuid not in served:
                            self._compute_mode(dev.uuid, "Default")
                except (MpsError, control.ControlError) as exc:
                    problems.append(f"MPS daemon {stray.name}: {exc}")
                    continue
            self.log.warning(
                "ended an MPS daemon no record names",
                daemon=stray.daemon_id,
                name=stray.name,
                uid=stray.uid,
                devices=[d.name for d in stray.devices],
            )
        return problems

    def _adopt(self, record: DaemonRecord) -> bool:
        """At start-up: whether ``record``'s daemon runs and answers (then it is kept)."""
        runner = self._runner(record)
        if record.state != "Running":
            return False
        alive = runner.liveness(record).alive
        if alive is None:
            self.log.warning(
                "cannot tell whether an MPS daemon runs; keeping it, supervision looks again",
                daemon=record.id,
                **runner.describe(record),
            )
            return True
        if not alive:
            return False
        launch = Launch(daemon_id=record.id, devices=record.devices, dirs=self.dirs(record.id))
        try:
            runner.wait_ready(launch, record)
        except MpsError as exc:
            self.log.warning(
                "a running MPS daemon does not answer", daemon=record.id, error=str(exc)
            )
            return False
        self.log.info(
            "adopted a running MPS daemon",
            daemon=record.id,
            runner=runner.kind,
            **runner.describe(record),
        )
        return True

    def _named(self, stray: Stray) -> bool:
        record = self.files.get(stray.daemon_id)
        return record is not None and record.pod == stray.name

    def _drop_other_boots(self) -> None:
        """Records of an earlier boot go (nothing of theirs runs); an unreadable record goes
        too, after its daemon, if one runs, is ended (a process found by its marker; a Pod is
        a stray once its record is gone)."""
        for path, record in self.files.files():
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
            self.files.remove_file(path)

    def _log_tail(self, dirs: Dirs) -> str:
        return mpsprocess.log_tail(dirs)
