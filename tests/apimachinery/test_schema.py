"""Strict decoding as a v1.36 API server does it: our compact field layout matches the 1.36 JSON
schemas field for field (so an unknown field is refused exactly where the server refuses it), and
the JSON type rules of Go's decoder: what fails decoding (400) and what decodes and goes on to
validation."""

from __future__ import annotations

import functools
import json
import os
from typing import Any

import kubernetes_validate
import pytest

from dra_driver.apimachinery import fielderrors, rfc3339, schema, strictdecode

# The Kubernetes 1.36 JSON schemas shipped by the kubernetes-validate dev dependency.
SCHEMAS_136 = os.path.join(
    os.path.dirname(kubernetes_validate.__file__),
    "kubernetes-json-schema",
    "v1.36.0-local-strict",
    "_definitions.json",
)
PREFIXES = (
    "io.k8s.api.resource.v1.",
    "io.k8s.apimachinery.pkg.apis.meta.v1.",
    "io.k8s.api.core.v1.",
)
SPECIAL = {
    "Quantity": "quantity",
    "Time": "time",
    "RawExtension": "json",
    "FieldsV1": "json",
    "MicroTime": "time",
}


@functools.cache
def definitions() -> dict[str, Any]:
    with open(SCHEMAS_136, encoding="utf-8") as f:
        defs: dict[str, Any] = json.load(f)["$defs"]
    return defs


def notation(prop: dict[str, Any]) -> str:
    """A 1.36 schema property in our type notation."""
    ref = prop.get("$ref") or (prop.get("allOf") or [{}])[0].get("$ref")
    if ref:
        name = ref.rsplit("/", 1)[-1].rsplit(".", 1)[-1]
        return SPECIAL.get(name, name)
    kind = prop.get("type")
    kind = next(k for k in kind if k != "null") if isinstance(kind, list) else kind
    if kind == "array":
        return f"[{notation(prop['items'])}]"
    if kind == "object":
        return "{" + notation(prop["additionalProperties"]) + "}"
    return {"string": "string", "boolean": "bool", "integer": "int"}[kind]


@pytest.mark.parametrize("type_name", sorted(schema.TYPES))
def test_layout_matches_the_136_schemas(type_name: str) -> None:
    matches = [
        definitions()[prefix + type_name]
        for prefix in PREFIXES
        if prefix + type_name in definitions()
    ]
    assert matches, f"{type_name} not in the 1.36 schemas"
    expected = {name: notation(p) for name, p in matches[0]["properties"].items()}
    assert schema.TYPES[type_name] == expected


def slice_obj(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "driver": "gpu.nvidia.com",
        "nodeName": "n1",
        "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
        "devices": [{"name": "gpu-0", "capacity": {"memory": {"value": "80Gi"}}}],
    }
    base.update(spec)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "spec": base}


def decode(obj: dict[str, Any]) -> list[str]:
    return [e.detail for e in strictdecode.decode_errors("ResourceSlice", obj)]


@pytest.mark.parametrize(
    "field", ["skipNodeOperations", "partitionTypeAttribute"]
)  # master fields a 1.36 server does not know
def test_fields_newer_than_136_are_unknown(field: str) -> None:
    obj = slice_obj(**{field: "x"})
    assert decode(obj) == [f'unknown field "spec.{field}"']
    device = slice_obj()["spec"]["devices"][0]
    device["nodeAllocatableResources"] = {}
    assert decode(slice_obj(devices=[device])) == [
        'unknown field "spec.devices[0].nodeAllocatableResources"'
    ]


def test_136_alpha_field_node_allocatable_resource_mappings_is_known() -> None:
    device = {"name": "gpu-0", "nodeAllocatableResourceMappings": {"cpu": {"capacityKey": "c"}}}
    assert decode(slice_obj(devices=[device])) == []


@pytest.mark.parametrize(
    "value", ["80Gi", 80, 1.5, " 80Gi ", "1e3", -1, 0]
)  # Quantity.UnmarshalJSON: a string (trimmed) or a bare JSON number
def test_quantity_accepts_strings_and_numbers(value: Any) -> None:
    device = {"name": "gpu-0", "capacity": {"memory": {"value": value}}}
    assert decode(slice_obj(devices=[device])) == []


