"""Shareable GPUs in the slices: consumable capacity that passes the strict 1.37 schema, the
OpenAPI document and the API server's rules, chosen by --shareable; requestPolicy rules."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import refdata

from dra_driver.devices import migprofiles
from dra_driver.slices import build, requestpolicy, shares, validate

from . import openapi
from .conftest import devices_of

PROFILES = ["dgx-h100", "h100-nvl-pairs", "a100-mig", "gb200-nvl", "pcie-l4", "dgx-1-v100"]


def devices(profile: str, shareable: str) -> list[dict[str, Any]]:
    built = build.build(
        devices_of(profile), node_name="n1", shareable=shares.Shareable.parse(shareable)
    )
    for obj in built.slices:
        assert kubernetes_validate.validate(obj, "1.37.0", strict=True)
        assert validate.validate(obj) == []
        assert "sharedCounters" not in obj["spec"]  # counters only for dynamic MIG
        assert len(obj["spec"].get("devices", [])) <= validate.MAX_DEVICES
    return [d for s in built.slices for d in s["spec"].get("devices", [])]


def gpus(devs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in devs if d["attributes"]["type"]["string"] == "gpu"]


@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_with_all_gpus_shareable_is_valid(profile: str) -> None:
    for dev in devices(profile, "all"):
        is_gpu = dev["attributes"]["type"]["string"] == "gpu"
        assert dev.get("allowMultipleAllocations", False) is is_gpu  # MIG devices never
        assert "consumesCounters" not in dev
        if is_gpu:
            assert set(dev["capacity"]) == {"memory", "computeShare"}


def test_a_node_with_shareable_gpus_keeps_its_set_ranks_and_has_no_counters() -> None:
    built = build.build(
        devices_of("dgx-h100"), node_name="n1", shareable=shares.Shareable.parse("all")
    )
    plain = build.build(devices_of("dgx-h100"), node_name="n1")
    assert len(built.slices) == len(plain.slices) == 1
    assert not any(s["spec"].get("sharedCounters") for s in built.slices)
    shared = devices("dgx-h100", "all")
    exclusive = [d for s in plain.slices for d in s["spec"].get("devices", [])]
    assert [d["name"] for d in shared] == [d["name"] for d in exclusive]
    # Same attributes, set ranks included; only capacity and allowMultipleAllocations differ.
    assert [d["attributes"] for d in shared] == [d["attributes"] for d in exclusive]
    assert all("setRanks" in d["attributes"] for d in shared)


def test_gpus_published_for_dynamic_mig_are_not_shareable() -> None:
    built = build.build(
        devices_of("dgx-h100"),
        node_name="n1",
        shareable=shares.Shareable.parse("all"),
        dynamic_mig=migprofiles.DynamicMig.parse("all"),
    )
    devs = [d for s in built.slices for d in s["spec"].get("devices", [])]
    assert len(gpus(devs)) == 8 and not any(d.get("allowMultipleAllocations") for d in devs)
    assert sum("--shareable does not apply to it" in p for p in built.problems) == 8
    assert "GPU gpu-0 (NVIDIA H100 80GB HBM3) is published for dynamic MIG" in built.problems[0]


def test_shareable_gpu_capacity_and_policy() -> None:
    (first, *_) = devices("dgx-h100", "all")
    assert first["allowMultipleAllocations"] is True
    assert first["capacity"] == {
        "computeShare": {
            "value": "100",
            "requestPolicy": {
                "default": "0",
                "validRange": {"min": "0", "max": "100", "step": "1"},
            },
        },
        "memory": {
            "value": "80Gi",
            "requestPolicy": {
                "default": "80Gi",
                "validRange": {"min": "1Gi", "max": "80Gi", "step": "1Gi"},
            },
        },
    }
    assert first["attributes"]["productName"] == {"string": "NVIDIA H100 80GB HBM3"}


def test_odd_memory_sizes_round_down_to_whole_gib_for_shares() -> None:
    capacity = shares.capacity((80 << 30) - (300 << 20), memory_text="81620Mi")
    assert capacity is not None
    assert capacity["memory"]["value"] == "81620Mi"
    assert capacity["memory"]["requestPolicy"]["default"] == "79Gi"
    assert capacity["memory"]["requestPolicy"]["validRange"]["max"] == "79Gi"
    assert shares.capacity(1 << 30, memory_text="1Gi") is None  # too small to share


def test_shareable_selects_by_product_and_defaults_to_none() -> None:
    assert not any(d.get("allowMultipleAllocations") for d in devices("dgx-h100", "none"))
    assert all(d.get("allowMultipleAllocations") for d in gpus(devices("dgx-h100", "H100")))
    assert not any(d.get("allowMultipleAllocations") for d in devices("dgx-h100", "A100|L4"))
    assert all(d.get("allowMultipleAllocations") for d in gpus(devices("pcie-l4", "A100|L4")))
    with pytest.raises(shares.ShareableError, match="not none, all or a valid regular expression"):
        shares.Shareable.parse("H100(")


def test_share_of_reads_consumed_capacity() -> None:
    got = shares.share_of(
        {"gpu.nvidia.com/memory": "20Gi", "computeShare": "30"}, driver="gpu.nvidia.com"
    )
    assert got == shares.Share(memory_bytes=20 << 30, compute_percent=30)
    assert not got.whole_gpu(80 << 30)
    assert shares.Share(memory_bytes=80 << 30, compute_percent=0).whole_gpu(80 << 30)
    assert not shares.Share(memory_bytes=80 << 30, compute_percent=50).whole_gpu(80 << 30)
    with pytest.raises(ValueError, match="not a whole, positive amount"):
        shares.share_of({"memory": "0.5"}, driver="gpu.nvidia.com")


def _policy_errors(value: str, policy: dict[str, Any]) -> list[str]:
    return [str(e) for e in requestpolicy.errors("p", value, policy, "gpu-0")]


@pytest.mark.parametrize(
    ("value", "policy", "expect"),
    [
        ("10", {"validValues": ["1"], "validRange": {"min": "1"}}, "exactly one policy"),
        ("10", {"validValues": ["1", "2"]}, "p.default: Required value: required when validValues"),
        ("10", {"default": "1", "validValues": ["2", "1"]}, "values must be sorted in ascending"),
        ("10", {"default": "1", "validValues": ["1", "20"]}, "option is larger than capacity"),
        ("10", {"default": "3", "validValues": ["1", "2"]}, "default value is not valid"),
        ("10", {"default": "1", "validValues": [str(i) for i in range(11)]}, "Too many: 11"),
        ("10", {"default": "1", "validRange": {}}, "p.validRange.min: Required value"),
        ("10", {"default": "1", "validRange": {"min": "11"}}, "min is larger than capacity value"),
        ("10", {"default": "1", "validRange": {"min": "2"}}, "default is less than min: 2"),
        ("10", {"default": "5", "validRange": {"min": "6", "max": "4"}}, "min is larger than max"),
        ("10", {"default": "5", "validRange": {"min": "1", "max": "20"}}, "max is larger than cap"),
        (
            "10",
            {"default": "8", "validRange": {"min": "1", "max": "6"}},
            "default is more than max",
        ),
        ("10", {"default": "5", "validRange": {"min": "1", "step": "10"}}, "one step 11 is larger"),
        ("10", {"default": "4", "validRange": {"min": "1", "step": "2"}}, "not a multiple"),
        ("10", {"default": "3", "validRange": {"min": "1", "max": "6", "step": "2"}}, "not a mult"),
    ],
)
def test_request_policy_rules_of_the_api_server(
    value: str, policy: dict[str, Any], expect: str
) -> None:
    errors = _policy_errors(value, policy)
    assert any(expect in e for e in errors), errors


def test_valid_request_policies_pass() -> None:
    assert _policy_errors("10", {"default": "1", "validValues": ["1", "2", "10"]}) == []
    assert _policy_errors("10", {"default": "3", "validRange": {"min": "1", "step": "2"}}) == []
    assert _policy_errors("10", {"default": "7"}) == []


def test_a_slice_with_a_bad_policy_is_rejected_naming_the_device() -> None:
    (slice_obj,) = build.build(
        devices_of("pcie-l4"), node_name="n1", shareable=shares.Shareable.parse("all")
    ).slices
    dev = slice_obj["spec"]["devices"][1]
    dev["capacity"]["memory"]["requestPolicy"]["default"] = "1000Gi"
    errors = [str(e) for e in validate.validate(slice_obj)]
    assert errors == [
        "spec.devices[1].capacity[memory].requestPolicy.validRange.max: Invalid value: "
        "\"1000Gi\": default is more than max: 22Gi (device 'gpu-1')"
    ]


@refdata.MARK
@pytest.mark.parametrize("profile", PROFILES)
def test_shareable_slices_pass_the_reference_openapi_document(profile: str) -> None:
    built = build.build(
        devices_of(profile), node_name="n1", shareable=shares.Shareable.parse("all")
    )
    for obj in built.slices:
        assert openapi.errors(obj) == []
