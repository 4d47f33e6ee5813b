"""Inputs of the claim simulator: YAML documents, built-in DeviceClasses, slices, examples.

Why it exists: ``dra-driver simulate`` and ``dra-driver demo`` both need to turn files a user
already has (a claim with its Pod, DeviceClasses, exported ResourceSlices, claims that are
already allocated) or a fake GPU profile into the allocator's inputs, and both run the example
claims shipped with the package. Every problem is reported as a :class:`SimulateError` naming
the file and document at fault.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from dra_driver import deviceclasses
from dra_driver.allocation import allocator, capacity, claim, pools
from dra_driver.devices import model
from dra_driver.slices import build as slices_build
from dra_driver.slices import shares

CLAIM_KINDS = ("ResourceClaim", "ResourceClaimTemplate")
IGNORED_KINDS = ("Pod", "Deployment", "Job", "Namespace")


class SimulateError(Exception):
    """Bad simulator input; the message names the file (and document) and the reason."""


@dataclasses.dataclass(frozen=True, slots=True)
class Inputs:
    """Everything one simulation needs."""

    claims: list[dict[str, Any]]
    classes: list[dict[str, Any]]
    slices: list[dict[str, Any]]
    node_name: str
    allocated: set[pools.DeviceId]
    node_devices: model.NodeDevices | None = None
    consumed: capacity.Ledger = dataclasses.field(default_factory=capacity.Ledger)


def parse_documents(text: str, *, source: str) -> list[dict[str, Any]]:
    """All objects of a YAML (multi-document) or JSON text; ``kind: List`` is flattened."""
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as err:
        raise SimulateError(f"{source}: not valid YAML or JSON: {err}") from err
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
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise SimulateError(f"cannot read {path}: {err.strerror}") from err
    return parse_documents(text, source=str(path))


def split_kinds(docs: Iterable[dict[str, Any]], *, source: str) -> dict[str, list[dict[str, Any]]]:
    """Group objects by kind (claims, classes, slices); unknown kinds are an error."""
    out: dict[str, list[dict[str, Any]]] = {"claims": [], "classes": [], "slices": []}
    for i, doc in enumerate(docs):
        kind = doc.get("kind")
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


def builtin_classes(*, driver_name: str = slices_build.DEFAULT_DRIVER_NAME) -> list[dict[str, Any]]:
    """The DeviceClasses the driver ships, selecting ``driver_name``'s devices."""
    return deviceclasses.load_all(driver_name=driver_name)


def merge_classes(*groups: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Later groups override earlier ones by name (user classes over built-in ones)."""
    by_name: dict[str, dict[str, Any]] = {}
    for group in groups:
        for obj in group:
            name = (obj.get("metadata") or {}).get("name")
            if not isinstance(name, str) or not name:
                raise SimulateError("a DeviceClass has no metadata.name")
            by_name[name] = obj
    return list(by_name.values())


def fake_slices(
    devices: model.NodeDevices,
    *,
    node_name: str,
    driver_name: str,
    shareable: shares.Shareable = shares.NONE,
) -> list[dict[str, Any]]:
    """The ResourceSlices the driver would publish for these devices."""
    try:
        built = slices_build.build(
            devices, node_name=node_name, driver_name=driver_name, shareable=shareable
        )
    except slices_build.BuildError as err:
        raise SimulateError(str(err)) from err
    return built.slices


def slice_node(slices: Sequence[Mapping[str, Any]]) -> str | None:
    """The one node all given slices are local to, if there is exactly one."""
    names = {
        str((s.get("spec") or {}).get("nodeName"))
        for s in slices
        if isinstance(s.get("spec"), Mapping) and (s.get("spec") or {}).get("nodeName")
    }
    return names.pop() if len(names) == 1 else None


def allocated_from(docs: Iterable[Any], *, source: str) -> set[pools.DeviceId]:
    """Devices in use according to ResourceClaims (with status) or bare results."""
    try:
        return pools.allocated_ids(docs)
    except pools.SliceError as err:
        raise SimulateError(f"{source}: {err}") from err


def consumed_from(docs: Iterable[Any], *, source: str) -> capacity.Ledger:
    """What shares in ResourceClaims (with status) or bare results consume of shared devices."""
    try:
        return capacity.Ledger.from_allocated(docs)
    except capacity.CapacityError as err:
        raise SimulateError(f"{source}: {err}") from err


def run(inputs: Inputs, *, share_rng: random.Random | None = None) -> list[allocator.Outcome]:
    """Allocate the claims one after another; each sees the devices (and the capacity of
    shared devices) the previous ones took."""
    used = set(inputs.allocated)
    ledger = inputs.consumed.copy()
    outcomes: list[allocator.Outcome] = []
    for obj in inputs.claims:
        try:
            outcome = allocator.allocate(
                obj,
                slices=inputs.slices,
                classes=inputs.classes,
                node_name=inputs.node_name,
                allocated=used,
                node_devices=inputs.node_devices,
                ledger=ledger,
                share_rng=share_rng,
            )
        except (claim.ClaimError, pools.SliceError, capacity.CapacityError) as err:
            raise SimulateError(str(err)) from err
        outcomes.append(outcome)
        if outcome.allocation is not None:
            used |= pools.allocated_ids([outcome.allocation["devices"]])
            for entry in capacity.Ledger.from_allocated(
                [outcome.allocation["devices"]]
            ).used.items():
                ledger.add(*entry)
    return outcomes


def render(outcome: allocator.Outcome, *, node_name: str) -> str:
    """YAML for an allocation (with a comment line), or the explanation."""
    if outcome.allocation is None:
        lines = [f"ResourceClaim {outcome.claim_name} cannot be allocated on node {node_name}:"]
        lines += [
            f"  {line}" if line.startswith("  ") else f"  - {line}" for line in outcome.explanation
        ]
        return "\n".join(lines) + "\n"
    head = f"# ResourceClaim {outcome.claim_name}: allocated on node {node_name}"
    if outcome.score is not None and len(outcome.allocation["devices"]["results"]) > 1:
        links, numa, root = outcome.score
        head += (
            f"; placement: {links} NVLink links between the devices, "
            f"{_pairs(numa)} on one NUMA node, {_pairs(root)} under one PCIe root"
        )
    notes = "".join(f"# note: {n}\n" for n in outcome.notes)
    body = yaml.safe_dump(dict(outcome.allocation), sort_keys=False)
    return f"{head}\n{notes}{body}"


def _pairs(n: int) -> str:
    return "1 pair" if n == 1 else f"{n} pairs"
