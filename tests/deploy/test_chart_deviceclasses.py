"""The chart's DeviceClasses are the package's (dra_driver/deviceclasses/), for any driver name."""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from dra_driver import deviceclasses

REPO = Path(__file__).resolve().parents[2]
ALL_CLASSES = {"deviceClasses": {"extendedResourceName": "nvidia.com/gpu"}}


def _normalized(obj: dict[str, Any]) -> dict[str, Any]:
    """Name and spec only (the chart adds labels), CEL whitespace collapsed."""
    spec = yaml.safe_load(yaml.safe_dump(obj["spec"]))
    for selector in spec.get("selectors") or []:
        selector["cel"]["expression"] = re.sub(r"\s+", " ", selector["cel"]["expression"]).strip()
    return {"name": obj["metadata"]["name"], "spec": spec}


def _chart_classes(rc: ModuleType, values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    objs = [m.obj for m in rc.render(values) if m.obj["kind"] == "DeviceClass"]
    return {o["metadata"]["name"]: _normalized(o) for o in objs}


@pytest.mark.parametrize("driver", ["gpu.nvidia.com", "gpu.example.com"])
def test_chart_renders_the_package_device_classes(rc: ModuleType, driver: str) -> None:
    chart = _chart_classes(rc, {**ALL_CLASSES, "driverName": driver})
    package = {
        c["metadata"]["name"]: _normalized(c) for c in deviceclasses.load_all(driver_name=driver)
    }
    assert chart == package


def test_defaults_leave_out_the_extended_resource_class(rc: ModuleType) -> None:
    assert sorted(_chart_classes(rc, {})) == [
        "gpu-ranked.nvidia.com",
        "gpu-set.nvidia.com",
        "gpu.nvidia.com",
        "mig.nvidia.com",
        "vfio.gpu.nvidia.com",
    ]
    only_gpu = _chart_classes(
        rc, {"deviceClasses": {"mig": False, "gpuSet": False, "gpuRanked": False, "vfio": False}}
    )
    assert sorted(only_gpu) == ["gpu.nvidia.com"]


def test_the_ranked_class_has_no_selectors_and_the_notes_name_its_quota(rc: ModuleType) -> None:
    """gpu-ranked.nvidia.com matches every device (the claims' own selectors test the driver),
    so the install notes tell operators who cap devices per class to cap it too."""
    assert _chart_classes(rc, {})["gpu-ranked.nvidia.com"]["spec"] == {}
    notes = (REPO / "deployments/helm/dra-driver/templates/NOTES.txt").read_text()
    assert "gpu-ranked.nvidia.com.deviceclass.resource.k8s.io/devices" in notes


def test_deployments_copies_match_too(rc: ModuleType) -> None:
    chart = _chart_classes(rc, ALL_CLASSES)
    files = sorted((REPO / "deployments" / "deviceclasses").glob("*.yaml"))
    assert files, "deployments/deviceclasses/ is empty"
    copies = {
        _normalized(d)["name"]: _normalized(d)
        for d in (yaml.safe_load(f.read_text()) for f in files)
    }
    assert copies == chart