@pytest.mark.parametrize("value", ["lots", "", True, [], {}, "1.2.3"])
def test_quantity_rejects_what_parse_quantity_rejects(value: Any) -> None:
    device = {"name": "gpu-0", "capacity": {"memory": {"value": value}}}
    (detail,) = decode(slice_obj(devices=[device]))
    assert detail.startswith("quantities must match the regular expression")


def test_a_quantity_given_as_a_number_is_stored_as_a_string() -> None:
    device = {"name": "gpu-0", "capacity": {"memory": {"value": 80}}}
    stored = strictdecode.storage_form("ResourceSlice", slice_obj(devices=[device]))
    assert stored["spec"]["devices"][0]["capacity"]["memory"]["value"] == "80"


@pytest.mark.parametrize(
    ("pool", "message"),
    [
        (
            {"name": "n1", "generation": "1", "resourceSliceCount": 1},
            "json: cannot unmarshal string into Go struct field ResourcePool.spec.pool.generation"
            " of type int64",
        ),
        (
            {"name": "n1", "generation": 1, "resourceSliceCount": 1.5},
            "json: cannot unmarshal number 1.5 into Go struct field"
            " ResourcePool.spec.pool.resourceSliceCount of type int64",
        ),
        (  # an integral float is still not an integer to strconv.ParseInt
            {"name": "n1", "generation": 2.0, "resourceSliceCount": 1},
            "json: cannot unmarshal number 2.0 into Go struct field"
            " ResourcePool.spec.pool.generation of type int64",
        ),
        (
            {"name": "n1", "generation": 2**63, "resourceSliceCount": 1},
            f"json: cannot unmarshal number {2**63} into Go struct field"
            " ResourcePool.spec.pool.generation of type int64",
        ),
        (
            {"name": 7, "generation": 1, "resourceSliceCount": 1},
            "json: cannot unmarshal number into Go struct field ResourcePool.spec.pool.name"
            " of type string",
        ),
        (
            {"name": "n1", "generation": True, "resourceSliceCount": 1},
            "json: cannot unmarshal bool into Go struct field ResourcePool.spec.pool.generation"
            " of type int64",
        ),
    ],
)
def test_int64_and_string_fields_take_only_their_json_type(
    pool: dict[str, Any], message: str
) -> None:
    assert decode(slice_obj(pool=pool)) == [message]


def test_int64_bounds_are_accepted() -> None:
    for value in (2**63 - 1, -(2**63)):
        assert decode(slice_obj(pool={"name": "n1", "generation": value})) == []


def test_bool_fields_reject_strings_and_lists_reject_objects() -> None:
    assert decode(slice_obj(nodeName=None, allNodes="true")) == [
        "json: cannot unmarshal string into Go struct field ResourceSliceSpec.spec.allNodes"
        " of type bool"
    ]
    assert decode(slice_obj(devices={"name": "gpu-0"})) == [
        "json: cannot unmarshal object into Go struct field ResourceSliceSpec.spec.devices"
        " of type []v1.Device"
    ]
    device = {"name": "gpu-0", "bindingConditions": [1]}
    assert decode(slice_obj(devices=[device])) == [
        "json: cannot unmarshal number into Go struct field Device.spec.devices.bindingConditions"
        " of type string"
    ]


def test_a_type_error_comes_alone_and_the_first_one_wins_over_unknown_fields() -> None:
    obj = slice_obj(pool={"name": 1, "generation": "x"}, extra=True)
    (only,) = strictdecode.decode_errors("ResourceSlice", obj)
    assert only.path == "spec.pool.name" and only.status == 400
    status, message = fielderrors.status_message("ResourceSlice", "x", [only])
    assert status == 400 and "strict decoding error" not in message


def test_unknown_fields_are_all_reported_together() -> None:
    obj = slice_obj(extra=True)
    obj["spec"]["devices"][0]["basic"] = {}
    assert decode(obj) == ['unknown field "spec.devices[0].basic"', 'unknown field "spec.extra"']
    _, message = fielderrors.status_message(
        "ResourceSlice", "x", strictdecode.decode_errors("ResourceSlice", obj)
    )
    assert message.endswith(
        'strict decoding error: unknown field "spec.devices[0].basic", unknown field "spec.extra"'
    )


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("2026-11-22T00:00:00Z", True),
        ("2026-11-22T00:00:00.123456Z", True),
        ("2026-11-22T00:00:00+05:30", True),
        ("2026-11-22t00:00:00Z", False),  # Go's RFC 3339 layout wants an upper-case T
        ("2026-11-22T00:00:00z", False),
        ("2026-11-22T00:00:00", False),  # no zone
        ("2026-02-30T00:00:00Z", False),  # no such day
        ("2026-11-22T24:00:00Z", False),
        ("2026-11-22", False),
    ],
)
def test_times_must_be_rfc3339_as_go_parses_it(value: str, ok: bool) -> None:
    device = {"name": "gpu-0", "taints": [{"key": "k", "effect": "None", "timeAdded": value}]}
    errors = decode(slice_obj(devices=[device]))
    assert (errors == []) == ok, errors


