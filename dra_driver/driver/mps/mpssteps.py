"""The steps of one MPS control daemon's life, under its lock: start, stop, keep, restart.

Why its own module: :class:`~.daemons.MpsDaemons` is the daemons' public face and
adds start-up recovery (adopting, stopping, ending strays); this is the part every running agent
uses all the time — the ordered start and stop steps whose crash safety :mod:`.mps` argues
(record first, compute mode, directories, the runner; the reverse to stop), joining a running
daemon, releasing an unused one, and supervision (restarting a daemon that died while in use,
logging and counting the clients that lost it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Protocol

import structlog

from dra_driver.devices import control
from dra_driver.driver.mps import mpsprocess
from dra_driver.driver.mps.mpsrecords import (
    DaemonDevice,
    DaemonRecord,
    Dirs,
    MpsError,
    Records,
)
from dra_driver.driver.mps.mpsrunner import DaemonRunner, Launch, Liveness

# Who uses a daemon (claim UIDs): its clients, lost when it dies.
Clients = Callable[[str], Sequence[str]]


class MpsMetrics(Protocol):
    def mps_daemon_restarted(self, *, runner: str, reason: str, lost_clients: int) -> None: ...


class DaemonSteps:
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
        runner: Callable[[mpsprocess.Processes], DaemonRunner] | None = None,
        metrics: MpsMetrics | None = None,
    ) -> None:
        """``runner``: builds the runner new daemons start with from the program's processes
        (default: :class:`~dra_driver.driver.mps.mpsprocess.ProcessRunner`); records a process made
        stay with a process runner. ``metrics`` counts restarts and the clients they cost."""
        self.root = root
        self.gpu_control = gpu_control
        self.boot_id = boot_id
        self.log = log
        self.metrics = metrics
        self.processes = mpsprocess.Processes(
            command=command, env=env, isolate_shm=isolate_shm, stop_timeout_s=stop_timeout_s
        )
        self.files = Records(root=root, boot_id=boot_id)
        self.process_runner = mpsprocess.ProcessRunner(
            self.processes, ready_timeout_s=ready_timeout_s
        )
        self.runner: DaemonRunner = (
            runner(self.processes) if runner is not None else self.process_runner
        )
        self.records_dir = self.files.records_dir
        self.locks_dir = self.files.locks_dir

    # ---- queries -----------------------------------------------------------------------------

    def dirs(self, daemon_id: str) -> Dirs:
        return self.files.dirs(daemon_id)

    def records(self) -> dict[str, DaemonRecord]:
        """Every daemon record of this boot on disk, by daemon id (unreadable ones skipped)."""
        return self.files.all()

    def gpus(self) -> dict[str, str]:
        """GPU/MIG UUID → id of the daemon serving it."""
        return self.files.gpus()

    def alive(self, record: DaemonRecord) -> bool:
        return self.liveness(record).alive is True

    def liveness(self, record: DaemonRecord) -> Liveness:
        return self._runner(record).liveness(record)

    # ---- start / stop ------------------------------------------------------------------------

    def ensure(
        self,
        daemon_id: str,
        devices: Sequence[DaemonDevice],
        *,
        time_sliced: Collection[str] = (),
        context: str = "",
        restart_only: bool = False,
        only_if: Callable[[], bool] | None = None,
    ) -> bool:
        """Make sure ``daemon_id`` runs for ``devices`` (start it, or keep the running one);
        whether it was started.

        ``restart_only``: only restart a daemon whose record still exists (supervision must never
        bring back one that was just released); ``only_if``: start only if this still holds,
        asked under the daemon's lock. :class:`MpsError` when a device is served by another
        daemon or time-sliced, or the daemon does not come up (then everything it changed is
        undone). A running daemon whose runner cannot tell right now (the API server is
        unreachable) is kept: supervision looks again."""
        where = f"{context}: " if context else ""
        with self.files.lock(daemon_id):
            current = self.files.get(daemon_id)
            if current is not None and current.state == "Running":
                alive = self.liveness(current).alive
                missing = {d.uuid for d in devices} - {d.uuid for d in current.devices}
                if alive is not False and not missing:
                    return False
            if restart_only and (current is None or current.state != "Running"):
                return False
            if only_if is not None and not only_if():
                return False
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
                leftover = self.files.get(daemon_id)
                if leftover is not None:
                    with contextlib.suppress(MpsError, OSError, control.ControlError):
                        self._stop(leftover)
                raise MpsError(
                    f"{where}cannot start MPS control daemon {daemon_id}: {problem}"
                ) from None
            return True

    def release(self, daemon_id: str, *, still_wanted: Callable[[], bool]) -> bool:
        """Stop ``daemon_id`` unless ``still_wanted()`` (asked under the daemon's lock);
        returns whether it was stopped. :class:`MpsError` if stopping fails (record kept)."""
        with self.files.lock(daemon_id):
            record = self.files.get(daemon_id)
            if record is None or still_wanted():
                return False
            self._stop(record)
            return True

    def supervise(self, *, clients: Clients | None = None) -> list[str]:
        """Restart daemons that died while still in use (their ``clients`` lost their MPS
        server: logged and counted); returns their ids."""
        restarted: list[str] = []
        for daemon_id, record in self.records().items():
            if record.state != "Running":
                continue
            try:
                runner = self._runner(record)
            except MpsError as exc:
                self.log.error("cannot supervise MPS daemon", daemon=daemon_id, error=str(exc))
                continue
            found = runner.liveness(record)
            if found.alive is not False:
                continue
            lost = list(clients(daemon_id)) if clients else []
            self.log.error(
                "MPS daemon died; restarting it",
                daemon=daemon_id,
                runner=runner.kind,
                reason=found.reason,
                detail=found.detail,
                lost_clients=len(lost),
                claims=lost,
                **runner.describe(record),
            )
            self.count_restart(found.reason or "exited", len(lost), runner=runner.kind)
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
        launch = Launch(daemon_id=daemon_id, devices=devices, dirs=self.dirs(daemon_id))
        record = self.runner.intent(
            DaemonRecord(id=daemon_id, bootId=self.boot_id, state="Starting", devices=devices)
        )
        self.files.write(record)
        for dev in devices:
            if dev.kind == "gpu":
                self._compute_mode(dev.uuid, "ExclusiveProcess")
        for path in (launch.dirs.pipe, launch.dirs.log, launch.dirs.shm):
            path.mkdir(parents=True, exist_ok=True)
        record = self.runner.start(launch, record)
        self.files.write(record)
        self.runner.wait_ready(launch, record)
        self.log.info(
            "started MPS control daemon",
            daemon=daemon_id,
            runner=self.runner.kind,
            devices=[d.name for d in devices],
            pipe_dir=str(launch.dirs.pipe),
            **self.runner.describe(record),
        )

    def _stop(self, record: DaemonRecord) -> None:
        if record.state != "Stopping":
            record = record.model_copy(update={"state": "Stopping"})
            self.files.write(record)
        dirs = self.dirs(record.id)
        runner = self._runner(record)
        runner.stop(record, dirs)
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
        self.files.remove(record.id)
        self.log.info(
            "stopped MPS control daemon",
            daemon=record.id,
            runner=runner.kind,
            **runner.describe(record),
        )

    def _runner(self, record: DaemonRecord) -> DaemonRunner:
        """The runner of ``record``: a Pod's is the Pod runner, a process's the process one."""
        if record.pod is not None and self.runner.kind == "pod":
            return self.runner
        if record.pod is not None:
            raise MpsError(
                f"MPS daemon {record.id} runs in Pod {record.pod}, but this agent runs its "
                "daemons as processes (no --mps-daemon-image): it cannot manage that Pod"
            )
        return self.process_runner

    def _compute_mode(self, uuid: str, mode: control.ComputeMode) -> None:
        if self.gpu_control is None:
            raise control.ControlError(f"GPU {uuid}: this plugin runs without GPU control")
        self.gpu_control.set_compute_mode(uuid, mode)

    def count_restart(self, reason: str, lost: int, *, runner: str | None = None) -> None:
        """Count a daemon restarted while ``lost`` claims used it (default: this runner's)."""
        if self.metrics is not None:
            kind = runner or self.runner.kind
            self.metrics.mps_daemon_restarted(runner=kind, reason=reason, lost_clients=lost)
