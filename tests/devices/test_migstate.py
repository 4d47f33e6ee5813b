"""The fake MIG state: its file format, strict reading, copies, and a fake backend without
pydantic (a real agent does not load it; the fake ones must not either, or the fleet benchmark
overstates an agent's memory)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dra_driver.devices.fake import migstate

GPU = "GPU-0"


def _state() -> dict[str, migstate.GpuMig]:
    ci = migstate.ComputeInstance(id=0, profileId=1, slices=2, uuid="MIG-1")
    gi = migstate.GpuInstance(
        id=1, profileId=14, slot=1, name="2g.20gb", start=0, size=2, computeInstances=[ci]
    )
    return {GPU: migstate.GpuMig(mode=1, pending=1, instances=[gi])}


def test_the_state_file_is_written_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "mig.json"
    state = migstate.MigState(_state())
    state.use_file(path)
    state.add_process(GPU, 42, gpu_instance=1, used_bytes=1 << 20)
    text = path.read_text()
    assert text.startswith('{\n "version": 1,\n "kind": "FakeMigState",\n "gpus": {\n')
    assert json.loads(text)["gpus"][GPU] == {
        "mode": 1,
        "pending": 1,
        "instances": [
            {
                "id": 1,
                "profileId": 14,
                "slot": 1,
                "name": "2g.20gb",
                "start": 0,
                "size": 2,
                "computeInstances": [{"id": 0, "profileId": 1, "slices": 2, "uuid": "MIG-1"}],
            }
        ],
        "processes": [
            {"pid": 42, "usedGpuMemory": 1 << 20, "gpuInstanceId": 1, "computeInstanceId": 0}
        ],
    }
    again = migstate.MigState({}, state_file=path).read()  # another process, say
    process = migstate.Process(pid=42, usedGpuMemory=1 << 20, gpuInstanceId=1, computeInstanceId=0)
    assert again[GPU].processes == [process]
    assert again[GPU].instances == _state()[GPU].instances


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        pytest.param("{not json", "Expecting property name", id="not-json"),
        pytest.param(
            '{"gpus": {}, "kind": "MigState"}',
            "kind: must be one of 'FakeMigState', got a string 'MigState'",
            id="kind",
        ),
        pytest.param(
            '{"gpus": {"GPU-0": {"mode": 1, "pending": 1, "colour": 2}}}',
            "gpus.GPU-0.colour: unknown field (accepted: mode, pending, instances, processes)",
            id="unknown-field",
        ),
        pytest.param(
            '{"gpus": {"GPU-0": {"mode": 1, "pending": true}}}',
            "gpus.GPU-0.pending: expected an integer, got a boolean True",
            id="wrong-type",
        ),
        pytest.param('{"version": 1}', "gpus: required field missing", id="required"),
    ],
)
def test_an_unreadable_state_file_is_named_with_the_reason(
    tmp_path: Path, content: str, reason: str
) -> None:
    path = tmp_path / "mig.json"
    path.write_text(content)
    with pytest.raises(migstate.MigStateError) as info:
        migstate.MigState({}, state_file=path).read()
    assert str(info.value).startswith(f"fake MIG state {path} is unreadable: ")
    assert reason in str(info.value)


@pytest.mark.parametrize("use_file", [False, True])
def test_reads_are_copies_and_a_failed_edit_changes_nothing(tmp_path: Path, use_file: bool) -> None:
    state = migstate.MigState(_state())
    if use_file:
        state.use_file(tmp_path / "mig.json")
    state.read()[GPU].instances.clear()
    with pytest.raises(RuntimeError), state.edit() as editing:
        editing[GPU].mode = 0
        raise RuntimeError("half-way")
    assert state.read() == _state()
    with state.edit() as editing:
        editing[GPU].pending = 0
    assert state.read()[GPU].pending == 0


def test_the_fake_backend_does_not_load_pydantic(tmp_path: Path) -> None:
    state_file = tmp_path / "mig.json"
    script = textwrap.dedent(f"""
        import ctypes
        import sys
        from pathlib import Path
        from dra_driver.devices import fake, nvml
        from dra_driver.devices.fake import fakenvml, migstate, profiles

        devices = fake.FakeBackend.from_name("dgx-h100").discover()
        assert len(devices.gpus) == 8
        fake.FakeBackend.from_name("a100-mig").discover()
        api = fakenvml.FakeNvml(profiles.load_builtin("h100-mig"),
                                mig_state_file=Path({str(state_file)!r}))
        api.nvmlInit()
        handle = api.nvmlDeviceGetHandleByIndex(1)
        info = api.nvmlDeviceGetGpuInstanceProfileInfo(handle, 0)  # 1 slice
        place = nvml.c_nvmlGpuInstancePlacement_t(start=0, size=1)
        api.nvmlDeviceCreateGpuInstanceWithPlacement(handle, info.id, ctypes.pointer(place))
        found = migstate.MigState({{}}, state_file=Path({str(state_file)!r})).read()
        assert sum(len(g.instances) for g in found.values()) == 1, found
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("pydantic", "pydantic_core"))
        print(loaded)
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
