"""FakeBackend runs the NVML code path and still reports exactly what each profile describes.

``data/direct/<profile>.json`` was recorded from the earlier FakeBackend, which converted a
profile into the device model directly (before discovery went through the pynvml stand-in).
Discovery through NVML must give equal dataclasses for every built-in profile. Facts added to
the model later (``mig_capable``, ``machine_type``, for node labels) were added to the recordings
from the profiles that state them. MIG profile tables (``Gpu.mig_profiles``) are NVML facts only:
they are left out of the comparison and tested in ``test_fakemig.py``, as is ``h100-mig``, a
profile added after the direct conversion was gone. IOMMU groups (``Gpu.iommu_group``, for
passthrough) came later too: left out here, tested in ``tests/slices/test_vfioslices.py`` with
``pcie-l4-shared-iommu``.
"""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from dra_driver.devices import fake, model
from dra_driver.devices.fake import profiles

RECORDED = Path(__file__).parent / "data" / "direct"
LATER = {"h100-mig", "pcie-l4-shared-iommu"}  # profiles added after the direct conversion was gone


def from_dict(data: dict[str, Any]) -> model.NodeDevices:
    """Inverse of :func:`model.to_dict` for a recorded NodeDevices."""

    def gpu(g: dict[str, Any]) -> model.Gpu:
        fields = dict(g)
        fields["mig_devices"] = tuple(model.MigDevice(**m) for m in g["mig_devices"])
        fields["nvlinks"] = {int(k): v for k, v in g["nvlinks"].items()}
        fields["fabric"] = model.FabricInfo(**g["fabric"]) if g["fabric"] else None
        return model.Gpu(**fields)

    return model.NodeDevices(
        gpus=tuple(gpu(g) for g in data["gpus"]),
        pcie_paths={
            tuple(ast.literal_eval(k)): model.PathType(v) for k, v in data["pcie_paths"].items()
        },
        machine_type=data["machine_type"],
    )


def test_every_builtin_profile_was_recorded() -> None:
    recorded = sorted(p.stem for p in RECORDED.glob("*.json"))
    assert recorded == sorted(set(profiles.builtin_names()) - LATER)


@pytest.mark.parametrize("name", sorted(set(profiles.builtin_names()) - LATER))
def test_nvml_path_equals_the_recorded_direct_conversion(name: str) -> None:
    recorded = from_dict(json.loads((RECORDED / f"{name}.json").read_text()))
    found = fake.FakeBackend.from_name(name).discover()
    without_tables = tuple(
        dataclasses.replace(g, mig_profiles=(), iommu_group=None) for g in found.gpus
    )
    assert dataclasses.replace(found, gpus=without_tables) == recorded


def test_from_file_and_profile(tmp_path: Path) -> None:
    text = (RECORDED.parents[3] / "dra_driver/devices/fake/profiles/pcie-l4.yaml").read_text()
    path = tmp_path / "l4.yaml"
    path.write_text(text.replace("numaNode: 1", "numaNode: 0"))
    backend = fake.FakeBackend.from_file(path)
    assert backend.profile.name == "pcie-l4"
    devices = backend.discover()
    assert [g.numa_node for g in devices.gpus] == [0, 0, 0, 0]
    assert devices.pcie_path(2, 3) is model.PathType.NODE
    assert backend.discover() == devices  # repeatable


def test_failures_can_be_injected_through_the_backend() -> None:
    backend = fake.FakeBackend.from_name("h100-nvl-pairs")
    from dra_driver.devices import nvml

    backend.nvml.fail[3] = nvml.NVMLError_GpuIsLost
    devices = backend.discover()
    assert [g.index for g in devices.gpus] == [0, 1, 2]
    assert devices.gpu(2).nvlinks == {}
