"""Local slice validation rule by rule, beyond the recorded verdicts: each case says what the
v1.36 server's ``pkg/apis/resource/validation`` does with it (field path, kind of error,
message), so a rule fitted to the recorded cases alone would fail here."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dra_driver.apimachinery import fielderrors
from dra_driver.slices import taintrules, validate

from .conftest import Obj, slice_with

C_ID_MSG = "a valid C identifier must start with alphabetic character or '_'"
SUBDOMAIN_MSG = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric"
LABEL_MSG = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters"
NAME_PART_MSG = "name part must consist of alphanumeric characters, '-', '_' or '.'"


def errors_of(obj: Obj) -> list[tuple[str, str, str]]:
    """(path, kind, detail) of every error, in order."""
    return [(e.path, e.kind.value, e.detail) for e in validate.validate(obj)]


def paths(obj: Obj) -> list[str]:
    return [e.path for e in validate.validate(obj)]


def dev(name: str = "gpu-0", **fields: Any) -> Obj:
    return {"name": name, **fields}


def attrs(**attributes: Any) -> Obj:
    return slice_with([dev(attributes=attributes)])


# --- attribute and capacity names (validateQualifiedName) -------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "x" * 32,  # DeviceMaxIDLength
        ("d" * 63) + "/" + ("y" * 32),  # DeviceMaxDomainLength + identifier
        "Example.COM/x",  # the domain is a driver name: checked lower-cased
        "_private",
        "a/b/c",  # more than one '/': the v1.36 server does not check such names at all
        "a//b",
    ],
)
def test_attribute_names_the_server_accepts(key: str) -> None:
    assert paths(attrs(**{key: {"int": 1}})) == []


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("x" * 33, [("Too long", "may not be more than 32 bytes")]),
        ("9lives", [("Invalid value", C_ID_MSG)]),
        ("nvlink-island", [("Invalid value", C_ID_MSG)]),
        # too long *and* not an identifier: both, length first
        ("." * 33, [("Too long", "may not be more than 32 bytes"), ("Invalid value", C_ID_MSG)]),
        # an empty domain or name part is an invalid value, not a missing one
        ("/x", [("Invalid value", "the domain must not be empty")]),
        ("example.com/", [("Invalid value", "the name must not be empty")]),
        (
            "/",
            [
                ("Invalid value", "the domain must not be empty"),
                ("Invalid value", "the name must not be empty"),
            ],
        ),
        ("d" * 64 + "/x", [("Too long", "may not be more than 63 bytes")]),
        (
            "_" * 64 + "/x",  # too long and not a subdomain: both
            [("Too long", "may not be more than 63 bytes"), ("Invalid value", SUBDOMAIN_MSG)],
        ),
        ("bad_domain!/x", [("Invalid value", SUBDOMAIN_MSG)]),
        (
            "d" * 64 + "/" + "y" * 33,
            [
                ("Too long", "may not be more than 63 bytes"),
                ("Too long", "may not be more than 32 bytes"),
            ],
        ),
    ],
)
def test_attribute_name_errors_are_reported_on_the_map(
    key: str, expected: list[tuple[str, str]]
) -> None:
    got = errors_of(attrs(**{key: {"int": 1}}))
    assert [path for path, _, _ in got] == ["spec.devices[0].attributes"] * len(expected)
    assert [
        (kind, detail[: len(want)])
        for (_, kind, detail), (_, want) in zip(got, expected, strict=True)
    ] == [(kind, want) for kind, want in expected]


def test_capacity_names_follow_the_same_rule() -> None:
    obj = slice_with([dev(capacity={"bad-name": {"value": "1"}, "ok/": {"value": "1"}})])
    assert errors_of(obj) == [
        (
            "spec.devices[0].capacity",
            "Invalid value",
            errors_of(attrs(**{"bad-name": {"int": 1}}))[0][2],
        ),
        ("spec.devices[0].capacity", "Invalid value", "the name must not be empty"),
    ]


def test_a_very_long_key_is_shortened_in_the_item_path() -> None:
    key = "k" * 200
    (name_error, value_error) = validate.validate(attrs(**{key: {}}))
    assert name_error.path == "spec.devices[0].attributes"
    assert value_error.path == f"spec.devices[0].attributes[{'k' * 47}...{'k' * 46}]"


# --- attribute values (validateDeviceAttribute) -----------------------------------------------


@pytest.mark.parametrize(
    ("attribute", "expected"),
    [
        ({"version": "v1.2.3"}, [("attributes[a].version", "Invalid value")]),
        ({"version": "1.2"}, [("attributes[a].version", "Invalid value")]),
        # a too-long version is both not semver and too long
        (
            {"version": "x" * 65},
            [("attributes[a].version", "Invalid value"), ("attributes[a].version", "Too long")],
        ),
        ({"version": "1.2.3-" + "a" * 60}, [("attributes[a].version", "Too long")]),
        ({"string": "y" * 65}, [("attributes[a].string", "Too long")]),
        ({"string": "é" * 33}, [("attributes[a].string", "Too long")]),  # 66 bytes
        ({}, [("attributes[a]", "Invalid value")]),
        ({"int": 1, "string": "x"}, [("attributes[a]", "Invalid value")]),
        # an empty list is "set": invalid, and it counts towards "exactly one"
        ({"ints": []}, [("attributes[a].ints", "Invalid value")]),
        (
            {"ints": [1], "strings": []},
            [("attributes[a].strings", "Invalid value"), ("attributes[a]", "Invalid value")],
        ),
        ({"strings": ["ok", "x" * 65]}, [("attributes[a].strings[1]", "Too long")]),
        ({"versions": ["1.0.0", "1.0"]}, [("attributes[a].versions[1]", "Invalid value")]),
    ],
)
def test_attribute_values(attribute: Obj, expected: list[tuple[str, str]]) -> None:
    got = [(p.removeprefix("spec.devices[0]."), k) for p, k, _ in errors_of(attrs(a=attribute))]
    assert got == expected


def test_empty_lists_and_two_values_use_the_servers_wording() -> None:
    (error,) = validate.validate(attrs(a={"bools": []}))
    assert str(error).startswith(
        "spec.devices[0].attributes[a].bools: Invalid value: []: must not be empty if specified"
    )
    (error,) = validate.validate(attrs(a={"int": 1, "string": "a"}))
    assert str(error).startswith(
        "spec.devices[0].attributes[a]: Invalid value: "
        '{"IntValue":1,"BoolValue":null,"StringValue":"a","VersionValue":null,"IntValues":null,'
        '"BoolValues":null,"StringValues":null,"VersionValues":null}: exactly one value must be '
        "specified"
    )


def test_null_attribute_is_the_empty_attribute() -> None:
    assert paths(attrs(a=None)) == ["spec.devices[0].attributes[a]"]


def test_attribute_values_count_list_items_and_every_set_field() -> None:
    many = {f"l{i}": {"strings": ["x"]} for i in range(30)}
    many["big"] = {"ints": list(range(18))}  # 30 + 18 = 48: at the limit
    assert paths(attrs(**many)) == []
    many["big"] = {"ints": list(range(19))}
    (error,) = validate.validate(attrs(**many))
    assert (error.path, error.value) == ("spec.devices[0]", 49)
    assert "the total number of attribute values must not exceed 48" in str(error)
    # two fields set in one attribute count twice (and are an error of their own)
    mixed = {f"l{i}": {"strings": ["x"]} for i in range(30)}
    mixed["m"] = {"ints": list(range(18)), "int": 1}
    assert paths(attrs(**mixed)) == ["spec.devices[0]", "spec.devices[0].attributes[m]"]


def test_attributes_and_capacities_together_at_most_32() -> None:
    device = dev(
        attributes={f"a{i}": {"int": i} for i in range(20)},
        capacity={f"c{i}": {"value": "1"} for i in range(13)},
    )
    assert errors_of(slice_with([device])) == [
        (
            "spec.devices[0]",
            "Invalid value",
            "the total number of attributes and capacities must not exceed 32",
        )
    ]


# --- taints (validateDeviceTaint) -------------------------------------------------------------


def taint_errors(**taint: Any) -> list[tuple[str, str, str]]:
    return [
        (p.removeprefix("spec.devices[0].taints[0]."), k, d[:40])
        for p, k, d in errors_of(slice_with([dev(taints=[taint])]))
    ]


@pytest.mark.parametrize(
    "taint",
    [
        {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"},
        {"key": "k", "effect": "None"},
        {"key": "K_1.x", "value": "", "effect": "NoExecute", "timeAdded": "2026-11-22T00:00:00Z"},
        {"key": "a" * 63, "effect": "None"},
    ],
)
def test_valid_taints(taint: Obj) -> None:
    assert taint_errors(**taint) == []


def test_an_empty_taint_key_fails_the_label_name_rule_twice_not_as_required() -> None:
    assert taint_errors(key="", effect="None") == [
        ("key", "Invalid value", "name part must be non-empty"),
        ("key", "Invalid value", NAME_PART_MSG[:40]),
    ]
    assert taint_errors() == [
        ("key", "Invalid value", "name part must be non-empty"),
        ("key", "Invalid value", NAME_PART_MSG[:40]),
        ("effect", "Required value", ""),
    ]


@pytest.mark.parametrize(
    ("key", "details"),
    [
        ("bad key", [NAME_PART_MSG]),
        ("a" * 64, ["name part must be no more than 63 characters"]),
        ("-a", [NAME_PART_MSG]),
        ("/k", ["prefix part must be non-empty"]),
        ("Bad.Domain/k", [f"prefix part {SUBDOMAIN_MSG}"]),
        ("a/b/c", ["a qualified name must consist of alphanumeric characters"]),
        ("example.com/", ["name part must be non-empty", NAME_PART_MSG]),
    ],
)
def test_taint_keys_are_label_names(key: str, details: list[str]) -> None:
    got = taint_errors(key=key, effect="None")
    assert [(p, k) for p, k, _ in got] == [("key", "Invalid value")] * len(details)
    assert [d for _, _, d in got] == [want[:40] for want in details]


def test_taint_values_are_label_values_only_when_set() -> None:
    assert taint_errors(key="k", value="", effect="None") == []
    assert taint_errors(key="k", value="bad value", effect="None") == [
        ("value", "Invalid value", "a valid label must be an empty string or")
    ]
    assert [k for _, k, _ in taint_errors(key="k", value="v" * 64, effect="None")] == [
        "Invalid value"
    ]


def test_taint_effect_required_and_one_of_three() -> None:
    assert taint_errors(key="k") == [("effect", "Required value", "")]
    (error,) = validate.validate(slice_with([dev(taints=[{"key": "k", "effect": "Sometimes"}])]))
    assert str(error).startswith(
        'spec.devices[0].taints[0].effect: Unsupported value: "Sometimes": supported values: '
        '"NoExecute", "NoSchedule", "None"'
    )
    assert taint_errors(key="k", effect="PreferNoSchedule")[0][1] == "Unsupported value"


def test_too_many_taints_stops_checking_them() -> None:
    taints = [{"key": "", "effect": "Bad"}] * 17
    assert errors_of(slice_with([dev(taints=taints)])) == [
        ("spec.devices[0].taints", "Too many", "must have at most 16 items")
    ]


def test_tainted_devices_lower_the_slice_limit_to_64() -> None:
    devices = [dev(f"d{i}") for i in range(65)]
    assert paths(slice_with(devices)) == []
    devices[3]["taints"] = [{"key": "k", "effect": "None"}]
    assert paths(slice_with(devices)) == ["spec.devices"]


def test_unchanged_taints_are_not_checked_again_on_update() -> None:
    old = slice_with([dev(taints=[{"key": "k", "effect": "Sometimes"}])])
    new = copy.deepcopy(old)
    new["spec"]["devices"][0]["attributes"] = {"a": {"int": 1}}
    assert validate.validate_update(old, new) == []
    new["spec"]["devices"][0]["taints"].append({"key": "j", "effect": "Bad"})
    assert [e.path for e in validate.validate_update(old, new)] == [
        "spec.devices[0].taints[0].effect",
        "spec.devices[0].taints[1].effect",
    ]


def taint_lines(*taints: Obj) -> list[str]:
    """Each error as the server words it (our rendering adds the device's name)."""
    return [str(e) for e in validate.validate(slice_with([dev(taints=list(taints))]))]


G0 = "(device 'gpu-0')"
LABEL_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
    "'my_value',  or '12345', regex used for validation is "
    "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)
NAME_PART_FULL = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and "
    "end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex "
    "used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)


@pytest.mark.parametrize(
    "key",
    [
        "k",
        "K",  # the name part may have upper case
        "a" * 63,  # qualifiedNameMaxLength
        "a" + "-_." * 20 + "z",
        ("d" * 253) + "/k",  # the prefix is a DNS subdomain: up to 253
        "gpu.nvidia.com/" + "x" * 63,
        "1/2",
    ],
)
def test_taint_keys_the_server_accepts(key: str) -> None:
    assert taint_lines({"key": key, "effect": "NoSchedule"}) == []


def test_taint_key_boundaries_word_errors_like_the_server() -> None:
    assert taint_lines({"key": ("d" * 254) + "/k", "effect": "None"}) == [
        f'spec.devices[0].taints[0].key: Invalid value: "{"d" * 254}/k": '
        f"prefix part must be no more than 253 characters {G0}"
    ]
    assert taint_lines({"key": "a" * 64, "effect": "None"}) == [
        f'spec.devices[0].taints[0].key: Invalid value: "{"a" * 64}": '
        f"name part must be no more than 63 characters {G0}"
    ]
    # Go's regexp `$` is the end of the text: a trailing newline is a bad character
    assert taint_lines({"key": "gpu\n", "effect": "None"}) == [
        f'spec.devices[0].taints[0].key: Invalid value: "gpu\\n": {NAME_PART_FULL} {G0}'
    ]


@pytest.mark.parametrize("value", ["", "v", "V" * 63, "79", "a.b-c_d", "1.2.3"])
def test_taint_values_the_server_accepts(value: str) -> None:
    assert taint_lines({"key": "k", "value": value, "effect": "NoExecute"}) == []


def test_taint_value_boundaries_word_errors_like_the_server() -> None:
    assert taint_lines({"key": "k", "value": "v" * 64, "effect": "None"}) == [
        f'spec.devices[0].taints[0].value: Invalid value: "{"v" * 64}": '
        f"must be no more than 63 characters {G0}"
    ]
    assert taint_lines({"key": "k", "value": "v\n", "effect": "None"}) == [
        f'spec.devices[0].taints[0].value: Invalid value: "v\\n": {LABEL_VALUE_MSG} {G0}'
    ]
    # Go measures len() in bytes: 32 two-byte characters are too long *and* malformed
    assert [
        e.detail
        for e in validate.validate(
            slice_with([dev(taints=[{"key": "k", "value": "é" * 32, "effect": "None"}])])
        )
    ] == ["must be no more than 63 characters", LABEL_VALUE_MSG]


@pytest.mark.parametrize("effect", ["None", "NoSchedule", "NoExecute"])
def test_each_device_taint_effect_is_accepted(effect: str) -> None:
    assert taint_lines({"key": "k", "effect": effect}) == []


@pytest.mark.parametrize("effect", ["none", "noschedule", "PreferNoSchedule", " None"])
def test_other_effects_are_unsupported_values(effect: str) -> None:
    assert taint_lines({"key": "k", "effect": effect}) == [
        f'spec.devices[0].taints[0].effect: Unsupported value: "{effect}": supported values: '
        f'"NoExecute", "NoSchedule", "None" {G0}'
    ]


def test_sixteen_taints_are_the_most_and_repeats_are_allowed() -> None:
    # validateSlice, not validateSet: unlike node taints, the same key and effect may repeat
    same = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoExecute"}
    assert taint_lines(*[same] * 16) == []
    assert taint_lines(*[same] * 17) == [
        f"spec.devices[0].taints: Too many: 17: must have at most 16 items {G0}"
    ]


@pytest.mark.parametrize(
    "added",
    [
        "2026-11-22T00:00:00Z",
        "0001-01-01T00:00:00Z",  # the Go zero time
        "0000-01-01T00:00:00Z",  # year 0: Go accepts it
        "2099-01-01T00:00:00Z",  # in the future: no rule against it
        "2026-11-22T00:00:00+24:00",  # Go's parser allows offsets of 24 hours or 60 minutes
        "2026-11-22T00:00:00-05:60",
        "2026-11-22T7:00:00Z",  # a one-digit hour
        "2026-11-22T00:00:00,5Z",  # a comma before the fraction
    ],
)
def test_time_added_is_not_validated_beyond_decoding(added: str) -> None:
    assert taint_lines({"key": "k", "effect": "NoSchedule", "timeAdded": added}) == []


def test_sixty_four_tainted_devices_per_slice() -> None:
    tainted = [dev(f"d{i}", taints=[{"key": "k", "effect": "None"}]) for i in range(65)]
    assert paths(slice_with(tainted[:64])) == []
    assert [str(e) for e in validate.validate(slice_with(tainted))] == [
        "spec.devices: Too many: 65: must have at most 64 items"
    ]
    untainted = [dev(f"d{i}", taints=[]) for i in range(65)]  # an empty list is no taint
    assert paths(slice_with(untainted)) == []


def stale(**taint: Any) -> Obj:
    """A stored slice whose taint a 1.36 server would refuse now (e.g. an effect of a newer
    server, which consumers must treat like None)."""
    return slice_with([dev(taints=[{"key": "k", "effect": "Later", **taint}])])


@pytest.mark.parametrize(
    "resent",
    [
        {"key": "k", "effect": "Later", "value": ""},  # "" and unset are the same string
        {"key": "k", "effect": "Later", "timeAdded": None},
    ],
)
def test_an_update_compares_taints_semantically(resent: Obj) -> None:
    old = stale()
    new = copy.deepcopy(old)
    new["spec"]["devices"][0]["taints"] = [resent]
    assert validate.validate_update(old, new) == []


@pytest.mark.parametrize(
    "spelling",
    [
        "2026-11-22T05:30:00+05:30",
        "2026-11-22T00:00:00.000000000Z",
        "2026-11-23T00:00:00+24:00",
        "2026-11-22T00:00:00,0Z",
    ],
)
def test_an_update_compares_time_added_as_an_instant(spelling: str) -> None:
    # apiequality.Semantic compares metav1.Time values with a.UTC() == b.UTC()
    old = stale(timeAdded="2026-11-22T00:00:00Z")
    new = copy.deepcopy(old)
    new["spec"]["devices"][0]["taints"][0]["timeAdded"] = spelling
    assert validate.validate_update(old, new) == []


@pytest.mark.parametrize(
    "change",
    [
        {"timeAdded": "2026-11-22T00:00:00.5Z"},  # another instant (nanoseconds count)
        {"timeAdded": None},  # unset is not a time (the server would default it to now)
        {"value": "v"},
        {"key": "j"},
    ],
)
def test_a_changed_taint_list_is_checked_whole_on_update(change: Obj) -> None:
    old = stale(timeAdded="2026-11-22T00:00:00Z")
    new = copy.deepcopy(old)
    taint = new["spec"]["devices"][0]["taints"][0]
    taint.update(change)
    if taint.get("timeAdded") is None:
        taint.pop("timeAdded")
    assert validate.validate_update(old, new) == [
        fielderrors.not_supported(
            "spec.devices[0].taints[0].effect",
            "Later",
            taintrules.TAINT_EFFECTS,
            device="gpu-0",
        )
    ]


def test_an_update_checks_taints_of_a_new_device_and_of_a_reordered_list() -> None:
    old = slice_with(
        [dev(taints=[{"key": "a", "effect": "Later"}, {"key": "b", "effect": "None"}])]
    )
    new = copy.deepcopy(old)
    new["spec"]["devices"][0]["taints"].reverse()
    assert paths_update(old, new) == ["spec.devices[0].taints[1].effect"]
    new = copy.deepcopy(old)
    new["spec"]["devices"][0]["name"] = "gpu-1"  # no old device of that name
    assert paths_update(old, new) == ["spec.devices[0].taints[0].effect"]


def paths_update(old: Obj, new: Obj) -> list[str]:
    return [e.path for e in validate.validate_update(old, new)]


# --- device names, list limits, counters, node selection, binding conditions -------------------


@pytest.mark.parametrize(
    ("name", "detail"),
    [
        ("", LABEL_MSG),  # an empty name is an invalid label, not a missing value
        ("gpu.0", "must not contain dots"),  # a subdomain but not a label
        ("GPU-0", LABEL_MSG),
    ],
)
def test_device_names_are_dns_labels(name: str, detail: str) -> None:
    ((path, kind, got),) = errors_of(slice_with([dev(name)]))
    assert (path, kind) == ("spec.devices[0].name", "Invalid value")
    assert got.startswith(detail)


def test_too_many_devices_short_circuits_and_duplicates_come_after_device_errors() -> None:
    devices = [dev("GPU")] * 129
    assert errors_of(slice_with(devices)) == [
        ("spec.devices", "Too many", "must have at most 128 items")
    ]
    assert paths(slice_with([dev("a"), dev("B"), dev("a")])) == [
        "spec.devices[1].name",
        "spec.devices[2]",
    ]


def test_per_device_node_fields_need_per_device_node_selection() -> None:
    assert errors_of(slice_with([dev(nodeName="n1", allNodes=True)])) == [
        (
            "spec.devices[0]",
            "Invalid value",
            "`nodeName`, `nodeSelector` and `allNodes` can only be set if "
            "`perDeviceNodeSelection` is set to true in the ResourceSlice spec",
        )
    ]


def test_per_device_node_selection() -> None:
    spec = {"nodeName": None, "perDeviceNodeSelection": True}

    def check(device: Obj) -> list[str]:
        obj = slice_with([device], **spec)
        obj["spec"] = {k: v for k, v in obj["spec"].items() if v is not None}
        return [f"{p}: {k}" for p, k, _ in errors_of(obj)]

    assert check(dev(nodeName="n1")) == []
    assert check(dev(allNodes=True)) == []
    assert check(dev()) == ["spec.devices[0]: Required value"]
    assert check(dev(nodeName="", allNodes=False)) == [
        "spec.devices[0].nodeName: Invalid value",
        "spec.devices[0].allNodes: Invalid value",
        "spec.devices[0]: Required value",
    ]
    assert check(dev(nodeName="n1", allNodes=True)) == ["spec.devices[0]: Invalid value"]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"driver": ""}, [("spec.driver", "Required value")]),
        ({"driver": "d" * 64}, [("spec.driver", "Too long")]),
        ({"driver": "D" * 64}, [("spec.driver", "Too long")]),  # upper case is fine
        ({"driver": "-" * 64}, [("spec.driver", "Too long"), ("spec.driver", "Invalid value")]),
        (
            {"pool": {"name": "n1", "generation": -1, "resourceSliceCount": 0}},
            [
                ("spec.pool.resourceSliceCount", "Invalid value"),
                ("spec.pool.generation", "Invalid value"),
            ],
        ),
        (
            {"pool": {"name": "A/B", "generation": 0, "resourceSliceCount": 1}},
            [("spec.pool.name", "Invalid value"), ("spec.pool.name", "Invalid value")],
        ),
        ({"pool": {"resourceSliceCount": 1}}, [("spec.pool.name", "Required value")]),
        (
            {"nodeName": None, "allNodes": False},
            [("spec.allNodes", "Invalid value"), ("spec", "Required value")],
        ),
        ({"allNodes": False}, [("spec.allNodes", "Invalid value")]),
        ({"nodeName": ""}, [("spec.nodeName", "Invalid value"), ("spec", "Required value")]),
        ({"nodeName": "Not_A_Node"}, [("spec.nodeName", "Invalid value")]),
        ({"allNodes": True}, [("spec", "Invalid value")]),
        (
            {"nodeName": None, "nodeSelector": {"nodeSelectorTerms": []}},
            [
                ("spec.nodeSelector.nodeSelectorTerms", "Required value"),
                ("spec.nodeSelector.nodeSelectorTerms", "Invalid value"),
            ],
        ),
        (
            {
                "nodeName": None,
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "zone", "operator": "In", "values": ["-1"]},
                                {"key": "k", "operator": "Exists", "values": ["x"]},
                            ],
                            "matchFields": [{"key": "spec.x", "operator": "In", "values": ["a"]}],
                        }
                    ]
                },
            },
            [
                (
                    "spec.nodeSelector.nodeSelectorTerms[0].matchExpressions[0].values[0]",
                    "Invalid value",
                ),
                ("spec.nodeSelector.nodeSelectorTerms[0].matchExpressions[1].values", "Forbidden"),
                ("spec.nodeSelector.nodeSelectorTerms[0].matchFields[0].key", "Invalid value"),
            ],
        ),
        (
            {"sharedCounters": [{"name": "s", "counters": {"c": {"value": "1"}}}]},
            [("spec", "Invalid value")],
        ),
    ],
)
def test_spec_rules(spec: Obj, expected: list[tuple[str, str]]) -> None:
    obj = slice_with([dev()])
    obj["spec"].update(spec)
    obj["spec"] = {k: v for k, v in obj["spec"].items() if v is not None}
    assert [(p, k) for p, k, _ in errors_of(obj)] == expected


