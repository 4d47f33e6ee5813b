"""The NVML stand-in fails the way pynvml does: its own event structs and exception classes."""

from __future__ import annotations

import ctypes
import threading

import pynvml
import pytest

from dra_driver.devices import healthpolicy, nvml
from dra_driver.devices.fake import fakenvml, profiles


@pytest.fixture
def fake() -> fakenvml.FakeNvml:
    api = fakenvml.FakeNvml(profiles.load_builtin("dgx-h100"))
    api.nvmlInit()
    return api


def registered(api: fakenvml.FakeNvml, index: int, mask: int = nvml.EVENT_XID) -> object:
    event_set = api.nvmlEventSetCreate()
    api.nvmlDeviceRegisterEvents(api.nvmlDeviceGetHandleByIndex(index), mask, event_set)
    return event_set


def test_event_is_pynvmls_own_struct_and_names_the_device(fake: fakenvml.FakeNvml) -> None:
    event_set = registered(fake, 3)
    assert isinstance(event_set, pynvml.c_nvmlEventSet_t)
    assert fake.inject_xid(3, 79) == 1
    event = fake.nvmlEventSetWait_v2(event_set, 1000)
    assert type(event) is pynvml.c_nvmlEventData_t
    assert isinstance(event.device, pynvml.c_nvmlDevice_t)
    assert (event.eventType, event.eventData) == (pynvml.nvmlEventTypeXidCriticalError, 79)
    assert event.gpuInstanceId == event.computeInstanceId == 0xFFFFFFFF
    assert fake.nvmlDeviceGetUUID(event.device) == fake.nvmlDeviceGetUUID(
        fake.nvmlDeviceGetHandleByIndex(3)
    )


def test_wait_times_out_with_the_real_exception(fake: fakenvml.FakeNvml) -> None:
    event_set = registered(fake, 0)
    with pytest.raises(pynvml.NVMLError_Timeout):
        fake.nvmlEventSetWait_v2(event_set, 10)


def test_events_reach_only_sets_that_registered_the_gpu_for_the_type(
    fake: fakenvml.FakeNvml,
) -> None:
    xids = registered(fake, 0)
    assert fake.inject_xid(1, 79) == 0  # GPU 1 not registered anywhere
    assert fake.inject_ecc_dbe(0) == 0  # registered for XIDs only
    with pytest.raises(pynvml.NVMLError_Timeout):
        fake.nvmlEventSetWait_v2(xids, 10)
    with pytest.raises(pynvml.NVMLError_NotSupported):  # a type the GPU cannot deliver
        fake.nvmlDeviceRegisterEvents(fake.nvmlDeviceGetHandleByIndex(0), 1 << 40, xids)


def test_a_waiting_thread_wakes_on_injection(fake: fakenvml.FakeNvml) -> None:
    event_set = registered(fake, 2)
    got: list[int] = []
    thread = threading.Thread(
        target=lambda: got.append(fake.nvmlEventSetWait_v2(event_set, 10_000).eventData)
    )
    thread.start()
    fake.inject_xid(2, 48)
    thread.join(10)
    assert got == [48]


def test_a_lost_gpu_raises_gpu_is_lost_from_every_call_and_wakes_waiters(
    fake: fakenvml.FakeNvml,
) -> None:
    event_set = registered(fake, 5)
    handle = fake.nvmlDeviceGetHandleByIndex(5)
    fake.lose(5)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        fake.nvmlEventSetWait_v2(event_set, 1000)
    for call in (
        lambda: fake.nvmlDeviceGetUUID(handle),
        lambda: fake.nvmlDeviceGetMemoryInfo(handle),
        lambda: fake.nvmlDeviceGetHandleByIndex(5),
        lambda: fake.nvmlDeviceGetRemappedRows(handle),
    ):
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            call()
    fake.nvmlDeviceGetUUID(fake.nvmlDeviceGetHandleByIndex(4))  # the others still answer
    fake.reset(5)
    assert fake.nvmlDeviceGetUUID(fake.nvmlDeviceGetHandleByIndex(5))
    assert fake.inject_xid(5, 79) == 0  # back as a new device: not registered any more
    registered(fake, 4)
    fake.reset(4)  # a reset of a GPU that was not lost keeps its registrations
    assert fake.inject_xid(4, 48) == 1


