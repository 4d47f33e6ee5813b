"""``capacity`` and ``simulate`` over a node offering its GPUs for passthrough: a GPU allocated
as gpu-vfio-N is held (not free, not an extra GPU), and the simulator, told that allocation,
refuses a container claim for that GPU."""

from __future__ import annotations

from typing import Any

from dra_driver.allocation import fleetnodes, simulator
from dra_driver.devices import fake, passthrough
from dra_driver.slices import build

NODE, DRIVER = "n1", "gpu.nvidia.com"


def _slices() -> tuple[Any, list[dict[str, Any]]]:
    devices = passthrough.mark(
        fake.FakeBackend.from_name("pcie-l4").discover(), passthrough.Passthrough.parse("all")
    )
    return devices, build.build(devices, node_name=NODE).slices


def _allocated(device: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "vm", "namespace": "vms", "uid": "u-1"},
        "status": {"allocation": {"devices": {"results": [
            {"request": "vm", "driver": DRIVER, "pool": NODE, "device": device}
        ]}}},
    }  # fmt: skip


def test_capacity_counts_a_passed_through_gpu_as_held() -> None:
    _, slices = _slices()
    [empty] = fleetnodes.read(slices, [], driver_name=DRIVER)
    assert empty.names == ("gpu-0", "gpu-1", "gpu-2", "gpu-3") and empty.held == 0
    [node] = fleetnodes.read(slices, [_allocated("gpu-vfio-2")], driver_name=DRIVER)
    assert node.names == empty.names  # passthrough devices are no GPUs of their own
    assert node.held == 1
    assert not node.free & (1 << node.names.index("gpu-2"))
    assert node.free == empty.free & ~(1 << 2)


def test_simulate_refuses_a_container_claim_for_a_passed_through_gpu() -> None:
    devices, slices = _slices()
    gpu = devices.gpus[2]
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "pod", "namespace": "t"},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": {
            "deviceClassName": "gpu.nvidia.com",
            "selectors": [{"cel": {"expression":
                f'device.attributes["{DRIVER}"].uuid == "{gpu.uuid}"'}}]}}]}},
    }  # fmt: skip
    inputs = simulator.Inputs(
        claims=[claim],
        classes=simulator.builtin_classes(),
        slices=slices,
        node_name=NODE,
        allocated={(DRIVER, NODE, "gpu-vfio-2")},
        node_devices=devices,
    )
    [outcome] = simulator.run(inputs)
    assert outcome.allocation is None
    inputs.allocated.clear()
    [free] = simulator.run(inputs)
    assert free.allocation is not None