def test_a_time_that_is_not_a_string_fails_like_go() -> None:
    device = {"name": "gpu-0", "taints": [{"key": "k", "effect": "None", "timeAdded": 5}]}
    assert decode(slice_obj(devices=[device])) == [
        "json: cannot unmarshal number into Go value of type string"
    ]


def test_null_is_the_zero_value_everywhere() -> None:
    obj = slice_obj(devices=[None, {"name": None, "attributes": {"a": None}}], allNodes=None)
    assert decode(obj) == []
    spec = strictdecode.decoded("ResourceSlice", obj)["spec"]
    assert spec["devices"] == [{}, {"attributes": {"a": {}}}]
    assert "allNodes" not in spec


def test_empty_lists_survive_decoding_for_validation() -> None:
    device = {"name": "gpu-0", "attributes": {"l": {"ints": []}}}
    spec = strictdecode.decoded("ResourceSlice", slice_obj(devices=[device]))["spec"]
    assert spec["devices"][0]["attributes"]["l"] == {"ints": []}


def test_every_resource_type_reachable_from_the_three_kinds_is_described() -> None:
    seen: set[str] = set()
    todo = ["ResourceSlice", "ResourceClaim", "DeviceClass"]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for typ in schema.TYPES[name].values():
            inner = typ.strip("[]{}")
            if inner in schema.TYPES:
                todo.append(inner)
    assert seen == set(schema.TYPES)


def test_storage_form_drops_empty_fields_but_keeps_free_json() -> None:
    obj = {
        "spec": {"devices": [], "driver": "d", "pool": {"name": "p", "generation": 0}},
        "metadata": {"name": "x", "labels": {}},
    }
    assert strictdecode.storage_form("ResourceSlice", obj) == {
        "spec": {"driver": "d", "pool": {"name": "p", "generation": 0}},
        "metadata": {"name": "x"},
    }
    cls = {"spec": {"config": [{"opaque": {"driver": "d", "parameters": {}}}]}}
    assert strictdecode.storage_form("DeviceClass", cls) == cls


def test_maps_take_only_objects_and_their_values_are_decoded_with_their_struct() -> None:
    device = {"name": "gpu-0", "attributes": "x"}
    assert decode(slice_obj(devices=[device])) == [
        "json: cannot unmarshal string into Go struct field Device.spec.devices.attributes"
        " of type map[string]v1.DeviceAttribute"
    ]
    device = {"name": "gpu-0", "attributes": {"a": {"int": "1"}}}
    (error,) = strictdecode.decode_errors("ResourceSlice", slice_obj(devices=[device]))
    assert error.path == "spec.devices[0].attributes[a].int"
    assert error.detail == (
        "json: cannot unmarshal string into Go struct field DeviceAttribute"
        ".spec.devices.attributes.int of type int64"
    )
    assert decode(slice_obj(devices=[{"name": "gpu-0", "attributes": {"a": []}}])) == [
        "json: cannot unmarshal array into Go struct field Device.spec.devices.attributes"
        " of type v1.DeviceAttribute"
    ]
    assert decode(slice_obj(driver=["d"])) == [
        "json: cannot unmarshal array into Go struct field ResourceSliceSpec.spec.driver"
        " of type string"
    ]


