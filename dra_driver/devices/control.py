"""Changing a GPU's scheduling settings: the narrow seam between the driver core and the card.

Discovery only reads; preparing a claim that asks for time-slicing has to *write* two settings
of a full GPU: its compute mode (``Default`` lets every process of the claim's containers open a
context, so the time-slice is what arbitrates between them) and its compute time-slice interval.
The core talks to :class:`GpuControl` only, so the rules for when to apply and restore live in
:mod:`dra_driver.driver.sharing` and never touch NVML or subprocesses.

Two implementations:

* :class:`HostGpuControl` — the real card. The compute mode goes through NVML
  (``nvmlDeviceSetComputeMode``; the NVML module is injected, only ``devices/nvmlapi.py`` imports
  pynvml). NVML has no bare-metal call for the time-slice (its scheduler setters are for vGPU
  hosts), so, as NVIDIA's own DRA driver does, it runs
  ``nvidia-smi compute-policy -i <uuid> --set-timeslice=<0..3>`` from the driver root.
* :class:`FakeGpuControl` — for ``--fake`` nodes and tests: records the settings per GPU (in a
  JSON file when given one, because real GPU settings outlive a plugin restart and crash
  recovery must be observable), answers NotSupported for MIG devices as the card does, and
  takes injected failures.

Every failure is a :class:`ControlError` naming the GPU and the setting.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import threading
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Final, Literal, Protocol

from dra_driver.devices import model, nvml

_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC

ComputeMode = Literal["Default", "ExclusiveProcess", "Prohibited"]
TIMESLICE_DEFAULT: Final = 0
TIMESLICES: Final = (0, 1, 2, 3)  # Default, Short, Medium, Long (nvidia-smi's values)
_NVML_MODES: Final[Mapping[ComputeMode, int]] = {
    "Default": nvml.NVML_COMPUTEMODE_DEFAULT,
    "ExclusiveProcess": nvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS,
    "Prohibited": nvml.NVML_COMPUTEMODE_PROHIBITED,
}
_OUTPUT_TAIL = 400


class ControlError(Exception):
    """A GPU setting could not be changed; the message names the GPU and the setting."""


class NotSupported(ControlError):
    """The device cannot take this setting at all (e.g. a MIG device, an old card)."""


class GpuControl(Protocol):
    """Writes the scheduling settings of one full GPU, addressed by UUID (idempotent calls)."""

    def set_compute_mode(self, uuid: str, mode: ComputeMode) -> None: ...

    def set_timeslice(self, uuid: str, interval: int) -> None:
        """``interval``: 0 Default, 1 Short, 2 Medium, 3 Long."""
        ...


def _check_interval(uuid: str, interval: int) -> None:
    if interval not in TIMESLICES:
        raise ControlError(f"GPU {uuid}: time-slice interval {interval} is not one of 0..3")


class HostGpuControl:
    """The real card: NVML for the compute mode, ``nvidia-smi compute-policy`` for the slice.

    ``nvidia_smi`` is the binary found under ``--driver-root`` (None: time-slicing fails with a
    clear error); ``preload`` the driver's ``libnvidia-ml.so.1`` when the driver root is not
    ``/``, so that nvidia-smi loads the library matching the kernel module.
    """

    def __init__(
        self,
        *,
        nvml_api: nvml.NvmlApi,
        nvidia_smi: Path | None,
        preload: Path | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self._nvml = nvml_api
        self.nvidia_smi = nvidia_smi
        self.preload = preload
        self.timeout_s = timeout_s

    def set_compute_mode(self, uuid: str, mode: ComputeMode) -> None:
        what = f"GPU {uuid}: cannot set compute mode {mode}"
        try:
            self._nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise ControlError(f"{what}: NVML initialisation failed: {exc}") from None
        try:
            handle = self._nvml.nvmlDeviceGetHandleByUUID(uuid)
            self._nvml.nvmlDeviceSetComputeMode(handle, _NVML_MODES[mode])
        except nvml.NVMLError_NotSupported as exc:
            raise NotSupported(f"{what}: not supported by this device ({exc})") from None
        except nvml.NVMLError_NoPermission as exc:
            raise ControlError(f"{what}: {exc} (the plugin must run as root)") from None
        except nvml.NVMLError as exc:
            raise ControlError(f"{what}: {nvml.describe(exc)}") from None
        finally:
            with contextlib.suppress(nvml.NVMLError):
                self._nvml.nvmlShutdown()

    def set_timeslice(self, uuid: str, interval: int) -> None:
        _check_interval(uuid, interval)
        argv = ["compute-policy", "-i", uuid, f"--set-timeslice={interval}"]
        what = f"GPU {uuid}: cannot set the compute time-slice to {interval}"
        if self.nvidia_smi is None:
            raise ControlError(f"{what}: nvidia-smi was not found under the driver root")
        env = dict(os.environ)
        if self.preload is not None:
            env["LD_PRELOAD"] = ":".join(p for p in (str(self.preload), env.get("LD_PRELOAD")) if p)
        command = f"{self.nvidia_smi} {' '.join(argv)}"
        try:
            done = subprocess.run(
                [str(self.nvidia_smi), *argv],
                env=env,
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise ControlError(f"{what}: `{command}` took over {self.timeout_s:g}s") from None
        except OSError as exc:
            raise ControlError(f"{what}: cannot run `{command}`: {exc}") from None
        if done.returncode != 0:
            output = " ".join((done.stdout + done.stderr).split())[-_OUTPUT_TAIL:]
            error = NotSupported if "not supported" in output.lower() else ControlError
            raise error(f"{what}: `{command}` exited {done.returncode}: {output or 'no output'}")


class FakeGpuControl:
    """Settings of a fake node's GPUs, recorded per GPU UUID.

    ``gpus``: UUIDs of full GPUs; ``migs``: UUIDs of MIG devices (NotSupported, as on a card);
    any other UUID is unknown. ``unsupported``: GPUs that lack the feature. ``fail``: an
    exception to raise for ``(uuid, "compute_mode" | "timeslice")``. ``state_file``: where the
    settings persist, so another process (a restarted plugin, a test) sees them.
    """

    def __init__(
        self,
        *,
        gpus: Collection[str],
        migs: Collection[str] = (),
        unsupported: Collection[str] = (),
        state_file: Path | None = None,
    ) -> None:
        self.gpus = frozenset(gpus)
        self.migs = frozenset(migs)
        self.unsupported = frozenset(unsupported)
        self.state_file = state_file
        self.fail: dict[tuple[str, str], Exception] = {}
        self.calls: list[tuple[str, str, object]] = []  # (operation, uuid, value), this process
        self._lock = threading.Lock()
        self._memory: dict[str, dict[str, object]] = {}  # the state when there is no file

    @classmethod
    def for_devices(
        cls, devices: model.NodeDevices, *, state_file: Path | None = None
    ) -> FakeGpuControl:
        return cls(
            gpus=[g.uuid for g in devices.gpus],
            migs=[m.uuid for g in devices.gpus for m in g.mig_devices],
            state_file=state_file,
        )

    def settings(self) -> dict[str, dict[str, object]]:
        """GPU UUID → ``{"computeMode": ..., "timeslice": ...}`` for GPUs ever changed."""
        with self._lock:
            return self._load()

    def set_compute_mode(self, uuid: str, mode: ComputeMode) -> None:
        self._set(uuid, "compute_mode", "computeMode", mode)

    def set_timeslice(self, uuid: str, interval: int) -> None:
        _check_interval(uuid, interval)
        self._set(uuid, "timeslice", "timeslice", interval)

    def _set(self, uuid: str, operation: str, key: str, value: object) -> None:
        what = f"GPU {uuid}: cannot set {key} {value}"
        if uuid in self.migs:
            raise NotSupported(f"{what}: MIG devices have no settings of their own (fake)")
        if uuid not in self.gpus:
            raise ControlError(f"{what}: no GPU with this UUID on this node (fake)")
        if uuid in self.unsupported:
            raise NotSupported(f"{what}: not supported by this GPU (fake)")
        failure = self.fail.get((uuid, operation))
        if failure is not None:
            raise ControlError(f"{what}: {failure}") from failure
        with self._lock, self._file_lock(what):
            state = self._load()
            state.setdefault(uuid, {"computeMode": "Default", "timeslice": TIMESLICE_DEFAULT})
            state[uuid][key] = value
            try:
                self._store(state)
            except OSError as exc:
                raise ControlError(f"{what}: cannot record it in {self.state_file}: {exc}") from exc
            self.calls.append((operation, uuid, value))

    @contextlib.contextmanager
    def _file_lock(self, what: str) -> Iterator[None]:
        """The state file's read-modify-write, exclusive across processes: two agents of one
        node (a seamless upgrade) change settings of different GPUs at the same time."""
        if self.state_file is None:
            yield
            return
        try:
            self.state_file.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.state_file.with_name(f".{self.state_file.name}.lock"), _LOCK_FLAGS)
        except OSError as exc:
            raise ControlError(f"{what}: cannot lock {self.state_file}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _load(self) -> dict[str, dict[str, object]]:
        if self.state_file is None:
            return {uuid: dict(values) for uuid, values in self._memory.items()}
        try:
            data = json.loads(self.state_file.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise ControlError(f"fake GPU state {self.state_file} is unreadable: {exc}") from None
        return data if isinstance(data, dict) else {}

    def _store(self, state: dict[str, dict[str, object]]) -> None:
        if self.state_file is None:
            self._memory = state
            return
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        # A name of this process's own: another process's write never renames it away.
        temporary = self.state_file.with_name(f".{self.state_file.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(state, indent=2, sort_keys=True))
        temporary.replace(self.state_file)
