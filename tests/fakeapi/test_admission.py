"""ResourceClaim and DeviceClass admission rule by rule, beyond the recorded verdicts: each case
says what the v1.36 server's ``pkg/apis/resource/validation`` does (path and kind of error), so
rules fitted to the recorded cases alone would fail here."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dra_driver.testing.fakeapi import admission

Obj = dict[str, Any]


def claim(*requests: Obj, **devices: Any) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "default"},
        "spec": {"devices": {"requests": list(requests), **devices}},
    }


def exact(name: str = "gpu", **fields: Any) -> Obj:
    return {"name": name, "exactly": {"deviceClassName": "gpu.nvidia.com", **fields}}


def errors(obj: Obj, labels: dict[str, str] | None = None) -> list[tuple[str, str]]:
    obj = copy.deepcopy(obj)
    admission.default_claim(obj)
    found = admission.validate_claim(obj, namespace_labels=labels or {}, cel=None)
    return [(e.path, e.kind.value) for e in found]


REQ = "spec.devices.requests[0]"


def test_a_plain_claim_is_valid_and_defaulted() -> None:
    obj = claim(exact())
    assert errors(obj) == []
    admission.default_claim(obj)
    assert obj["spec"]["devices"]["requests"][0]["exactly"] == {
        "deviceClassName": "gpu.nvidia.com",
        "allocationMode": "ExactCount",
        "count": 1,
    }


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        ({"name": "", "exactly": {"deviceClassName": "c"}}, [(f"{REQ}.name", "Invalid value")]),
        (
            {"name": "gpu.0", "exactly": {"deviceClassName": "c"}},
            [(f"{REQ}.name", "Invalid value")],
        ),
        ({"name": "gpu"}, [(REQ, "Required value")]),
        ({"name": "gpu", "firstAvailable": []}, [(REQ, "Required value")]),
        (
            {"name": "gpu", "exactly": {"deviceClassName": "c"}, "firstAvailable": [{"name": "a"}]},
            [(REQ, "Invalid value")],
        ),
        (exact(allocationMode="Some"), [(f"{REQ}.exactly.allocationMode", "Unsupported value")]),
        (exact(allocationMode="All", count=2), [(f"{REQ}.exactly.count", "Invalid value")]),
        (exact(count=-1), [(f"{REQ}.exactly.count", "Invalid value")]),
        (
            {"name": "gpu", "exactly": {"deviceClassName": "Bad_Class"}},
            [(f"{REQ}.exactly.deviceClassName", "Invalid value")],
        ),
        (exact(selectors=[{}]), [(f"{REQ}.exactly.selectors[0].cel", "Required value")]),
        (
            exact(selectors=[{"cel": {"expression": "x" * 10241}}]),
            [(f"{REQ}.exactly.selectors[0].cel.expression", "Too long")],
        ),
        (
            exact(selectors=[{"cel": {"expression": "true"}}] * 33),
            [(f"{REQ}.exactly.selectors", "Too many")],
        ),
    ],
)
def test_request_rules(request_: Obj, expected: list[tuple[str, str]]) -> None:
    assert errors(claim(request_)) == expected


def test_first_available_subrequests() -> None:
    sub = {"name": "a", "deviceClassName": "c"}
    req = {"name": "gpu", "firstAvailable": [sub, dict(sub, name="")]}
    assert errors(claim(req)) == [(f"{REQ}.firstAvailable[1].name", "Invalid value")]
    req = {"name": "gpu", "firstAvailable": [sub, sub]}
    assert errors(claim(req)) == [(f"{REQ}.firstAvailable[1]", "Duplicate value")]
    req = {"name": "gpu", "firstAvailable": [{"name": "Bad"}] * 9}
    assert errors(claim(req)) == [(f"{REQ}.firstAvailable", "Too many")]


def test_too_many_requests_short_circuits() -> None:
    assert errors(claim(*[exact("Bad")] * 33)) == [("spec.devices.requests", "Too many")]
    assert errors(claim(exact(), exact())) == [("spec.devices.requests[1]", "Duplicate value")]


@pytest.mark.parametrize(
    ("toleration", "expected"),
    [
        ({"key": "k", "operator": "Exists"}, []),
        ({"operator": "Exists"}, []),
        # no pod-toleration rule here: an empty key with Equal, or tolerationSeconds with
        # another effect, are accepted by the DRA validation
        ({"value": "v"}, []),
        ({"key": "k", "effect": "NoSchedule", "tolerationSeconds": 5}, []),
        ({"key": "bad key"}, [("key", "Invalid value")]),
        ({"key": "k", "operator": "Exists", "value": "v"}, [("value", "Invalid value")]),
        ({"key": "k", "value": "bad value"}, [("value", "Invalid value")]),
        ({"key": "k", "operator": "Gt"}, [("operator", "Unsupported value")]),
        ({"key": "k", "effect": "Sometimes"}, [("effect", "Unsupported value")]),
    ],
)
def test_tolerations(toleration: Obj, expected: list[tuple[str, str]]) -> None:
    prefix = f"{REQ}.exactly.tolerations[0]."
    got = errors(claim(exact(tolerations=[toleration])))
    assert [(p.removeprefix(prefix), k) for p, k in got] == expected


def test_toleration_operator_defaults_to_equal() -> None:
    obj = claim(exact(tolerations=[{"key": "k"}]))
    admission.default_claim(obj)
    assert obj["spec"]["devices"]["requests"][0]["exactly"]["tolerations"] == [
        {"key": "k", "operator": "Equal"}
    ]


@pytest.mark.parametrize(
    ("constraint", "expected"),
    [
        ({"matchAttribute": "gpu.nvidia.com/nvlinkIsland"}, []),
        ({"distinctAttribute": "gpu.nvidia.com/uuid"}, []),
        # both set: only matchAttribute is looked at, like the server
        ({"matchAttribute": "gpu.nvidia.com/a", "distinctAttribute": "bad"}, []),
        ({}, [("spec.devices.constraints[0]", "Required value")]),
        (
            {"matchAttribute": ""},  # set but empty: not a C identifier, and no domain
            [
                ("spec.devices.constraints[0].matchAttribute", "Invalid value"),
                ("spec.devices.constraints[0].matchAttribute", "Invalid value"),
            ],
        ),
        (
            {"matchAttribute": "nvlink-island"},
            [
                ("spec.devices.constraints[0].matchAttribute", "Invalid value"),
                ("spec.devices.constraints[0].matchAttribute", "Invalid value"),
            ],
        ),
        (
            {"matchAttribute": "gpu.nvidia.com/a", "requests": ["gpu", "gpu"]},
            [("spec.devices.constraints[0].requests[1]", "Duplicate value")],
        ),
        (
            {"matchAttribute": "gpu.nvidia.com/a", "requests": ["a/b/c"]},
            [("spec.devices.constraints[0].requests[0]", "Invalid value")],
        ),
        (
            {"matchAttribute": "gpu.nvidia.com/a", "requests": ["Nope"]},
            [
                ("spec.devices.constraints[0].requests[0]", "Invalid value"),
                ("spec.devices.constraints[0].requests[0]", "Invalid value"),
            ],
        ),
    ],
)
def test_constraints(constraint: Obj, expected: list[tuple[str, str]]) -> None:
    assert errors(claim(exact(), constraints=[constraint])) == expected


def test_constraint_requests_may_name_subrequests() -> None:
    req = {"name": "gpu", "firstAvailable": [{"name": "big", "deviceClassName": "c"}]}
    ok = {"matchAttribute": "gpu.nvidia.com/a", "requests": ["gpu/big", "gpu"]}
    assert errors(claim(req, constraints=[ok])) == []
    bad = {"matchAttribute": "gpu.nvidia.com/a", "requests": ["gpu/small"]}
    assert errors(claim(req, constraints=[bad])) == [
        ("spec.devices.constraints[0].requests[0]", "Invalid value")
    ]


@pytest.mark.parametrize(
    ("opaque", "expected"),
    [
        ({"driver": "gpu.nvidia.com", "parameters": {"a": 1}}, []),
        (None, [("opaque", "Required value")]),
        ({"driver": "", "parameters": {}}, [("opaque.driver", "Required value")]),
        ({"driver": "GPU.nvidia.com", "parameters": {}}, []),
        ({"driver": "gpu.nvidia.com"}, [("opaque.parameters", "Required value")]),
        ({"driver": "gpu.nvidia.com", "parameters": [1]}, [("opaque.parameters", "Invalid value")]),
        (
            {"driver": "gpu.nvidia.com", "parameters": {"a": "x" * 10300}},
            [("opaque.parameters", "Too long")],
        ),
    ],
)
def test_claim_config(opaque: Obj | None, expected: list[tuple[str, str]]) -> None:
    config = {"opaque": opaque} if opaque is not None else {}
    got = errors(claim(exact(), config=[config]))
    assert [(p.removeprefix("spec.devices.config[0]."), k) for p, k in got] == expected


def test_admin_access_needs_the_namespace_label() -> None:
    obj = claim(exact(adminAccess=True))
    assert errors(obj) == [(f"{REQ}.adminAccess", "Forbidden")]
    assert errors(obj, {admission.ADMIN_ACCESS_LABEL: "true"}) == []


def test_claim_metadata_needs_a_namespace() -> None:
    obj = claim(exact())
    del obj["metadata"]["namespace"]
    assert errors(obj) == [("metadata.namespace", "Required value")]


def test_claim_decode_errors_come_alone() -> None:
    obj = claim(exact(count="2"), extra=1)
    (error,) = admission.validate_claim(obj, namespace_labels={}, cel=None)
    assert error.status == 400
    assert "into Go struct field ExactDeviceRequest.spec.devices.requests.exactly.count" in str(
        error
    )


def klass(**spec: Any) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "gpu.nvidia.com"},
        "spec": spec,
    }


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"extendedResourceName": "nvidia.com/gpu"}, []),
        ({"extendedResourceName": "gpu"}, [("spec.extendedResourceName", "Invalid value")]),
        (
            {"extendedResourceName": "kubernetes.io/gpu"},
            [("spec.extendedResourceName", "Invalid value")],
        ),
        (
            {"extendedResourceName": "requests.nvidia.com/gpu"},
            [("spec.extendedResourceName", "Invalid value")],
        ),
        ({"config": [{}]}, [("spec.config[0].opaque", "Required value")]),
        ({"config": [{}] * 33}, [("spec.config", "Too many")]),
        ({"selectors": [{"cel": {}}]}, [("spec.selectors[0].cel.expression", "Required value")]),
    ],
)
def test_device_class_rules(spec: Obj, expected: list[tuple[str, str]]) -> None:
    got = admission.validate_device_class(klass(**spec), cel=None)
    assert [(e.path, e.kind.value) for e in got] == expected


def test_device_class_is_cluster_scoped() -> None:
    obj = klass()
    obj["metadata"]["namespace"] = "default"
    got = admission.validate_device_class(obj, cel=None)
    assert [(e.path, e.kind.value) for e in got] == [("metadata.namespace", "Forbidden")]