def test_handle_by_uuid_for_gpus_and_mig_devices() -> None:
    prof = profiles.load_builtin("a100-mig")
    api = fakenvml.FakeNvml(prof)
    api.nvmlInit()
    gpu = api.nvmlDeviceGetHandleByUUID(prof.gpu_uuid(0))
    assert api.nvmlDeviceGetUUID(gpu) == prof.gpu_uuid(0)
    mig_uuid = prof.mig_uuid(0, prof.gpus[0].mig[0])
    assert api.nvmlDeviceGetUUID(api.nvmlDeviceGetHandleByUUID(mig_uuid)) == mig_uuid
    with pytest.raises(pynvml.NVMLError_NotFound):
        api.nvmlDeviceGetHandleByUUID("GPU-nope")


def test_pages_or_rows_by_architecture_and_the_recovery_action_field() -> None:
    volta = fakenvml.FakeNvml(profiles.load_builtin("dgx-1-v100"))
    hopper = fakenvml.FakeNvml(profiles.load_builtin("dgx-h100"))
    for api in (volta, hopper):
        api.nvmlInit()
    v0, h0 = volta.nvmlDeviceGetHandleByIndex(0), hopper.nvmlDeviceGetHandleByIndex(0)
    assert volta.nvmlDeviceGetRetiredPagesPendingStatus(v0) == pynvml.NVML_FEATURE_DISABLED
    volta.set_faults(0, pages_pending=True)
    assert volta.nvmlDeviceGetRetiredPagesPendingStatus(v0) == pynvml.NVML_FEATURE_ENABLED
    with pytest.raises(pynvml.NVMLError_NotSupported):
        volta.nvmlDeviceGetRemappedRows(v0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        hopper.nvmlDeviceGetRetiredPagesPendingStatus(h0)
    hopper.set_faults(0, remap_failure=True)
    assert hopper.nvmlDeviceGetRemappedRows(h0) == (0, 1, 0, 1)
    hopper.inject_xid(0, 48, action=pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET)
    values = hopper.nvmlDeviceGetFieldValues(h0, [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, 1])
    assert type(values[0]) is pynvml.c_nvmlFieldValue_t
    assert values[0].nvmlReturn == pynvml.NVML_SUCCESS
    assert values[0].value.uiVal == pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET
    assert values[1].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED


def test_fabric_health_mask_follows_the_fault() -> None:
    api = fakenvml.FakeNvml(profiles.load_builtin("gb200-nvl"))
    api.nvmlInit()
    handle = api.nvmlDeviceGetHandleByIndex(1)
    info = pynvml.c_nvmlGpuFabricInfoV_t()
    api.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.pointer(info))
    shift = pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY
    assert info.healthMask >> shift & 3 == pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_FALSE
    api.set_faults(1, fabric_degraded=True)
    api.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.pointer(info))
    assert info.healthMask >> shift & 3 == pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_TRUE


def test_recovery_action_names_and_event_constants_match_pynvml() -> None:
    for name, value in (
        ("NONE", "none"),
        ("GPU_RESET", "gpu-reset"),
        ("NODE_REBOOT", "node-reboot"),
        ("DRAIN_P2P", "drain-p2p"),
        ("DRAIN_AND_RESET", "drain-and-reset"),
    ):
        code = getattr(pynvml, f"NVML_GPU_RECOVERY_ACTION_{name}")
        assert healthpolicy.RECOVERY_ACTIONS[code] == value
    assert pynvml.nvmlEventTypeXidCriticalError == nvml.EVENT_XID
    assert pynvml.nvmlEventTypeDoubleBitEccError == nvml.EVENT_DBE
    assert nvml.FI_RECOVERY_ACTION == pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION


def test_unknown_gpu_index_is_refused(fake: fakenvml.FakeNvml) -> None:
    with pytest.raises(KeyError, match="no GPU with index 42"):
        fake.inject_xid(42, 79)


def test_every_nvml_call_of_the_watcher_exists_alike_in_pynvml_and_the_stand_in() -> None:
    """The fake and the real path share the watcher: each NVML function it calls is in pynvml,
    and the stand-in offers it with the same parameters."""
    import inspect
    import re
    from pathlib import Path

    from dra_driver.devices import healthchecks, watcher

    source = "".join(Path(m.__file__).read_text() for m in (watcher, healthchecks))
    called = {a or b for a, b in re.findall(r"_api\.(nvml[A-Z]\w+)\(|\"(nvml[A-Z]\w+)\"", source)}
    assert {"nvmlEventSetCreate", "nvmlDeviceRegisterEvents", "nvmlEventSetWait_v2"} <= called
    for name in sorted(called):
        real = getattr(pynvml, name)
        fake = getattr(fakenvml.FakeNvml, name)
        real_params = list(inspect.signature(real).parameters)
        fake_params = list(inspect.signature(fake).parameters)[1:]  # without self
        assert len(fake_params) == len(real_params), (name, real_params, fake_params)
