"""The NVML stand-in's MIG model: real profile tables, pynvml's structs and errors, instances
that outlive the process, and the driver's MIG control running over it."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import pynvml  # only to pin the stand-in's types and values to the binding
import pytest

from dra_driver.devices import fake, migcontrol, migprofiles, model, nvml
from dra_driver.devices.fake import fakenvml, profiles
from dra_driver.slices import migslices

H100 = [
    # name, id, slot, slices, instances, MiB, SMs, placements
    ("1g.10gb", 19, 0, 1, 7, 9984, 16, [(s, 1) for s in range(7)]),
    ("2g.20gb", 14, 1, 2, 3, 20096, 32, [(0, 2), (2, 2), (4, 2)]),
    ("3g.40gb", 9, 2, 3, 2, 40448, 60, [(0, 4), (4, 4)]),
    ("4g.40gb", 5, 3, 4, 1, 40448, 64, [(0, 4)]),
    ("7g.80gb", 0, 4, 7, 1, 81152, 132, [(0, 8)]),
    ("1g.10gb+me", 20, 7, 1, 1, 9984, 16, [(s, 1) for s in range(7)]),
    ("1g.20gb", 15, 9, 1, 4, 20096, 26, [(0, 2), (2, 2), (4, 2), (6, 2)]),
]


def _nvml(profile: str = "h100-mig", state_file: Path | None = None) -> fakenvml.FakeNvml:
    api = fakenvml.FakeNvml(profiles.load_builtin(profile), mig_state_file=state_file)
    api.nvmlInit()
    return api


def _place(api: Any, handle: Any, profile_id: int, start: int, size: int) -> Any:
    wanted = nvml.c_nvmlGpuInstancePlacement_t(start=start, size=size)
    return api.nvmlDeviceCreateGpuInstanceWithPlacement(handle, profile_id, ctypes.pointer(wanted))


def test_discovery_reads_the_h100_table_whatever_the_mig_mode() -> None:
    devices = fake.FakeBackend.from_name("h100-mig").discover()
    off, on = devices.gpus
    assert (off.mig_enabled, on.mig_enabled) == (False, True)
    for gpu in devices.gpus:
        got = [
            (p.name, p.id, p.slot, p.slices, p.instances, p.memory_bytes >> 20,
             p.multiprocessors, list(p.placements))
            for p in gpu.mig_profiles
        ]  # fmt: skip
        assert got == H100
        assert migprofiles.memory_slices(gpu) == 8 and migprofiles.compute_slices(gpu) == 7


def test_structs_handles_and_errors_are_pynvmls() -> None:
    api = _nvml()
    handle = api.nvmlDeviceGetHandleByIndex(1)  # MIG mode on, no instances
    info = api.nvmlDeviceGetGpuInstanceProfileInfo(handle, pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE)
    assert isinstance(info, pynvml.c_nvmlGpuInstanceProfileInfo_v2_t) and info.name == "MIG 3g.40gb"
    assert isinstance(
        api.nvmlDeviceGetGpuInstanceProfileInfo(handle, 2, version=1),
        pynvml.c_nvmlGpuInstanceProfileInfo_t,
    )
    with pytest.raises(pynvml.NVMLError_NotSupported):  # no 8-slice profile on an H100
        api.nvmlDeviceGetGpuInstanceProfileInfo(handle, pynvml.NVML_GPU_INSTANCE_PROFILE_8_SLICE)
    gi = _place(api, handle, 9, 4, 4)
    assert isinstance(gi, pynvml.c_nvmlGpuInstance_t)
    with pytest.raises(pynvml.NVMLError_InsufficientResources):  # overlaps memory slice 4
        _place(api, handle, 19, 4, 1)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # not a placement of 3g.40gb
        _place(api, handle, 9, 2, 4)
    _place(api, handle, 20, 0, 1)  # 1g.10gb+me: one instance at most
    with pytest.raises(pynvml.NVMLError_InsufficientResources):
        _place(api, handle, 20, 1, 1)
    ci_info = api.nvmlGpuInstanceGetComputeInstanceProfileInfo(
        gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE, 0
    )
    assert isinstance(ci_info, pynvml.c_nvmlComputeInstanceProfileInfo_v2_t)
    assert (ci_info.sliceCount, ci_info.multiprocessorCount) == (3, 60)
    ci = api.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
    assert isinstance(ci, pynvml.c_nvmlComputeInstance_t)
    assert isinstance(api.nvmlComputeInstanceGetInfo(ci), pynvml.c_nvmlComputeInstanceInfo_t)
    with pytest.raises(pynvml.NVMLError_InUse):  # a compute instance is still in it
        api.nvmlGpuInstanceDestroy(gi)
    array = (pynvml.c_nvmlGpuInstance_t * 2)()
    count = ctypes.c_uint(0)
    api.nvmlDeviceGetGpuInstances(handle, 9, array, ctypes.pointer(count))
    assert count.value == 1 and api.nvmlGpuInstanceGetInfo(array[0]).placement.start == 4
    api.nvmlComputeInstanceDestroy(ci)
    api.nvmlGpuInstanceDestroy(gi)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # the handle is stale now
        api.nvmlGpuInstanceGetInfo(gi)
    off = api.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):  # MIG mode is off
        _place(api, off, 19, 0, 1)


def test_mig_mode_needs_an_idle_gpu_and_processes_are_friendly_objects() -> None:
    api = _nvml()
    handle = api.nvmlDeviceGetHandleByIndex(0)
    uuid = api.nvmlDeviceGetUUID(handle)
    api.mig_state.add_process(uuid, 4242, used_bytes=1 << 30)
    [proc] = api.nvmlDeviceGetComputeRunningProcesses(handle)
    assert isinstance(proc, pynvml.nvmlFriendlyObject)
    assert (proc.pid, proc.usedGpuMemory, proc.gpuInstanceId) == (4242, 1 << 30, 0xFFFFFFFF)
    status = api.nvmlDeviceSetMigMode(handle, pynvml.NVML_DEVICE_MIG_ENABLE)
    assert status == pynvml.NVML_ERROR_IN_USE
    assert api.nvmlDeviceGetMigMode(handle) == [0, 1]  # enable pending
    api.mig_state.end_process(uuid, 4242)
    assert api.nvmlDeviceSetMigMode(handle, pynvml.NVML_DEVICE_MIG_ENABLE) == pynvml.NVML_SUCCESS
    assert api.nvmlDeviceGetMigMode(handle) == [1, 1]


def test_instances_outlive_the_stand_in_through_its_state_file(tmp_path: Path) -> None:
    state = tmp_path / "mig.json"
    first = _nvml(state_file=state)
    handle = first.nvmlDeviceGetHandleByIndex(1)
    control = migcontrol.NvmlMigControl(nvml_api=first)
    profile = next(
        p
        for p in fake.FakeBackend.from_name("h100-mig").discover().gpus[1].mig_profiles
        if p.name == "2g.20gb"
    )
    gpu1 = first.nvmlDeviceGetUUID(handle)
    made = control.create(migcontrol.Placement(gpu1, "2g.20gb", profile.id, profile.slot, 2, 2))
    backend = fake.FakeBackend.from_name("h100-mig")  # a new process, as it were
    backend.nvml.mig_state.use_file(state)
    [mig] = backend.discover().gpus[1].mig_devices
    assert (mig.profile, mig.placement_start, mig.uuid) == ("2g.20gb", 2, made.uuid)
    assert mig.multiprocessors == 32 and mig.memory_bytes == 20096 << 20
    assert mig.gpu_instance_id == made.gpu_instance_id
    assert backend.nvml.nvmlDeviceGetHandleByUUID(made.uuid).gi == made.gpu_instance_id


def test_control_reports_a_pending_mode_change() -> None:
    api = _nvml()

    def stays_pending(handle: Any, mode: int) -> int:
        return int(pynvml.NVML_SUCCESS)  # accepted, but needs a GPU reset

    api.nvmlDeviceSetMigMode = stays_pending  # type: ignore[method-assign]
    control = migcontrol.NvmlMigControl(nvml_api=api)
    uuid = api.nvmlDeviceGetUUID(api.nvmlDeviceGetHandleByIndex(0))
    with pytest.raises(migcontrol.MigControlError, match=r"pending.*must be reset"):
        control.set_mig_mode(uuid, True)


# --- counters == hardware -------------------------------------------------------------------


def _nvml_layouts(api: Any, handle: Any, gpu: model.Gpu) -> set[frozenset[tuple[str, int]]]:
    """Every set of instances the stand-in lets exist together (depth-first creation)."""
    places = migprofiles.placements(gpu)
    found: set[frozenset[tuple[str, int]]] = set()

    def grow(first: int, current: list[tuple[str, int]]) -> None:
        found.add(frozenset(current))
        for i in range(first, len(places)):
            p = places[i]
            try:
                gi = _place(api, handle, p.profile.id, p.start, p.size)
            except pynvml.NVMLError_InsufficientResources:
                continue
            grow(i + 1, [*current, (p.profile.name, p.start)])
            api.nvmlGpuInstanceDestroy(gi)

    grow(0, [])
    return found


def _counter_layouts(gpu: model.Gpu) -> set[frozenset[tuple[str, int]]]:
    """Every set of placement devices the published counters let be allocated together."""
    places = migprofiles.placements(gpu)
    total = migslices.totals(gpu)
    found: set[frozenset[tuple[str, int]]] = set()

    def grow(first: int, current: list[tuple[str, int]], used: dict[str, int]) -> None:
        found.add(frozenset(current))
        for i in range(first, len(places)):
            take = migslices.consumption(places[i])
            after = {k: used.get(k, 0) + take.get(k, 0) for k in set(used) | set(take)}
            if all(v <= total[k] for k, v in after.items()):
                p = places[i]
                grow(i + 1, [*current, (p.profile.name, p.start)], after)

    grow(0, [], {})
    return found


@pytest.mark.parametrize("profile", ["h100-mig", "a100-mig"])
def test_the_counters_allow_exactly_the_layouts_nvml_allows(profile: str) -> None:
    api = _nvml(profile)
    handle = api.nvmlDeviceGetHandleByIndex(1)
    for gi in list(range(1, 8)):  # a100-mig's GPU 1 holds a 7g.40gb: start empty
        try:
            gpu_instance = api.nvmlDeviceGetGpuInstanceById(handle, gi)
        except pynvml.NVMLError_NotFound:
            continue
        control = migcontrol.NvmlMigControl(nvml_api=api)
        control._destroy_gi(api, gpu_instance)
    api.nvmlDeviceSetMigMode(handle, pynvml.NVML_DEVICE_MIG_ENABLE)
    gpu = fake.FakeBackend.from_name(profile).discover().gpus[1]
    hardware = _nvml_layouts(api, handle, gpu)
    counters = _counter_layouts(gpu)
    assert len(hardware) > 100
    assert counters == hardware