def test_decode_error_paths_name_the_field() -> None:
    device = {"name": "gpu-0", "taints": [{"key": "k", "effect": "None", "timeAdded": "x"}]}
    (error,) = strictdecode.decode_errors("ResourceSlice", slice_obj(devices=[device]))
    assert error.path == "spec.devices[0].taints[0].timeAdded"
    assert error.detail.startswith('parsing time "x" as "2006-01-02T15:04:05Z07:00"')
    device["taints"][0]["timeAdded"] = 7
    (error,) = strictdecode.decode_errors("ResourceSlice", slice_obj(devices=[device]))
    assert error.path == "spec.devices[0].taints[0].timeAdded"
    obj = slice_obj()
    obj["spec"]["pool"]["extra"] = 1
    (error,) = strictdecode.decode_errors("ResourceSlice", obj)
    assert (error.path, error.status) == ("spec.pool.extra", 400)
    (error,) = strictdecode.decode_errors("ResourceSlice", ["not", "an", "object"])
    assert (error.path, error.detail) == ("", "expected a JSON object for ResourceSlice")


def test_a_quantity_error_quotes_the_reason_only() -> None:
    device = {"name": "gpu-0", "capacity": {"memory": {"value": "a: b"}}}
    (error,) = strictdecode.decode_errors("ResourceSlice", slice_obj(devices=[device]))
    assert error.detail.startswith("quantities must match the regular expression")
    device["capacity"]["memory"]["value"] = "Ei"
    (error,) = strictdecode.decode_errors("ResourceSlice", slice_obj(devices=[device]))
    assert error.detail.startswith("unable to parse numeric part of quantity")


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("2026-11-22T00:00:59Z", True),
        ("2026-11-22T00:00:60Z", False),  # seconds are range-checked too
        ("2026-11-22T23:59:00+23:59", True),
        # Go's general parser tests the offset with `hr > 24` / `mm > 60`, not >=: "some
        # people do write offsets of 24 hours or 60 minutes" (time/format.go, parse).
        ("2026-11-22T00:00:00+24:00", True),
        ("2026-11-22T00:00:00-05:60", True),
        ("2026-11-22T00:00:00+24:60", True),
        ("2026-11-22T00:00:00+25:00", False),
        ("2026-11-22T00:00:00-00:61", False),
        ("2026-13-01T00:00:00Z", False),
        ("2026-00-01T00:00:00Z", False),
        ("2026-11-00T00:00:00Z", False),
        ("2026-11-31T00:00:00Z", False),
        ("2024-02-29T00:00:00Z", True),  # leap years as Go's isLeap has them
        ("2000-02-29T00:00:00Z", True),
        ("1900-02-29T00:00:00Z", False),
        ("0000-02-29T00:00:00Z", True),  # year 0 exists for Go (and is a leap year)
        ("0000-01-01T00:00:00Z", True),
        ("9999-12-31T23:59:59Z", True),
    ],
)
def test_time_fields_and_offsets_are_range_checked(value: str, ok: bool) -> None:
    device = {"name": "gpu-0", "taints": [{"key": "k", "effect": "None", "timeAdded": value}]}
    assert (decode(slice_obj(devices=[device])) == []) is ok


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("2026-11-22T7:00:00Z", True),  # the general parser reads the hour ("15") as 1-2 digits
        ("2026-11-22T007:00:00Z", False),
        ("2026-11-22T00:0:00Z", False),  # minutes, seconds, month and day have two digits
        ("2026-1-22T00:00:00Z", False),
        ("2026-11-22T00:00:00,5Z", True),  # a fraction may follow a comma too
        ("2026-11-22T00:00:00.123456789123Z", True),  # any number of digits, truncated
        ("2026-11-22T00:00:00.Z", False),  # a separator without a digit
        ("2026-11-22T00:00:00Z\n", False),  # nothing may follow the zone
        ("2026-11-22T00:00:00Z ", False),
        ("\uff12\uff10\uff12\uff16-11-22T00:00:00Z", False),  # ASCII digits only
        ("2026-11-22T00:00:00+0530", False),
        ("2026-11-22T00:00:00 05:30", False),
    ],
)
def test_times_are_read_like_gos_general_rfc3339_parser(value: str, ok: bool) -> None:
    device = {"name": "gpu-0", "taints": [{"key": "k", "effect": "None", "timeAdded": value}]}
    assert (decode(slice_obj(devices=[device])) == []) is ok