def test_counter_sets() -> None:
    def check(counters: list[Obj]) -> list[tuple[str, str]]:
        obj = slice_with([], sharedCounters=counters)
        del obj["spec"]["devices"]
        return [(p, k) for p, k, _ in errors_of(obj)]

    assert check([{"name": "s", "counters": {"c": {}}}]) == []  # any parsed quantity is valid
    assert check([{"counters": {"c": {"value": "1"}}}]) == [
        ("spec.sharedCounters[0].name", "Required value")
    ]
    assert check([{"name": "s", "counters": {"Bad": {"value": "1"}}}]) == [
        ("spec.sharedCounters[0].counters", "Invalid value")
    ]
    assert check([{"name": "s"}]) == [("spec.sharedCounters[0].counters", "Required value")]
    assert check([{"name": "s", "counters": {f"c{i}": {} for i in range(33)}}]) == [
        ("spec.sharedCounters[0].counters", "Too many")
    ]
    same = {"name": "s", "counters": {"c": {}}}
    assert check([same, same]) == [("spec.sharedCounters[1]", "Duplicate value")]
    assert check([{"name": "Bad"}] * 9) == [("spec.sharedCounters", "Too many")]


def test_counter_consumption() -> None:
    use = {"counterSet": "s", "counters": {"c": {"value": "1"}}}
    assert paths(slice_with([dev(consumesCounters=[use, use])])) == [
        "spec.devices[0].consumesCounters[1]"
    ]
    assert paths(slice_with([dev(consumesCounters=[use] * 3)])) == [
        "spec.devices[0].consumesCounters"
    ]
    assert errors_of(slice_with([dev(consumesCounters=[{"counters": {"c": {}}}])]))[0][:2] == (
        "spec.devices[0].consumesCounters[0].counterSet",
        "Required value",
    )


