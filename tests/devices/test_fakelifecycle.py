"""The fake NVML's driver lifecycle: unload/load with pynvml's own errors, GPUs removed and added,
all seen through the real discovery code."""

from __future__ import annotations

import pytest

from dra_driver.devices import nvml
from dra_driver.devices.fake import FakeBackend, fakelifecycle


@pytest.fixture
def node() -> FakeBackend:
    backend = FakeBackend.from_name("dgx-h100")
    backend.discover()
    return backend


@pytest.mark.parametrize(
    ("mode", "call", "init"),
    [
        ("not-loaded", nvml.NVMLError_DriverNotLoaded, nvml.NVMLError_DriverNotLoaded),
        ("uninitialized", nvml.NVMLError_Uninitialized, nvml.NVMLError_DriverNotLoaded),
        ("mismatch", nvml.NVMLError_LibRmVersionMismatch, nvml.NVMLError_LibRmVersionMismatch),
        ("gpu-lost", nvml.NVMLError_GpuIsLost, nvml.NVMLError_DriverNotLoaded),
    ],
)
def test_unload_raises_pynvmls_own_errors_until_loaded_and_reinitialised(
    node: FakeBackend, mode: str, call: type[Exception], init: type[Exception]
) -> None:
    fake = node.nvml
    fake.unload(mode)
    assert not fake.driver_loaded
    with pytest.raises(call) as raised:
        fake.nvmlDeviceGetCount()
    assert isinstance(raised.value, nvml.NVMLError) and type(raised.value) is call
    with pytest.raises(init):
        fake.nvmlInit()
    fake.load()
    with pytest.raises(nvml.NVMLError_Uninitialized):  # the old initialisation is gone
        fake.nvmlDeviceGetCount()
    fake.nvmlInit()
    assert fake.nvmlDeviceGetCount() == 8


def test_unload_wakes_waiting_event_sets_and_load_invalidates_them(node: FakeBackend) -> None:
    fake = node.nvml
    events = fake.nvmlEventSetCreate()
    fake.nvmlDeviceRegisterEvents(fake.nvmlDeviceGetHandleByIndex(0), nvml.EVENT_XID, events)
    fake.unload()
    with pytest.raises(nvml.NVMLError_DriverNotLoaded):
        fake.nvmlEventSetWait_v2(events, 10)
    fake.load()
    fake.nvmlInit()
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        fake.nvmlEventSetWait_v2(events, 10)


def test_load_with_a_new_version_shows_in_discovery(node: FakeBackend) -> None:
    node.nvml.unload()
    node.nvml.load(driver_version="590.10.01")
    node.nvml.nvmlInit()
    assert {g.driver_version for g in node.discover().gpus} == {"590.10.01"}


def test_a_removed_gpu_is_gone_and_the_others_keep_uuid_pci_and_minor(node: FakeBackend) -> None:
    before = {g.uuid: g for g in node.discover().gpus}
    gone = node.nvml.remove_gpu(2)
    after = node.discover()
    assert gone not in {g.uuid for g in after.gpus} and len(after.gpus) == 7
    assert [g.index for g in after.gpus] == list(range(7))  # NVML renumbers
    for gpu in after.gpus:
        assert (gpu.minor, gpu.pci_bus_id, gpu.name) == (
            before[gpu.uuid].minor,
            before[gpu.uuid].pci_bus_id,
            before[gpu.uuid].name,
        )
    with pytest.raises(fakelifecycle.LifecycleError, match="no GPU with index 9"):
        node.nvml.remove_gpu(9)


def test_an_added_gpu_is_discovered_with_a_new_uuid_pci_and_minor(node: FakeBackend) -> None:
    before = node.discover()
    index, uuid = node.nvml.add_gpu()
    after = node.discover()
    added = after.gpu(index)
    assert (index, added.uuid, added.name) == (8, uuid, "gpu-8")
    assert added.pci_bus_id not in {g.pci_bus_id for g in before.gpus}
    assert added.product_name == before.gpus[-1].product_name and not added.mig_enabled
    assert [g.uuid for g in after.gpus[:8]] == [g.uuid for g in before.gpus]
    with pytest.raises(fakelifecycle.LifecycleError, match="taken"):
        node.nvml.add_gpu(uuid=uuid)


def test_a_mig_gpu_keeps_its_mig_devices_when_another_is_removed() -> None:
    node = FakeBackend.from_name("a100-mig")
    before = {g.uuid: sorted(m.uuid for m in g.mig_devices) for g in node.discover().gpus}
    if len(before) < 2:
        pytest.skip("profile has one GPU")
    node.nvml.remove_gpu(0)
    after = {g.uuid: sorted(m.uuid for m in g.mig_devices) for g in node.discover().gpus}
    assert all(before[u] == migs for u, migs in after.items())


def test_unknown_outage_mode_is_refused(node: FakeBackend) -> None:
    with pytest.raises(fakelifecycle.LifecycleError, match="unknown outage mode"):
        node.nvml.unload("sideways")
    assert node.nvml.driver_loaded


def test_a_handle_follows_its_gpu_when_another_is_removed_and_a_removed_gpus_is_lost(
    node: FakeBackend,
) -> None:
    fake = node.nvml
    last = fake.nvmlDeviceGetHandleByIndex(7)
    gone = fake.nvmlDeviceGetHandleByIndex(3)
    minor = fake.nvmlDeviceGetMinorNumber(last)
    uuid = fake.nvmlDeviceGetUUID(last)
    fake.remove_gpu(3)  # NVML renumbers: the last GPU is index 6 now
    assert fake.nvmlDeviceGetUUID(last) == uuid and fake.nvmlDeviceGetMinorNumber(last) == minor
    with pytest.raises(nvml.NVMLError_GpuIsLost):
        fake.nvmlDeviceGetUtilizationRates(gone)
