"""Validate objects against the ``resource.k8s.io/v1`` OpenAPI document in the shared reference,
strictly: every object schema that lists properties also forbids unknown ones (the server's
``fieldValidation=Strict``)."""

from __future__ import annotations

import functools
from typing import Any

import jsonschema
import refdata

OPENAPI = refdata.path("apis__resource.k8s.io__v1_openapi.json")


def _strict(node: Any) -> Any:
    if isinstance(node, dict):
        out = {k: _strict(v) for k, v in node.items()}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [_strict(v) for v in node]
    return node


@functools.cache
def document() -> dict[str, Any]:
    doc: dict[str, Any] = refdata.load_json(OPENAPI.name)
    return doc


@functools.cache
def _validator(kind: str) -> jsonschema.Draft202012Validator:
    schema = {
        "$ref": f"#/components/schemas/io.k8s.api.resource.v1.{kind}",
        "components": _strict(document()["components"]),
    }
    return jsonschema.Draft202012Validator(schema)


def errors(obj: dict[str, Any], kind: str = "ResourceSlice") -> list[str]:
    """Every schema violation of ``obj``, as ``path: message`` lines."""
    return [
        f"{'/'.join(str(p) for p in e.absolute_path)}: {e.message}"
        for e in _validator(kind).iter_errors(obj)
    ]
