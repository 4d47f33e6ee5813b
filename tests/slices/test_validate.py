"""Local slice validation beyond the recorded verdicts: the rest of the API limits, and errors
that name the device and the rule."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dra_driver.slices import validate

from .conftest import Obj


def slice_with(devices: list[Obj], **spec: Any) -> Obj:
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


def paths(obj: Obj) -> list[str]:
    return [e.path for e in validate.validate(obj)]


def dev(name: str = "gpu-0", **fields: Any) -> Obj:
    return {"name": name, **fields}


@pytest.mark.parametrize(
    ("device", "path"),
    [
        (
            dev(attributes={"v": {"version": "1.2.3-" + "a" * 60}}),
            "spec.devices[0].attributes[v].version",
        ),
        (dev(attributes={"v": {"version": "v1.2.3"}}), "spec.devices[0].attributes[v].version"),
        (dev(attributes={"a/b/c": {"int": 1}}), "spec.devices[0].attributes"),
        (dev(attributes={"/x": {"int": 1}}), "spec.devices[0].attributes"),
        (dev(attributes={("d" * 64) + "/x": {"int": 1}}), "spec.devices[0].attributes"),
        (dev(attributes={"bad_domain!/x": {"int": 1}}), "spec.devices[0].attributes"),
        (dev(capacity={"m": {}}), "spec.devices[0].capacity[m].value"),
        (
            dev(capacity={"m": {"value": "1", "requestPolicy": {"default": "1"}}}),
            "spec.devices[0].capacity[m].requestPolicy",
        ),
        (dev(taints=[{"key": "k", "effect": "NoSchedule"}] * 17), "spec.devices[0].taints"),
        (dev(taints=[{"key": "", "effect": "None"}]), "spec.devices[0].taints[0].key"),
        (
            dev(taints=[{"key": "k", "value": "bad value", "effect": "None"}]),
            "spec.devices[0].taints[0].value",
        ),
        (dev(attributes={"l": {"ints": []}}), "spec.devices[0].attributes[l].ints"),
        (
            dev(attributes={"l": {"strings": ["x" * 65]}}),
            "spec.devices[0].attributes[l].strings[0]",
        ),
        (dev(attributes={"l": {"ints": list(range(49))}}), "spec.devices[0].attributes"),
        (dev(bindingConditions=["a"]), "spec.devices[0]"),
        (dev(nodeName="n1"), "spec.devices[0].nodeName"),
        (
            dev(consumesCounters=[{"counterSet": "s", "counters": {"c": {"value": "1"}}}] * 3),
            "spec.devices[0].consumesCounters",
        ),
    ],
)
def test_device_rules(device: Obj, path: str) -> None:
    assert paths(slice_with([device])) == [path]


def test_list_attributes_lower_the_device_limit_to_64() -> None:
    devices = [dev(f"d{i}") for i in range(65)]
    assert paths(slice_with(devices)) == []
    devices[3]["attributes"] = {"l": {"ints": [1, 2]}}
    assert paths(slice_with(devices)) == ["spec.devices"]


@pytest.mark.parametrize(
    ("spec", "path"),
    [
        ({"driver": ""}, "spec.driver"),
        ({"driver": "d" * 64}, "spec.driver"),
        (
            {"pool": {"name": "n1", "generation": -1, "resourceSliceCount": 1}},
            "spec.pool.generation",
        ),
        ({"pool": {"name": "a/B", "generation": 0, "resourceSliceCount": 1}}, "spec.pool.name"),
        ({"nodeName": None, "allNodes": False}, "spec.allNodes"),
        (
            {"nodeName": None, "nodeSelector": {"nodeSelectorTerms": []}},
            "spec.nodeSelector.nodeSelectorTerms",
        ),
        ({"nodeName": "Not_A_Node"}, "spec.nodeName"),
    ],
)
def test_spec_rules(spec: Obj, path: str) -> None:
    obj = slice_with([dev()])
    obj["spec"].update(spec)
    obj["spec"] = {k: v for k, v in obj["spec"].items() if v is not None}
    assert paths(obj) == [path]


def test_decode_errors_come_alone_and_name_the_field() -> None:
    obj = slice_with([dev(name=7, capacity={"m": {"value": "lots"}})])  # type: ignore[arg-type]
    obj["spec"]["extra"] = True
    errors = validate.validate(obj)
    assert all(e.status == 400 for e in errors)
    assert {e.path for e in errors} == {
        "spec.devices[0].name",
        "spec.devices[0].capacity[m].value",
        "spec.extra",
    }


def test_check_raises_with_device_and_rule_named() -> None:
    obj = slice_with([dev("gpu-0"), dev("gpu-1", attributes={"x": {"string": "y" * 65}})])
    with pytest.raises(validate.SliceInvalid) as info:
        validate.check(obj)
    text = str(info.value)
    assert info.value.status == 422
    assert 'ResourceSlice.resource.k8s.io "n1-gpu.nvidia.com-0" is invalid' in text
    assert "spec.devices[1].attributes[x].string: Too long" in text and "'gpu-1'" in text
    validate.check(slice_with([dev()]))


def test_immutable_fields_on_update() -> None:
    old = slice_with([dev()])
    new = copy.deepcopy(old)
    new["spec"]["driver"] = "other.example.com"
    new["spec"]["pool"]["name"] = "n2"
    assert [e.path for e in validate.validate_update(old, new)] == ["spec.driver", "spec.pool.name"]
