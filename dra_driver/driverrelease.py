"""Releasing NVML for a real driver upgrade: the node agent lets go of every NVML initialisation it
holds, so ``rmmod nvidia`` can succeed, without being drained or stopped.

Why it exists: ``nvmlInit`` opens ``/dev/nvidiactl`` and ``/dev/nvidia*``, and an open device file
keeps the kernel module in use. The agent holds three initialisations (its backend's, taken at
discovery; the driver watch's; the health watcher's) and its GPU metrics sampler calls NVML, so on
a GPU node the unload of an upgrade fails while the agent runs, whatever
:mod:`dra_driver.driverwatch` does once the driver is gone. A release, asked on the health
socket (``{"op": "nvml-release"}``, what ``dra-driver nvml-release`` sends; a driver manager's
pre-unload hook can run it), makes the agent, in the driver watch's own thread:

* enter the outage state with the reason :data:`~dra_driver.driverwatch.RELEASED`: the GPUs get
  the ``<driver>/driver-unavailable=released:NoSchedule`` taint (or are withdrawn where taints
  are dropped), ``/readyz`` says why under ``nvidia_driver``, prepares of new claims get the
  outage's retryable error, the kubelet's health stream says Unknown;
* stop the health watcher and pause the metrics sampler (the outage's own reactions,
  :mod:`dra_driver.lifecycleparts`), and call ``nvmlShutdown`` once for each ``nvmlInit`` it
  made: the watch's and the backend's (:class:`BackendHold`, once for the agent's lifetime).
  Nothing a running container uses is touched: its device nodes are its own.

While released the agent never calls ``nvmlInit`` (that would reopen the device files and block
the unload). It reads the kernel module's version file (``/proc/driver/nvidia/version``, under
``--nvidia-proc-dir``), which opens no device file, at the watch's poll, and resumes when the
module was unloaded and is back, when the version changed, when ``--nvml-release-deadline``
passes, or when asked (``{"op": "nvml-resume"}``). Resuming is the driver watch's normal return
path: ``nvmlInit``, rediscovery, republish of what changed (the new ``driverVersion``).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import prometheus_client as prom
import structlog

from dra_driver import driverwatch

DEFAULT_PROC_DIR = Path("/proc/driver/nvidia")
DEFAULT_DEADLINE_S = 900.0
RELEASE_WAIT_S = 8.0  # the socket's caller waits this long for the watch thread's answer
RELEASED_MESSAGE = (
    "NVML released for a driver upgrade: this agent holds no NVIDIA device file; GPUs are "
    "unschedulable until the driver is loaded again"
)


class ReleaseRequested(Exception):
    """What the driver watch's outage is entered with (its text is the outage's message)."""


class VersionFile:
    """The NVIDIA kernel module's version file: its text while the module is loaded, None when
    it is not (a plain file read; no device file is opened, no NVML call made)."""

    def __init__(self, proc_dir: Path) -> None:
        self.path = proc_dir / "version"

    def read(self) -> str | None:
        try:
            return self.path.read_text(errors="replace").strip()
        except OSError:
            return None


@dataclasses.dataclass
class Released:
    """A release in progress: when to resume (see :meth:`resume_reason`)."""

    at_release: str | None  # the version file then (None: not readable)
    due: float  # the deadline (monotonic)
    seen_gone: bool = False

    def resume_reason(self, version: str | None, now: float) -> str | None:
        """Why to initialise NVML again now (``version``: the version file's text, None when
        the module is not loaded), or None to stay released."""
        if version is None:
            self.seen_gone = True
        elif self.seen_gone or self.at_release is None:
            return "the NVIDIA kernel module is loaded again"
        elif version != self.at_release:
            return "the NVIDIA driver version changed"
        if now >= self.due:
            return "the release deadline passed"
        return None


class BackendHold:
    """The ``nvmlInit`` the device backend took at discovery: shut down once, at the first
    release (the driver watch's own initialisation serves discovery afterwards)."""

    def __init__(self, backend: Any) -> None:
        close = getattr(backend, "close", None)
        self._close: Callable[[], None] | None = close if callable(close) else None

    @property
    def held(self) -> bool:
        return self._close is not None

    def release(self) -> None:
        close, self._close = self._close, None
        if close is not None:
            close()


class ReleasableWatch(driverwatch.DriverWatch):
    """A :class:`~dra_driver.driverwatch.DriverWatch` whose turns a :class:`Release` may take."""

    def __init__(self, *, release: Release, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.release = release

    def step(self) -> None:
        if not self.release.turn(self):
            super().step()

    def wake(self) -> None:
        self._wake.set()

    def enter_released(self, message: str) -> None:
        self._enter(ReleaseRequested(message), reason=driverwatch.RELEASED)

    def resume(self) -> None:
        self._try_return()  # nvmlInit; failing, the outage goes on as a plain one, with backoff


class Release:
    """The release machinery of one agent; :meth:`make_watch` builds its driver watch."""

    def __init__(
        self,
        *,
        proc_dir: Path,
        deadline_s: float,
        backend: Any,
        log: structlog.typing.FilteringBoundLogger,
        registry: prom.CollectorRegistry,
        fake: Any = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if fake is not None:  # the stand-in keeps its version file there, as the kernel does
            fake.use_proc_dir(proc_dir)
        self.version_file = VersionFile(proc_dir)
        self.deadline_s = deadline_s
        self.backend = BackendHold(backend)
        self.log = log
        self._clock = clock
        self._asked = threading.Event()
        self._done = threading.Event()
        self._resume = threading.Event()
        self.state: Released | None = None
        self.watch: ReleasableWatch | None = None
        self.gauge = prom.Gauge(
            "dra_driver_nvml_released",
            "1 while the agent has released NVML for a driver upgrade (nvml-release), else 0",
            registry=registry,
        )

    def make_watch(self, **kwargs: Any) -> ReleasableWatch:
        self.watch = ReleasableWatch(release=self, **kwargs)
        return self.watch

    # --- the health socket's side ------------------------------------------------------------
    def handle(self, req: Mapping[str, Any]) -> dict[str, Any]:
        """``{"op": "nvml-release"}`` / ``{"op": "nvml-resume"}``."""
        watch = self.watch
        if watch is None:
            return {"ok": False, "error": "this node agent does not use NVML: nothing to release"}
        if req.get("op") == "nvml-resume":
            if self.state is None:
                return {"ok": True, "released": False, "message": "NVML is not released"}
            self._resume.set()
            watch.wake()
            return {"ok": True, "released": False, "message": "resuming: NVML is initialised again"}
        if self.state is None:
            self._done.clear()
            self._asked.set()
            watch.wake()
            if not self._done.wait(RELEASE_WAIT_S):
                return {"ok": False, "error": "the driver watch did not release NVML in time"}
        return {
            "ok": True,
            "released": True,
            "message": f"{RELEASED_MESSAGE}. Unload the NVIDIA kernel module now: the agent "
            f"resumes when it is loaded again, {self.deadline_s:g} s after the release at the "
            "latest, or at `dra-driver nvml-release --resume`",
        }

    # --- the driver watch's thread -----------------------------------------------------------
    def turn(self, watch: ReleasableWatch) -> bool:
        """Take the watch's turn while a release is asked or in progress (True: taken)."""
        if self._asked.is_set():
            self._asked.clear()
            try:
                self._release(watch)
            finally:
                self._done.set()
            return True
        state = self.state
        if state is None:
            return False
        if self._resume.is_set():
            reason: str | None = "asked (nvml-resume)"
        else:
            reason = state.resume_reason(self.version_file.read(), self._clock())
        if reason is None:
            return True  # no nvmlInit while released
        self._resume.clear()
        self.state = None
        self.gauge.set(0)
        self.log.info("NVML release over; initialising NVML again", reason=reason)
        watch.resume()
        return True

    def _release(self, watch: ReleasableWatch) -> None:
        watch.enter_released(RELEASED_MESSAGE)  # taints, the watch's nvmlShutdown, callbacks
        self.backend.release()
        version = self.version_file.read()
        self.state = Released(at_release=version, due=self._clock() + self.deadline_s)
        self.gauge.set(1)
        self.log.warning(
            "NVML released for a driver upgrade; GPUs unschedulable until the driver is back",
            version_file=str(self.version_file.path),
            driver=version or "(version file not readable: resume at the deadline or when asked)",
            deadline_s=self.deadline_s,
        )
