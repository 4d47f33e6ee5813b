"""GPU control: the real one runs a real nvidia-smi stand-in (a subprocess) and calls NVML
through an injected module; the fake one records per GPU and refuses MIG devices."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest

from dra_driver.devices import control, fake, nvml

GPU = "GPU-8d8a6a3e-5f3b-4c4e-9a53-1d1f0e8b2c01"


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_timeslice_runs_nvidia_smi_compute_policy_with_the_driver_library(tmp_path: Path) -> None:
    log = tmp_path / "args"
    smi = _script(tmp_path / "nvidia-smi", f'echo "$@" > {log}\necho "$LD_PRELOAD" >> {log}\n')
    lib = tmp_path / "libnvidia-ml.so.580.95.05"
    host = control.HostGpuControl(nvml_api=object(), nvidia_smi=smi, preload=lib)
    host.set_timeslice(GPU, 2)
    args, preload = log.read_text().splitlines()
    assert args == f"compute-policy -i {GPU} --set-timeslice=2"
    assert preload.split(":")[0] == str(lib)


@pytest.mark.parametrize(
    ("body", "error", "words"),
    [
        (
            'echo "Setting timeslice is not supported for GPU"; exit 3',
            control.NotSupported,
            "exited 3",
        ),
        ('echo "Insufficient Permissions" >&2; exit 4', control.ControlError, "Permissions"),
        ("exit 9", control.ControlError, "no output"),
    ],
)
def test_nvidia_smi_failures_name_the_gpu_and_the_command(
    tmp_path: Path, body: str, error: type[Exception], words: str
) -> None:
    host = control.HostGpuControl(nvml_api=object(), nvidia_smi=_script(tmp_path / "smi", body))
    with pytest.raises(error, match=words) as caught:
        host.set_timeslice(GPU, 1)
    assert GPU in str(caught.value) and "--set-timeslice=1" in str(caught.value)


def test_missing_slow_or_absent_nvidia_smi_and_bad_intervals(tmp_path: Path) -> None:
    with pytest.raises(control.ControlError, match="nvidia-smi was not found"):
        control.HostGpuControl(nvml_api=object(), nvidia_smi=None).set_timeslice(GPU, 0)
    gone = control.HostGpuControl(nvml_api=object(), nvidia_smi=tmp_path / "nowhere")
    with pytest.raises(control.ControlError, match="cannot run"):
        gone.set_timeslice(GPU, 0)
    slow = control.HostGpuControl(
        nvml_api=object(), nvidia_smi=_script(tmp_path / "slow", "exec sleep 5\n"), timeout_s=0.2
    )
    with pytest.raises(control.ControlError, match=r"took over 0\.2s"):
        slow.set_timeslice(GPU, 0)
    with pytest.raises(control.ControlError, match=r"not one of 0\.\.3"):
        slow.set_timeslice(GPU, 4)


class _Nvml:
    """Just the NVML calls the compute-mode setter makes."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.inits = 0
        self.modes: dict[str, int] = {}

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.inits -= 1

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        return uuid

    def nvmlDeviceSetComputeMode(self, handle: Any, mode: int) -> None:
        if self.error is not None:
            raise self.error
        self.modes[handle] = mode


def test_compute_mode_goes_through_nvml_and_releases_it() -> None:
    api = _Nvml()
    control.HostGpuControl(nvml_api=api, nvidia_smi=None).set_compute_mode(GPU, "Default")
    assert api.modes == {GPU: nvml.NVML_COMPUTEMODE_DEFAULT} and api.inits == 0
    assert (
        nvml.NVML_COMPUTEMODE_DEFAULT,
        nvml.NVML_COMPUTEMODE_PROHIBITED,
        nvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS,
    ) == (0, 2, 3)  # NVML's values, pinned


@pytest.mark.parametrize(
    ("error", "kind", "words"),
    [
        (nvml.NVMLError_NotSupported(), control.NotSupported, "not supported by this device"),
        (nvml.NVMLError_NoPermission(), control.ControlError, "must run as root"),
        (nvml.NVMLError_GpuIsLost(), control.ControlError, "GpuIsLost"),
    ],
)
def test_compute_mode_errors(error: Exception, kind: type[Exception], words: str) -> None:
    api = _Nvml(error)
    with pytest.raises(kind, match=words) as caught:
        control.HostGpuControl(nvml_api=api, nvidia_smi=None).set_compute_mode(GPU, "Default")
    assert GPU in str(caught.value) and api.inits == 0


def test_fake_records_per_gpu_persists_and_refuses_mig_and_unknown(tmp_path: Path) -> None:
    devices = fake.FakeBackend.from_name("a100-mig").discover()
    state = tmp_path / "gpus.json"
    gpu = control.FakeGpuControl.for_devices(devices, state_file=state)
    first, mig = devices.gpus[0].uuid, devices.gpus[0].mig_devices[0].uuid
    gpu.set_timeslice(first, 3)
    gpu.set_compute_mode(first, "Default")
    assert gpu.calls == [("timeslice", first, 3), ("compute_mode", first, "Default")]
    again = control.FakeGpuControl.for_devices(devices, state_file=state)  # another process
    assert again.settings() == {first: {"computeMode": "Default", "timeslice": 3}}
    assert json.loads(state.read_text()) == again.settings()
    with pytest.raises(control.NotSupported, match="MIG"):
        gpu.set_timeslice(mig, 1)
    with pytest.raises(control.ControlError, match="no GPU with this UUID"):
        gpu.set_timeslice(GPU, 1)
    picky = control.FakeGpuControl(gpus=[GPU], unsupported=[GPU])
    with pytest.raises(control.NotSupported, match="not supported"):
        picky.set_compute_mode(GPU, "Default")
    picky = control.FakeGpuControl(gpus=[GPU])
    picky.fail[(GPU, "timeslice")] = RuntimeError("boom")
    with pytest.raises(control.ControlError, match="boom"):
        picky.set_timeslice(GPU, 1)
    picky.set_compute_mode(GPU, "Prohibited")
    assert picky.settings() == {GPU: {"computeMode": "Prohibited", "timeslice": 0}}


def _churn(state_file: str, uuid: str, rounds: int) -> None:
    """In a child process: flip one GPU's compute mode ``rounds`` times."""
    gpu = control.FakeGpuControl(gpus=[uuid], state_file=Path(state_file))
    for i in range(rounds):
        gpu.set_compute_mode(uuid, "ExclusiveProcess" if i % 2 else "Default")
    gpu.set_compute_mode(uuid, "ExclusiveProcess")


def test_two_processes_setting_different_gpus_lose_nothing(tmp_path: Path) -> None:
    """Two agents of one node (a seamless upgrade) share the fake state file: every write is a
    read-modify-write under a file lock, with a temporary name of the writing process."""
    import multiprocessing

    state = tmp_path / "fake-gpu-control.json"
    context = multiprocessing.get_context("fork")
    children = [
        context.Process(target=_churn, args=(str(state), uuid, 200)) for uuid in ("GPU-a", "GPU-b")
    ]
    for child in children:
        child.start()
    for child in children:
        child.join(60)
    assert [c.exitcode for c in children] == [0, 0]
    settings = json.loads(state.read_text())
    assert {u: s["computeMode"] for u, s in settings.items()} == {
        "GPU-a": "ExclusiveProcess",
        "GPU-b": "ExclusiveProcess",
    }