def test_binding_conditions() -> None:
    def check(conditions: Any, failures: Any) -> list[tuple[str, str]]:
        device = dev(bindingConditions=conditions, bindingFailureConditions=failures)
        return [
            (p.removeprefix("spec.devices[0]."), k) for p, k, _ in errors_of(slice_with([device]))
        ]

    assert check(["example.com/ready", "b"], ["c"]) == []
    assert check(["a"], None) == [("bindingFailureConditions", "Invalid value")]
    assert check(None, ["a"]) == [("bindingConditions", "Invalid value")]
    assert check(["a", "a"], ["b"]) == [("bindingConditions[1]", "Duplicate value")]
    assert check(["a"], ["b", "a"]) == [("bindingFailureConditions[1]", "Invalid value")]
    assert check(["a!"], ["b"]) == [("bindingConditions[0]", "Invalid value")]
    assert check(["a", "b", "c", "d", "e"], ["f"]) == [("bindingConditions", "Too many")]


def test_request_policy_is_for_multi_allocatable_devices_only() -> None:
    cap = {"value": "10", "requestPolicy": {"default": "1", "validValues": ["1", "5"]}}
    assert errors_of(slice_with([dev(capacity={"m": cap})])) == [
        (
            "spec.devices[0].capacity[m].requestPolicy",
            "Forbidden",
            "allowMultipleAllocations must be true",
        )
    ]
    assert paths(slice_with([dev(capacity={"m": cap}, allowMultipleAllocations=True)])) == []


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ({"default": "2", "validValues": ["1", "2"]}, []),
        ({"validValues": ["1"]}, [("default", "Required value")]),
        ({"default": "3", "validValues": ["1", "2"]}, [("validValues", "Invalid value")]),
        ({"default": "1", "validValues": ["2", "1"]}, [("validValues[1]", "Invalid value")]),
        ({"default": "1", "validValues": ["1", "20"]}, [("validValues[1]", "Invalid value")]),
        ({"default": "1", "validValues": ["1", "1"]}, [("validValues[1]", "Duplicate value")]),
        (
            {"default": "1", "validValues": ["1"], "validRange": {"min": "1"}},
            [("", "Forbidden")],
        ),
        ({"default": "2", "validRange": {"min": "1", "max": "9", "step": "1"}}, []),
        ({"default": "2", "validRange": {}}, [("validRange.min", "Required value")]),
        ({"default": "0", "validRange": {"min": "1"}}, [("validRange.min", "Invalid value")]),
        (  # min above the capacity, and the default below min: both
            {"default": "2", "validRange": {"min": "11"}},
            [("validRange.min", "Invalid value"), ("validRange.min", "Invalid value")],
        ),
        (  # the default is not a whole number of steps above min (max 9 is)
            {"default": "2", "validRange": {"min": "1", "max": "9", "step": "2"}},
            [("validRange.step", "Invalid value")],
        ),
        (
            {"default": "3", "validRange": {"min": "1", "max": "8", "step": "2"}},
            [("validRange.step", "Invalid value")],
        ),
        (
            {"default": "1", "validRange": {"min": "1", "step": "10"}},
            [("validRange.step", "Invalid value")],
        ),
    ],
)
def test_request_policies(policy: Obj, expected: list[tuple[str, str]]) -> None:
    device = dev(
        capacity={"m": {"value": "10", "requestPolicy": policy}}, allowMultipleAllocations=True
    )
    prefix = "spec.devices[0].capacity[m].requestPolicy"
    got = [
        (p.removeprefix(prefix).removeprefix("."), k) for p, k, _ in errors_of(slice_with([device]))
    ]
    assert got == expected


