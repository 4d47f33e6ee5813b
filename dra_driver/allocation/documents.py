"""Kubernetes objects from YAML or JSON files, as the simulator and ``capacity`` read them.

Why it exists apart from :mod:`.simulator`: ``dra-driver capacity`` reads a fleet's exported
ResourceSlices and claims (megabytes) and must start fast, without the allocator and its CEL
engine that the simulator imports. Every problem is a :class:`SimulateError` naming the file
(and document) at fault.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from dra_driver import inputfile, yamlload

CLAIM_KINDS = ("ResourceClaim", "ResourceClaimTemplate")
# The API versions whose claims, classes and slices we read: v1beta2 has v1's fields exactly
# (v1 was promoted from it unchanged); v1beta1 and v1alpha3 have another request layout.
SUPPORTED_VERSIONS = ("resource.k8s.io/v1", "resource.k8s.io/v1beta2")
IGNORED_KINDS = ("Pod", "Deployment", "Job", "Namespace")


class SimulateError(Exception):
    """Bad simulator input; the message names the file (and document) and the reason."""


def parse_documents(text: str, *, source: str) -> list[dict[str, Any]]:
    """All objects of a YAML (multi-document) or JSON text; ``kind: List`` is flattened."""
    docs: list[Any] | None = None
    if text.lstrip()[:1] in ("{", "["):  # JSON (kubectl get -o json): its own, faster parser
        try:
            docs = [json.loads(text)]
        except (ValueError, RecursionError):
            docs = None  # YAML flow style, or broken (or too deep): YAML says which
    try:
        if docs is None:
            docs = yamlload.load_all(text)
    except yaml.YAMLError as err:
        raise SimulateError(f"{source}: not valid YAML or JSON: {err}") from err
    except RecursionError:
        raise SimulateError(f"{source}: nested too deeply to be a Kubernetes object") from None
    out: list[dict[str, Any]] = []
    for i, doc in enumerate(docs):
        if doc is None:
            continue
        items = doc if isinstance(doc, list) else [doc]
        if isinstance(doc, dict) and str(doc.get("kind", "")).endswith("List") and "items" in doc:
            items = doc.get("items") or []
        for item in items:
            if not isinstance(item, dict):
                raise SimulateError(
                    f"{source}: document {i + 1}: expected a mapping, got {type(item).__name__}"
                )
            out.append(item)
    return out


def load_file(path: Path) -> list[dict[str, Any]]:
    """Read and parse a YAML/JSON file of Kubernetes objects."""
    try:
        text = inputfile.read_text(path)
    except inputfile.InputFileError as err:
        raise SimulateError(str(err)) from None
    return parse_documents(text, source=str(path))


def split_kinds(docs: Iterable[dict[str, Any]], *, source: str) -> dict[str, list[dict[str, Any]]]:
    """Group objects by kind (claims, classes, slices); unknown kinds are an error."""
    out: dict[str, list[dict[str, Any]]] = {"claims": [], "classes": [], "slices": []}
    for i, doc in enumerate(docs):
        kind = doc.get("kind")
        version = doc.get("apiVersion")
        ours = kind in (*CLAIM_KINDS, "DeviceClass", "ResourceSlice")
        if ours and version is not None and version not in SUPPORTED_VERSIONS:
            name = (doc.get("metadata") or {}).get("name") or f"object {i + 1}"
            raise SimulateError(
                f"{source}: {kind} {name} is {version}, which this simulator does not "
                f"read; supported: {', '.join(SUPPORTED_VERSIONS)}"
            )
        if kind in CLAIM_KINDS:
            out["claims"].append(doc)
        elif kind == "DeviceClass":
            out["classes"].append(doc)
        elif kind == "ResourceSlice":
            out["slices"].append(doc)
        elif kind in IGNORED_KINDS:
            continue
        else:
            raise SimulateError(
                f"{source}: object {i + 1} has kind {kind!r}; expected "
                "ResourceClaim, ResourceClaimTemplate, DeviceClass, "
                "ResourceSlice or Pod"
            )
    return out
