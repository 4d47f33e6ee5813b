"""Fixtures for slice tests: built slices of a fake profile, profiles generated on the fly."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from dra_driver.devices import fake, model
from dra_driver.devices.fake import profiles
from dra_driver.slices import build

Obj = dict[str, Any]


def slice_with(devices: list[Obj], **spec: Any) -> Obj:
    """A one-slice pool on node n1 with ``devices`` (and any spec fields), for validation tests."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "n1-gpu.nvidia.com-0"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": "n1",
            "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
            **spec,
        },
    }


def devices_of(name: str) -> model.NodeDevices:
    return fake.FakeBackend.from_name(name).discover()


def generated_profile(gpus: int, *, migs_per_gpu: int = 0, name: str = "generated") -> str:
    """Profile YAML with ``gpus`` PCIe GPUs (optionally each with 1g MIG devices)."""
    lines = [
        f"name: {name}",
        'driverVersion: "580.95.05"',
        'cudaDriverVersion: "13.0"',
        "defaults: {productName: NVIDIA H100 80GB HBM3, brand: Nvidia, architecture: Hopper,",
        '           cudaComputeCapability: "9.0", memory: 80Gi}',
        "gpus:",
    ]
    for i in range(gpus):
        bus = f"{i // 256:04x}:{i % 256:02x}:00.0"
        line = f'  - {{pciBusId: "{bus}", numaNode: {i % 2}'
        if migs_per_gpu:
            migs = ", ".join(
                f"{{profile: 1g.10gb, placementStart: {j}, placementSize: 1, memory: 9856Mi, "
                f"multiprocessors: 16}}"
                for j in range(migs_per_gpu)
            )
            line += f", mig: [{migs}]"
        lines.append(line + "}")
    return "\n".join(lines) + "\n"


@pytest.fixture
def make_devices() -> Callable[..., model.NodeDevices]:
    def make(gpus: int, *, migs_per_gpu: int = 0) -> model.NodeDevices:
        text = generated_profile(gpus, migs_per_gpu=migs_per_gpu)
        return fake.FakeBackend(profiles.parse(text, source="generated")).discover()

    return make


@pytest.fixture
def dgx_slices() -> list[Obj]:
    return build.build(devices_of("dgx-h100"), node_name="n1", node_uid="uid-n1").slices