# --- metadata, decoding, errors for operators ---------------------------------------------------


def test_metadata_rules() -> None:
    obj = slice_with([dev()])
    obj["metadata"] = {
        "name": "n1",
        "namespace": "default",
        "labels": {"bad key": "bad value"},
        "annotations": {"Bad Key": "x"},
        "ownerReferences": [
            {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u", "controller": True},
            {"apiVersion": "", "kind": "Node", "name": "n2", "uid": "", "controller": True},
        ],
    }
    assert [(p, k) for p, k, _ in errors_of(obj)] == [
        ("metadata.namespace", "Forbidden"),
        ("metadata.labels", "Invalid value"),
        ("metadata.labels", "Invalid value"),
        ("metadata.annotations", "Invalid value"),
        ("metadata.ownerReferences[1].apiVersion", "Invalid value"),
        ("metadata.ownerReferences[1].uid", "Invalid value"),
        ("metadata.ownerReferences", "Invalid value"),
    ]
    obj["metadata"] = {"generateName": "n1-gpu-"}
    assert paths(obj) == []
    obj["metadata"] = {}
    assert paths(obj) == ["metadata.name"]


def test_decode_errors_come_alone() -> None:
    obj = slice_with([dev(name=7, capacity={"m": {"value": "lots"}})])
    obj["spec"]["extra"] = True
    errors = validate.validate(obj)
    # the quantity aborts decoding (an UnmarshalJSON error) before anything else is reported
    assert [(e.path, e.status) for e in errors] == [("spec.devices[0].capacity[m].value", 400)]
    obj["spec"]["devices"][0]["capacity"]["m"]["value"] = 80  # a bare number is a quantity
    assert [e.path for e in validate.validate(obj)] == ["spec.devices[0].name"]
    obj["spec"]["devices"][0]["name"] = "gpu-0"
    assert [e.detail for e in validate.validate(obj)] == ['unknown field "spec.extra"']
    del obj["spec"]["extra"]
    assert validate.validate(obj) == []


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
    assert [e.path for e in validate.validate_update(old, new)] == ["spec.pool.name", "spec.driver"]
    new = copy.deepcopy(old)
    new["spec"]["nodeName"] = "n2"
    (error,) = validate.validate_update(old, new)
    assert str(error) == 'spec.nodeName: Invalid value: "n2": field is immutable'


def test_kind_names_render_like_the_server() -> None:
    assert fielderrors.Kind.TOO_LONG.value == "Too long"
