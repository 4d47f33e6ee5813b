"""The shipped DeviceClasses: one source, accepted by the API rules, and selecting exactly the
devices our slices publish under each type."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import refdata

from dra_driver import deviceclasses
from dra_driver.allocation import cel
from dra_driver.testing.fakeapi import memory

from . import openapi
from .conftest import devices_of

REPO = Path(__file__).resolve().parents[2]
PACKAGE_DIR = REPO / "dra_driver" / "deviceclasses"
DEPLOY_DIR = REPO / "deployments" / "deviceclasses"


def test_deployment_copies_match_the_package_data_byte_for_byte() -> None:
    shipped = sorted(p.name for p in PACKAGE_DIR.glob("*.yaml"))
    assert shipped == sorted(p.name for p in DEPLOY_DIR.glob("*.yaml")), (
        "run: cp dra_driver/deviceclasses/*.yaml deployments/deviceclasses/"
    )
    for name in shipped:
        assert (DEPLOY_DIR / name).read_bytes() == (PACKAGE_DIR / name).read_bytes(), name


@pytest.mark.parametrize("name", deviceclasses.names())
def test_classes_pass_schema_and_server_rules(name: str) -> None:
    obj = deviceclasses.load(name)
    assert obj["metadata"]["name"] == name
    assert kubernetes_validate.validate(obj, "1.36.0", strict=True)
    assert kubernetes_validate.validate(obj, "1.37.0", strict=True)
    memory.InMemoryApi().create_device_class(obj)


@refdata.MARK
@pytest.mark.parametrize("name", deviceclasses.names())
def test_classes_pass_the_reference_openapi_document(name: str) -> None:
    assert openapi.errors(deviceclasses.load(name), "DeviceClass") == []


@pytest.mark.parametrize(
    ("name", "wanted"),
    [
        ("gpu.nvidia.com", "gpu"),
        ("gpu-extended-resource.nvidia.com", "gpu"),
        ("mig.nvidia.com", "mig"),
    ],
)
@pytest.mark.parametrize("driver", ["gpu.nvidia.com", "gpu.example.com"])
def test_selectors_pick_exactly_the_devices_of_their_type(
    name: str, wanted: str, driver: str
) -> None:
    from dra_driver.slices import build

    devices = [
        d
        for profile in ("dgx-h100", "a100-mig")
        for s in build.build(devices_of(profile), node_name="n1", driver_name=driver).slices
        for d in s["spec"].get("devices", [])
    ]
    (selector,) = deviceclasses.load(name, driver_name=driver)["spec"]["selectors"]
    compiled = cel.compile_selector(selector["cel"]["expression"])
    picked = [d["name"] for d in devices if compiled.matches(d, driver)]
    assert picked == [d["name"] for d in devices if d["attributes"]["type"]["string"] == wanted]
    assert picked
    other = "other.example.com"
    assert not any(compiled.matches(d, other) for d in devices)


@pytest.mark.parametrize("driver", ["gpu.nvidia.com", "gpu.example.com"])
def test_the_gpu_set_class_is_kept_for_old_claims_and_matches_nothing_published_now(
    driver: str,
) -> None:
    from dra_driver.slices import build

    devices = [
        d
        for profile in ("dgx-h100", "dgx-1-v100", "a100-mig")
        for s in build.build(devices_of(profile), node_name="n1", driver_name=driver).slices
        for d in s["spec"].get("devices", [])
    ]
    (selector,) = deviceclasses.load("gpu-set.nvidia.com", driver_name=driver)["spec"]["selectors"]
    compiled = cel.compile_selector(selector["cel"]["expression"])
    assert devices and not any(compiled.matches(d, driver) for d in devices)
    # A set device as earlier versions published it: what old claims' first alternative named.
    old = {
        "name": "gpus-0-1",
        "attributes": {"type": {"string": "gpu-set"}, "gpuCount": {"int": 2}},
    }
    assert compiled.matches(old, driver) and not compiled.matches(old, "other.example.com")
    text = (PACKAGE_DIR / "gpu-set.nvidia.com.yaml").read_text()
    assert "earlier versions" in text


def test_extended_resource_variant_and_unknown_names() -> None:
    assert (
        deviceclasses.load("gpu-extended-resource.nvidia.com")["spec"]["extendedResourceName"]
        == "nvidia.com/gpu"
    )
    with pytest.raises(deviceclasses.DeviceClassError, match="shipped: "):
        deviceclasses.load("tpu.example.com")


@pytest.mark.parametrize("driver", ["gpu.nvidia.com", "gpu.example.com"])
def test_the_ranked_class_selects_nothing_itself_and_the_rank_selectors_pick_our_gpus(
    driver: str,
) -> None:
    """gpu-ranked.nvidia.com has no selectors (one CEL evaluation per GPU, not two): the rank
    alternatives of the generated claim test the driver themselves, so through it they pick
    our ranked GPUs and never another driver's devices or our MIG devices."""
    from dra_driver.allocation import claimgen
    from dra_driver.slices import build

    assert deviceclasses.load("gpu-ranked.nvidia.com", driver_name=driver)["spec"] == {}
    devices = [
        d
        for profile in ("dgx-h100", "a100-mig")
        for s in build.build(devices_of(profile), node_name="n1", driver_name=driver).slices
        for d in s["spec"].get("devices", [])
    ]
    (request,) = claimgen.spec(4, driver_name=driver)["devices"]["requests"]
    rank1 = request["firstAvailable"][0]
    assert rank1["deviceClassName"] == "gpu-ranked.nvidia.com"
    compiled = cel.compile_selector(rank1["selectors"][0]["cel"]["expression"])
    picked = [d["name"] for d in devices if compiled.matches(d, driver)]
    assert picked == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]  # the DGX H100's best quad
    assert not any(compiled.matches(d, "other.example.com") for d in devices)
