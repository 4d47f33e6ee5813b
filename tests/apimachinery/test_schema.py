"""Our compact field layout (strict decoding) matches the ``resource.k8s.io/v1`` OpenAPI
document field for field, so an unknown field is refused exactly where the server refuses it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dra_driver.apimachinery import schema

REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "reference"
OPENAPI = REFERENCE / "apis__resource.k8s.io__v1_openapi.json"
PREFIXES = (
    "io.k8s.api.resource.v1.",
    "io.k8s.apimachinery.pkg.apis.meta.v1.",
    "io.k8s.api.core.v1.",
)
SCALARS = {"string": "string", "boolean": "bool", "integer": "int"}
SPECIAL = {
    "Quantity": "quantity",
    "Time": "time",
    "RawExtension": "json",
    "FieldsV1": "json",
    "MicroTime": "time",
}


def components() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(OPENAPI.read_text(encoding="utf-8"))
    return dict(doc["components"]["schemas"])


def short(ref: str) -> str:
    return ref.rsplit("/", 1)[-1].rsplit(".", 1)[-1]


def notation(prop: dict[str, Any]) -> str:
    """The OpenAPI property in our type notation."""
    ref = prop.get("$ref") or (prop.get("allOf") or [{}])[0].get("$ref")
    if ref:
        name = short(ref)
        return SPECIAL.get(name, name)
    kind = prop.get("type")
    if kind == "array":
        return f"[{notation(prop['items'])}]"
    if kind == "object":
        return "{" + notation(prop["additionalProperties"]) + "}"
    return SCALARS[kind]


@pytest.mark.parametrize("type_name", sorted(schema.TYPES))
def test_layout_matches_openapi(type_name: str) -> None:
    schemas = components()
    matches = [
        v
        for k, v in schemas.items()
        if k.startswith(PREFIXES) and k.rsplit(".", 1)[-1] == type_name
    ]
    assert matches, f"{type_name} not in the OpenAPI document"
    expected = {name: notation(p) for name, p in matches[0]["properties"].items()}
    assert schema.TYPES[type_name] == expected


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
    assert schema.storage_form("ResourceSlice", obj) == {
        "spec": {"driver": "d", "pool": {"name": "p", "generation": 0}},
        "metadata": {"name": "x"},
    }
    cls = {"spec": {"config": [{"opaque": {"driver": "d", "parameters": {}}}]}}
    assert schema.storage_form("DeviceClass", cls) == cls
