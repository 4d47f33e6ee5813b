"""The exact text of every slice validation error, as an operator reads it in the agent's log
(the publisher logs ``str(error)`` for a slice it will not send; ``build`` reports left-out
devices the same way): field path, kind, value, the server's wording, and which device.

test_validate.py holds each rule to its path and error kind; here the whole line is compared,
so a changed word, a lost value or a missing ``(device '...')`` hint fails."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.apimachinery import names
from dra_driver.slices import attrnames, validate

from .conftest import Obj, slice_with

LABEL = names.dns_label("X")[0]
SUBDOMAIN = names.dns_subdomain("X")[0]
NAME_PART = names.qualified_name("bad key")[0]
LABEL_VALUE = names.label_value("bad value")[0]
SEMVER = "must be a string compatible with semver.org spec 2.0.0"
PER_DEVICE = (
    "exactly one of `nodeName`, `nodeSelector`, or `allNodes` is required when "
    "`perDeviceNodeSelection` is set to true in the ResourceSlice spec"
)
NODE_SELECTION = (
    "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required"
)
G0 = "(device 'gpu-0')"


def dev(name: str = "gpu-0", **fields: Any) -> Obj:
    return {"name": name, **fields}


def lines(obj: Obj) -> list[str]:
    return [str(e) for e in validate.validate(obj)]


def without(obj: Obj, *fields: str) -> Obj:
    for field in fields:
        del obj["spec"][field]
    return obj


def counters(n: int) -> Obj:
    return {f"c{i}": {"value": "1"} for i in range(n)}


# --- one device -------------------------------------------------------------------------------

DEVICE_CASES: list[tuple[str, Obj, list[str]]] = [
    (
        "device name",
        dev("GPU-0"),
        [f"spec.devices[0].name: Invalid value: \"GPU-0\": {LABEL} (device 'GPU-0')"],
    ),
    (
        "attributes and capacities together",
        dev(attributes={f"a{i}": {"int": i} for i in range(20)}, capacity=counters(13)),
        [
            "spec.devices[0]: Invalid value: 33: the total number of attributes and capacities "
            f"must not exceed 32 {G0}"
        ],
    ),
    (
        "attribute values",
        dev(attributes={"big": {"ints": list(range(49))}}),
        [
            "spec.devices[0]: Invalid value: 49: the total number of attribute values must not "
            f"exceed 48 {G0}"
        ],
    ),
    (
        "attribute names",
        dev(attributes={"/": {"int": 1}, "Bad!/x": {"int": 1}, "x" * 33: {"int": 1}}),
        [
            f'spec.devices[0].attributes: Invalid value: "": the domain must not be empty {G0}',
            f'spec.devices[0].attributes: Invalid value: "": the name must not be empty {G0}',
            f'spec.devices[0].attributes: Invalid value: "Bad!": {SUBDOMAIN} {G0}',
            f"spec.devices[0].attributes: Too long: may not be more than 32 bytes {G0}",
        ],
    ),
    (
        "attribute name, domain too long, and not an identifier",
        dev(attributes={"d" * 64 + "/9x": {"int": 1}}),
        [
            f"spec.devices[0].attributes: Too long: may not be more than 63 bytes {G0}",
            f'spec.devices[0].attributes: Invalid value: "9x": {names.c_identifier("9x")[0]} {G0}',
        ],
    ),
    (
        "attribute values, each kind",
        dev(
            attributes={
                "v": {"version": "1.2"},
                "s": {"string": "y" * 65},
                "l": {"strings": []},
                "n": {},
                "two": {"int": 1, "bool": True},
                "vs": {"versions": ["1.0", "1.0.0-" + "x" * 60]},
                "ss": {"strings": ["ok", "y" * 65]},
            }
        ),
        [
            f'spec.devices[0].attributes[v].version: Invalid value: "1.2": {SEMVER} {G0}',
            f"spec.devices[0].attributes[s].string: Too long: may not be more than 64 bytes {G0}",
            "spec.devices[0].attributes[l].strings: Invalid value: []: must not be empty if "
            f"specified {G0}",
            f'spec.devices[0].attributes[n]: Invalid value: "": exactly one value must be '
            f"specified {G0}",
            'spec.devices[0].attributes[two]: Invalid value: {"IntValue":1,"BoolValue":true,'
            '"StringValue":null,"VersionValue":null,"IntValues":null,"BoolValues":null,'
            f'"StringValues":null,"VersionValues":null}}: exactly one value must be specified {G0}',
            f'spec.devices[0].attributes[vs].versions[0]: Invalid value: "1.0": {SEMVER} {G0}',
            "spec.devices[0].attributes[vs].versions[1]: Too long: may not be more than 64 "
            f"bytes {G0}",
            "spec.devices[0].attributes[ss].strings[1]: Too long: may not be more than 64 "
            f"bytes {G0}",
        ],
    ),
    (
        "a version list item that is not semver",
        dev(attributes={"vs": {"versions": ["1.0.0", "v2"]}}),
        [f'spec.devices[0].attributes[vs].versions[1]: Invalid value: "v2": {SEMVER} {G0}'],
    ),
    (
        "request policy on a device for one claim",
        dev(capacity={"m": {"value": "1", "requestPolicy": {"default": "1"}}}),
        [
            "spec.devices[0].capacity[m].requestPolicy: Forbidden: allowMultipleAllocations must "
            f"be true {G0}"
        ],
    ),
    (
        "taint value, effect, key, missing effect",
        dev(
            taints=[
                {"key": "k", "value": "bad value", "effect": "Sometimes"},
                {"key": "bad key"},
            ]
        ),
        [
            f'spec.devices[0].taints[0].value: Invalid value: "bad value": {LABEL_VALUE} {G0}',
            'spec.devices[0].taints[0].effect: Unsupported value: "Sometimes": supported values: '
            f'"NoExecute", "NoSchedule", "None" {G0}',
            f'spec.devices[0].taints[1].key: Invalid value: "bad key": {NAME_PART} {G0}',
            f"spec.devices[0].taints[1].effect: Required value {G0}",
        ],
    ),
    (
        "too many taints",
        dev(taints=[{"key": "k", "effect": "None"}] * 17),
        [f"spec.devices[0].taints: Too many: 17: must have at most 16 items {G0}"],
    ),
    (
        "too many counter consumptions",
        dev(consumesCounters=[{"counterSet": "s", "counters": {"c": {"value": "1"}}}] * 3),
        [f"spec.devices[0].consumesCounters: Too many: 3: must have at most 2 items {G0}"],
    ),
    (
        "counter consumptions",
        dev(
            consumesCounters=[
                {"counterSet": "s", "counters": {"C": {"value": "1"}}},
                {"counterSet": "s"},
            ]
        ),
        [
            f'spec.devices[0].consumesCounters[0].counters: Invalid value: "C": {LABEL} {G0}',
            f"spec.devices[0].consumesCounters[1].counters: Required value {G0}",
            f'spec.devices[0].consumesCounters[1]: Duplicate value: "s" {G0}',
        ],
    ),
    (
        "counter consumption: set name and too many counters",
        dev(consumesCounters=[{"counterSet": "Bad", "counters": counters(33)}]),
        [
            f'spec.devices[0].consumesCounters[0].counterSet: Invalid value: "Bad": {LABEL} {G0}',
            "spec.devices[0].consumesCounters[0].counters: Too many: 33: must have at most 32 "
            f"items {G0}",
        ],
    ),
    (
        "counter consumption without a set name",
        dev(consumesCounters=[{"counters": {"c": {"value": "1"}}}]),
        [f"spec.devices[0].consumesCounters[0].counterSet: Required value {G0}"],
    ),
    (
        "per-device node fields without per-device node selection",
        dev(nodeName="n1"),
        [
            "spec.devices[0]: Invalid value: null: `nodeName`, `nodeSelector` and `allNodes` can "
            "only be set if `perDeviceNodeSelection` is set to true in the ResourceSlice spec "
            f"{G0}"
        ],
    ),
    (
        "binding conditions: name, duplicates, overlap",
        dev(bindingConditions=["a", "a", "b!"], bindingFailureConditions=["c", "c", "a"]),
        [
            'spec.devices[0].bindingConditions[2]: Invalid value: "b!": '
            f"{names.qualified_name('b!')[0]} {G0}",
            f'spec.devices[0].bindingConditions[1]: Duplicate value: "a" {G0}',
            f'spec.devices[0].bindingFailureConditions[1]: Duplicate value: "c" {G0}',
            'spec.devices[0].bindingFailureConditions[2]: Invalid value: "a": '
            f"bindingFailureConditions must not overlap with bindingConditions {G0}",
        ],
    ),
    (
        "binding conditions: too many of both",
        dev(bindingConditions=list("abcde"), bindingFailureConditions=list("fghij")),
        [
            f"spec.devices[0].bindingConditions: Too many: 5: must have at most 4 items {G0}",
            "spec.devices[0].bindingFailureConditions: Too many: 5: must have at most 4 items "
            f"{G0}",
        ],
    ),
    (
        "a bad binding failure condition name",
        dev(bindingConditions=["a"], bindingFailureConditions=["b!"]),
        [
            'spec.devices[0].bindingFailureConditions[0]: Invalid value: "b!": '
            f"{names.qualified_name('b!')[0]} {G0}"
        ],
    ),
    (
        "failure conditions alone",
        dev(bindingFailureConditions=["a"]),
        [
            "spec.devices[0].bindingConditions: Invalid value: null: bindingConditions are "
            f"required to use bindingFailureConditions {G0}"
        ],
    ),
    (
        "conditions alone",
        dev(bindingConditions=["a"]),
        [
            "spec.devices[0].bindingFailureConditions: Invalid value: null: "
            f"bindingFailureConditions are required to use bindingConditions {G0}"
        ],
    ),
]


@pytest.mark.parametrize(
    ("device", "expected"), [c[1:] for c in DEVICE_CASES], ids=[c[0] for c in DEVICE_CASES]
)
def test_device_error_text(device: Obj, expected: list[str]) -> None:
    assert lines(slice_with([device])) == expected


def test_per_device_node_selection_text() -> None:
    obj = slice_with(
        [dev(nodeName="", allNodes=False), dev("gpu-1", nodeName="Bad_Node", allNodes=True)],
        perDeviceNodeSelection=True,
    )
    assert lines(without(obj, "nodeName")) == [
        f'spec.devices[0].nodeName: Invalid value: "": must not be empty {G0}',
        f"spec.devices[0].allNodes: Invalid value: false: must be either unset or set to true {G0}",
        f"spec.devices[0]: Required value: {PER_DEVICE} {G0}",
        f"spec.devices[1].nodeName: Invalid value: \"Bad_Node\": {SUBDOMAIN} (device 'gpu-1')",
        f'spec.devices[1]: Invalid value: "{{`nodeName`, `allNodes`}}": {PER_DEVICE} '
        "(device 'gpu-1')",
    ]
    selector = {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In"}]}]
    }
    obj = slice_with([dev(nodeSelector=selector, nodeName="n1")], perDeviceNodeSelection=True)
    assert [e.path for e in validate.validate(without(obj, "nodeName"))] == [
        "spec.devices[0].nodeSelector.nodeSelectorTerms[0].matchFields[0].values",
        "spec.devices[0]",
    ]
    assert lines(obj)[-1] == (
        f'spec.devices[0]: Invalid value: "{{`nodeName`, `nodeSelector`}}": {PER_DEVICE} {G0}'
    )


def test_an_unnamed_device_has_no_device_hint() -> None:
    assert lines(slice_with([dev("", taints=[{"key": "k"}])])) == [
        f'spec.devices[0].name: Invalid value: "": {names.dns_label("")[0]}',
        "spec.devices[0].taints[0].effect: Required value",
    ]


# --- the slice --------------------------------------------------------------------------------


def test_node_selection_text() -> None:
    obj = slice_with([dev()])
    obj["spec"]["nodeName"] = ""
    assert lines(obj) == [
        'spec.nodeName: Invalid value: "": must be either unset or set to a non-empty string',
        f"spec: Required value: {NODE_SELECTION}",
    ]
    assert lines(without(slice_with([dev()]), "nodeName")) == [
        f"spec: Required value: {NODE_SELECTION}"
    ]
    assert lines(slice_with([dev()], allNodes=True, perDeviceNodeSelection=True)) == [
        'spec: Invalid value: "{`nodeName`, `allNodes`, `perDeviceNodeSelection`}": '
        f"{NODE_SELECTION}, but multiple fields are set",
        f"spec.devices[0]: Required value: {PER_DEVICE} {G0}",
    ]
    assert lines(slice_with([dev()], allNodes=False, perDeviceNodeSelection=False)) == [
        "spec.allNodes: Invalid value: false: must be either unset or set to true",
        "spec.perDeviceNodeSelection: Invalid value: false: must be either unset or set to true",
    ]
    obj = without(slice_with([dev()], nodeSelector={"nodeSelectorTerms": []}), "nodeName")
    assert lines(obj) == [
        "spec.nodeSelector.nodeSelectorTerms: Required value: must have at least one node "
        "selector term",
        "spec.nodeSelector.nodeSelectorTerms: Invalid value: null: must have exactly one node "
        "selector term",
    ]
    term = {"matchExpressions": [{"key": "zone", "operator": "Exists"}]}
    obj = without(slice_with([dev()], nodeSelector={"nodeSelectorTerms": [term, term]}), "nodeName")
    assert lines(obj) == [
        "spec.nodeSelector.nodeSelectorTerms: Invalid value: "
        '[{"matchExpressions":[{"key":"zone","operator":"Exists"}]},'
        '{"matchExpressions":[{"key":"zone","operator":"Exists"}]}]: '
        "must have exactly one node selector term"
    ]
    obj = without(slice_with([dev()], nodeSelector={"nodeSelectorTerms": [term]}), "nodeName")
    assert lines(obj) == []
    obj = slice_with([dev()], nodeSelector={"nodeSelectorTerms": [term]})
    assert lines(obj) == [
        'spec: Invalid value: "{`nodeName`, `nodeSelector`}": '
        f"{NODE_SELECTION}, but multiple fields are set"
    ]


def test_pool_text() -> None:
    obj = slice_with([dev()])
    obj["spec"]["pool"] = {"name": "a" * 254, "generation": -2, "resourceSliceCount": -1}
    assert lines(obj) == [
        "spec.pool.name: Too long: may not be more than 253 bytes",
        f'spec.pool.name: Invalid value: "{"a" * 254}": must be no more than 253 characters',
        "spec.pool.resourceSliceCount: Invalid value: -1: must be greater than zero",
        "spec.pool.generation: Invalid value: -2: must be greater than or equal to zero",
    ]
    obj["spec"]["pool"] = {"name": "a" * 253, "generation": 0, "resourceSliceCount": 1}
    assert lines(obj) == []
    obj["spec"]["pool"] = {"name": "A/b_", "resourceSliceCount": 1}
    assert lines(obj) == [
        f'spec.pool.name: Invalid value: "A": {SUBDOMAIN}',
        f'spec.pool.name: Invalid value: "b_": {SUBDOMAIN}',
    ]
    obj["spec"]["pool"] = {"resourceSliceCount": 1}
    assert lines(obj) == ["spec.pool.name: Required value"]
    obj["spec"]["pool"] = {"name": "n1"}
    assert lines(obj) == [
        "spec.pool.resourceSliceCount: Invalid value: 0: must be greater than zero"
    ]


def test_device_list_text() -> None:
    assert lines(slice_with([dev(), dev("gpu-1"), dev()])) == [
        f'spec.devices[2]: Duplicate value: "gpu-0" {G0}'
    ]
    assert lines(slice_with([dev(f"d{i}") for i in range(129)])) == [
        "spec.devices: Too many: 129: must have at most 128 items"
    ]
    assert lines(slice_with([dev(f"d{i}") for i in range(128)])) == []
    lowering: list[tuple[str, Any]] = [
        ("taints", [{"key": "k", "effect": "None"}]),
        ("attributes", {"l": {"ints": [1]}}),
        ("attributes", {"l": {"bools": [True]}}),
        ("attributes", {"l": {"strings": ["x"]}}),
        ("attributes", {"l": {"versions": ["1.0.0"]}}),
        ("consumesCounters", [{"counterSet": "s", "counters": {"c": {"value": "1"}}}]),
    ]
    for field, value in lowering:
        devices = [dev(f"d{i}") for i in range(65)]
        devices[64][field] = value
        assert lines(slice_with(devices)) == [
            "spec.devices: Too many: 65: must have at most 64 items"
        ], field
        assert lines(slice_with(devices[1:])) == [], field
    plain = [dev(f"d{i}", attributes={"a": {"int": 1}, "b": {"string": "x"}}) for i in range(65)]
    assert lines(slice_with(plain)) == []


def test_counter_set_text() -> None:
    shared = [
        {"name": "Bad_", "counters": {"c": {"value": "1"}}},
        {"name": "s"},
        {"name": "s", "counters": {"c": {}}},
        {"name": "t", "counters": counters(33)},
        {"counters": {"c": {}}},
        {"counters": {"c": {}}},
    ]
    obj = without(slice_with([], sharedCounters=shared), "devices")
    assert lines(obj) == [
        f'spec.sharedCounters[0].name: Invalid value: "Bad_": {LABEL}',
        "spec.sharedCounters[1].counters: Required value",
        "spec.sharedCounters[3].counters: Too many: 33: must have at most 32 items",
        "spec.sharedCounters[4].name: Required value",
        "spec.sharedCounters[5].name: Required value",
        'spec.sharedCounters[2]: Duplicate value: "s"',
        'spec.sharedCounters[5]: Duplicate value: ""',
    ]
    eight = [{"name": f"s{i}", "counters": {"c": {}}} for i in range(8)]
    assert lines(without(slice_with([], sharedCounters=eight), "devices")) == []
    nine = [*eight, {"name": "Bad"}]
    assert lines(without(slice_with([], sharedCounters=nine), "devices")) == [
        "spec.sharedCounters: Too many: 9: must have at most 8 items"
    ]
    both = slice_with([], sharedCounters=[{"name": "s", "counters": {"c": {"value": "1"}}}])
    assert lines(both) == [
        'spec: Invalid value: "": only one of `sharedCounters` or `devices` is allowed'
    ]


def test_decode_text() -> None:
    obj = slice_with([dev()])
    obj["apiVersion"], obj["kind"] = "resource.k8s.io/v2", "Slice"
    assert lines(obj) == [
        "apiVersion 'resource.k8s.io/v2' is not 'resource.k8s.io/v1'",
        "kind 'Slice' is not 'ResourceSlice'",
    ]
    assert [e.path for e in validate.validate(obj)] == ["apiVersion", "kind"]
    for key in ("apiVersion", "kind"):
        obj[key] = ""
    assert lines(obj) == []
    del obj["apiVersion"], obj["kind"]
    assert lines(obj) == []


def test_immutable_text() -> None:
    old = slice_with([dev()])
    new = slice_with([dev()], driver="other.example.com")
    new["spec"]["pool"]["name"] = "n2"
    assert [str(e) for e in validate.validate_update(old, new)] == [
        'spec.pool.name: Invalid value: "n2": field is immutable',
        'spec.driver: Invalid value: "other.example.com": field is immutable',
    ]
    assert validate.validate_update(old, slice_with([dev()])) == []


def test_slice_invalid_names_the_slice() -> None:
    obj = slice_with([dev("GPU")])
    with pytest.raises(validate.SliceInvalid) as info:
        validate.check(obj)
    assert info.value.name == "n1-gpu.nvidia.com-0"
    assert info.value.status == 422
    assert [str(e) for e in info.value.errors] == lines(obj)
    assert str(info.value) == (
        'ResourceSlice.resource.k8s.io "n1-gpu.nvidia.com-0" is invalid: '
        f"spec.devices[0].name: Invalid value: \"GPU\": {LABEL} (device 'GPU')"
    )
    obj["metadata"] = {"generateName": "n1-"}
    with pytest.raises(validate.SliceInvalid) as info:
        validate.check(obj)
    assert info.value.name == "n1-"
    obj["metadata"] = {}
    with pytest.raises(validate.SliceInvalid) as info:
        validate.check(obj)
    assert info.value.name == "?"
    obj["kind"] = "Slice"
    with pytest.raises(validate.SliceInvalid) as info:
        validate.check(obj)
    assert info.value.status == 400
    assert str(info.value) == (
        'ResourceSlice in version "v1" cannot be handled as a ResourceSlice: '
        "kind 'Slice' is not 'ResourceSlice'"
    )


def test_validate_metadata_of_a_namespaced_object() -> None:
    assert [str(e) for e in validate.validate_metadata({"name": "x"}, namespaced=True)] == [
        "metadata.namespace: Required value"
    ]
    assert validate.validate_metadata({"name": "x", "namespace": "default"}, namespaced=True) == []
    assert [str(e) for e in validate.validate_metadata({"name": "x", "namespace": "d"})] == [
        "metadata.namespace: Forbidden: not allowed on this type"
    ]


def test_long_keys_are_shortened_in_the_middle_beyond_96_characters() -> None:
    fits = "a" * 48 + "b" * 48
    assert attrnames.map_key_path("p", fits) == f"p[{fits}]"
    key = "a" * 48 + "b" * 49
    assert attrnames.map_key_path("p", key) == f"p[{'a' * 47}...{'b' * 46}]"
    key = "x" + "a" * 100 + "yz"
    assert attrnames.map_key_path("p", key) == f"p[x{'a' * 46}...{'a' * 44}yz]"
    assert attrnames.MAX_KEY_LEN == 96


def test_fully_qualified_names_need_a_domain() -> None:
    assert attrnames.fully_qualified_name_errors("c.matchAttribute", "example.com/x") == []
    assert [str(e) for e in attrnames.fully_qualified_name_errors("c.m", "model")] == [
        'c.m: Invalid value: "model": a fully qualified name must be a domain and a name '
        "separated by a slash"
    ]
    assert [str(e) for e in attrnames.fully_qualified_name_errors("c.m", "9x")] == [
        f'c.m: Invalid value: "9x": {names.c_identifier("9x")[0]}',
        'c.m: Invalid value: "9x": a fully qualified name must be a domain and a name '
        "separated by a slash",
    ]
    assert [str(e) for e in attrnames.fully_qualified_name_errors("c.m", "/x")] == [
        'c.m: Invalid value: "": the domain must not be empty'
    ]


def test_every_per_device_limit_is_inclusive() -> None:
    at_limit = dev(
        attributes={
            **{f"a{i}": {"int": i} for i in range(28)},
            "s": {"string": "y" * 64},
            "v": {"version": "1.2.3-" + "a" * 58},
            "l": {"strings": ["z" * 64]},
        },
        capacity=counters(1),
        taints=[{"key": f"k{i}", "effect": "None"} for i in range(16)],
        consumesCounters=[
            {"counterSet": "s", "counters": counters(32)},
            {"counterSet": "t", "counters": counters(32)},
        ],
        bindingConditions=["a", "b", "c", "d"],
        bindingFailureConditions=["e", "f", "g", "h"],
    )
    assert len(at_limit["attributes"]) + len(at_limit["capacity"]) == 32
    assert lines(slice_with([at_limit])) == []
    shared = [{"name": f"s{i}", "counters": counters(32)} for i in range(8)]
    assert lines(without(slice_with([], sharedCounters=shared), "devices")) == []