def test_time_instant_is_the_same_for_every_spelling_of_a_time() -> None:
    utc = rfc3339.time_instant("2026-11-22T00:00:00Z")
    assert utc == 1_795_305_600 * 10**9
    assert rfc3339.time_instant("2026-11-22T05:30:00+05:30") == utc
    assert rfc3339.time_instant("2026-11-23T00:00:00+24:00") == utc
    assert rfc3339.time_instant("2026-11-22T00:00:00.000Z") == utc
    assert rfc3339.time_instant("2026-11-22T00:00:00,000000001Z") == utc + 1
    assert rfc3339.time_instant("2026-11-22T00:00:00.0000000019Z") == utc + 1  # truncated
    assert rfc3339.time_instant("1970-01-01T00:00:00Z") == 0
    # 366 days (year 0 is a leap year) from 0000-01-01 to the Go zero time 0001-01-01
    zero = rfc3339.time_instant("0001-01-01T00:00:00Z")
    assert zero == -62_135_596_800 * 10**9
    assert rfc3339.time_instant("0000-01-01T00:00:00Z") == zero - 366 * 86_400 * 10**9
    assert rfc3339.time_instant("2026-02-30T00:00:00Z") is None


def test_null_list_items_and_map_values_are_zero_values_of_their_type() -> None:
    device = {
        "name": "gpu-0",
        "bindingConditions": [None],
        "attributes": {"i": {"ints": [None]}, "b": {"bools": [None]}, "s": {"strings": [None]}},
        "consumesCounters": [{"counterSet": "s", "counters": {"c": None}}],
    }
    spec = strictdecode.decoded("ResourceSlice", slice_obj(devices=[device]))["spec"]
    got = spec["devices"][0]
    assert got["bindingConditions"] == [""]
    assert got["attributes"] == {
        "i": {"ints": [0]},
        "b": {"bools": [False]},
        "s": {"strings": [""]},
    }
    assert got["consumesCounters"] == [{"counterSet": "s", "counters": {"c": {}}}]
    claim = {
        "spec": {"devices": {"requests": [{"exactly": {"capacity": {"requests": {"m": None}}}}]}}
    }
    requests = strictdecode.decoded("ResourceClaim", claim)["spec"]["devices"]["requests"]
    assert requests[0]["exactly"]["capacity"]["requests"] == {"m": "0"}


def test_storage_form_prunes_inside_lists_and_maps() -> None:
    obj = slice_obj(devices=[{"name": "gpu-0", "taints": [], "attributes": {"a": {"int": 1}}}])
    obj["spec"]["devices"].append({"name": "gpu-1", "capacity": {"m": {"value": 80}}})
    stored = strictdecode.storage_form("ResourceSlice", obj)
    assert stored["spec"]["devices"] == [
        {"name": "gpu-0", "attributes": {"a": {"int": 1}}},
        {"name": "gpu-1", "capacity": {"m": {"value": "80"}}},
    ]


def test_mismatches_of_lists_maps_and_structs_name_the_field_and_the_json_type() -> None:
    cases = [
        (slice_obj(devices="x"), "spec.devices", "string", "[]v1.Device"),
        (
            slice_obj(devices=[{"name": "gpu-0", "attributes": 3}]),
            "spec.devices[0].attributes",
            "number",
            "map[string]v1.DeviceAttribute",
        ),
        (slice_obj(pool="n1"), "spec.pool", "string", "v1.ResourcePool"),
    ]
    for obj, path, got, go_type in cases:
        (error,) = strictdecode.decode_errors("ResourceSlice", obj)
        assert error.path == path
        assert error.detail.startswith(f"json: cannot unmarshal {got} into Go struct field ")
        assert error.detail.endswith(f" of type {go_type}")


def test_minutes_are_range_checked() -> None:
    device = {"name": "gpu-0", "taints": [{"key": "k", "effect": "None"}]}
    device["taints"][0]["timeAdded"] = "2026-11-22T00:60:00Z"
    assert decode(slice_obj(devices=[device])) != []


def test_storage_trims_quantities_and_keeps_free_json_whole() -> None:
    device = {"name": "gpu-0", "capacity": {"memory": {"value": " 80Gi "}}}
    stored = strictdecode.storage_form("ResourceSlice", slice_obj(devices=[device]))
    assert stored["spec"]["devices"][0]["capacity"]["memory"]["value"] == "80Gi"
    params = {"a": {}, "b": [], "c": None, "d": {"e": []}}
    cls = {"spec": {"config": [{"opaque": {"driver": "d", "parameters": params}}]}}
    assert strictdecode.storage_form("DeviceClass", cls) == cls
