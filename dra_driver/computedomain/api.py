"""The ComputeDomain API: our CRD, its validation, and a typed view of one domain.

Why it exists: users coming from NVIDIA's DRA driver apply their ComputeDomain manifests
unchanged, so the fields, their types, enums, defaults and the immutable spec are NVIDIA's
(``computedomains.resource.nvidia.com``, ``v1beta1``, namespaced, status subresource). The
schema is written here once, as data: :func:`crd` is the CustomResourceDefinition the chart
ships (a test holds the chart to it), and :func:`validate` checks an object against the same
schema the way the API server does (types, enums, required fields, unknown fields refused as
``kubectl`` asks by default), so the in-memory API server refuses what a real one would
(:func:`register`). The one schema rule that is CEL (``spec`` is immutable) is checked on
update by :func:`check_update`.

Ours beyond NVIDIA's: ``numNodes`` must be 0 or more (their documentation says so; their schema
does not check it).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from typing import Any

from dra_driver import computedomain as cd
from dra_driver import records
from dra_driver.kube import api
from dra_driver.kube.objects import COMPUTE_DOMAINS, Kind

READY, NOT_READY, FAILED = "Ready", "NotReady", "Failed"
SINGLE, ALL = "Single", "All"

_NODE: dict[str, Any] = {
    "type": "object",
    "description": "One node of the domain, as its node agent reports it.",
    "required": ["name", "ipAddress", "cliqueID"],
    "properties": {
        "name": {"type": "string", "description": "The node's name."},
        "ipAddress": {"type": "string", "description": "Where its IMEX daemon listens."},
        "cliqueID": {
            "type": "string",
            "description": "The NVLink fabric clique of its GPUs (<cluster UUID>.<clique id>).",
        },
        "index": {
            "type": "integer",
            "description": "Its position among the domain's nodes of its clique (stable while "
            "it stays).",
        },
        "status": {
            "type": "string",
            "enum": [READY, NOT_READY, FAILED],
            "default": NOT_READY,
            "description": "Whether its IMEX daemon is ready to broker memory exchanges.",
        },
    },
}
SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "A set of nodes prepared to run one multi-node NVLink workload: their IMEX "
    "daemons know each other and the workload's pods get IMEX channels.",
    "properties": {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "required": ["numNodes", "channel"],
            "x-kubernetes-validations": [
                {"rule": "self == oldSelf", "message": "A computeDomain.spec is immutable"}
            ],
            "properties": {
                "numNodes": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "How many nodes the domain is expected to have: its status "
                    "is Ready once that many nodes' IMEX daemons are ready (0: once every node "
                    "that joined is).",
                },
                "channel": {
                    "type": "object",
                    "required": ["resourceClaimTemplate"],
                    "properties": {
                        "resourceClaimTemplate": {
                            "type": "object",
                            "required": ["name"],
                            "properties": {
                                "name": {
                                    "type": "string",
                                    "description": "Name of the ResourceClaimTemplate the "
                                    "controller creates in the domain's namespace; workload "
                                    "pods claim their channel from it.",
                                }
                            },
                        },
                        "allocationMode": {
                            "type": "string",
                            "enum": [ALL, SINGLE],
                            "default": SINGLE,
                            "description": "Single: one IMEX channel per workload container; "
                            "All: every channel of the IMEX domain.",
                        },
                    },
                },
            },
        },
        "status": {
            "type": "object",
            "required": ["status"],
            "properties": {
                "status": {"type": "string", "enum": [READY, NOT_READY], "default": NOT_READY},
                "nodes": {
                    "type": "array",
                    "items": _NODE,
                    "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["name"],
                },
            },
        },
    },
}


def crd() -> dict[str, Any]:
    """The CustomResourceDefinition (``apiextensions.k8s.io/v1``) the chart installs."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{COMPUTE_DOMAINS.plural}.{cd.GROUP}"},
        "spec": {
            "group": cd.GROUP,
            "names": {
                "kind": "ComputeDomain",
                "listKind": "ComputeDomainList",
                "plural": COMPUTE_DOMAINS.plural,
                "singular": "computedomain",
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": cd.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": copy.deepcopy(SCHEMA)},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Nodes", "type": "integer", "jsonPath": ".spec.numNodes"},
                        {"name": "Status", "type": "string", "jsonPath": ".status.status"},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                }
            ],
        },
    }


# ---- validation ---------------------------------------------------------------------------

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "boolean": (bool,),
}


def validate(obj: Mapping[str, Any]) -> list[str]:
    """What the API server refuses in ``obj`` (field path and reason), empty when valid."""
    problems: list[str] = []
    _check(obj, SCHEMA, "", problems)
    return problems


def check_update(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """The CEL rule of the schema: ``spec`` never changes once created."""
    if old.get("spec") != new.get("spec"):
        return ["spec: Invalid value: A computeDomain.spec is immutable"]
    return []


def _check(value: Any, schema: Mapping[str, Any], path: str, out: list[str]) -> None:
    kind = schema.get("type")
    where = path or "<root>"
    wanted = _TYPES.get(str(kind))
    if wanted is not None and (
        not isinstance(value, wanted) or (kind == "integer" and isinstance(value, bool))
    ):
        out.append(f"{where}: Invalid value: must be of type {kind}")
        return
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(f'"{v}"' for v in schema["enum"])
        out.append(f'{where}: Unsupported value: "{value}": supported values: {allowed}')
    if "minimum" in schema and isinstance(value, int) and value < schema["minimum"]:
        out.append(f"{where}: Invalid value: {value}: should be >= {schema['minimum']}")
    if kind == "object" and "properties" in schema:
        props = schema["properties"]
        for name in schema.get("required", ()):
            if name not in value:
                out.append(f"{_join(path, name)}: Required value")
        for name, item in value.items():
            if name not in props:
                out.append(f'{_join(path, name)}: unknown field "{name}"')
            else:
                _check(item, props[name], _join(path, name), out)
    elif kind == "array":
        keys = schema.get("x-kubernetes-list-map-keys") or ()
        seen: set[tuple[Any, ...]] = set()
        for index, item in enumerate(value):
            _check(item, schema.get("items") or {}, f"{where}[{index}]", out)
            if keys and isinstance(item, dict):
                key = tuple(item.get(k) for k in keys)
                if key in seen:
                    out.append(
                        f"{where}[{index}]: Duplicate value: {dict(zip(keys, key, strict=True))}"
                    )
                seen.add(key)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def register(store: Any) -> None:
    """Serve ComputeDomains from an in-memory API's object store (``InMemoryApi().objects``)
    as a real server with our CRD would: the schema validated on every write, ``spec``
    immutable. ``store``: :class:`dra_driver.testing.fakeapi.objects.ObjectStore`."""
    store.register(COMPUTE_DOMAINS, validate)

    def immutable_spec(verb: str, kind: Kind, new: api.Obj | None, old: api.Obj | None) -> None:
        if verb == "update" and kind == COMPUTE_DOMAINS and new is not None and old is not None:
            problems = check_update(old, new)
            if problems:
                name = new["metadata"].get("name", "")
                raise api.Invalid(f'ComputeDomain "{name}" is invalid: ' + "; ".join(problems))

    store.add_admission(immutable_spec)


# ---- a typed view -------------------------------------------------------------------------


@records.record
class DomainNode:
    """One ``status.nodes`` entry."""

    name: str
    ip_address: str
    clique_id: str
    index: int
    status: str

    def to_obj(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ipAddress": self.ip_address,
            "cliqueID": self.clique_id,
            "index": self.index,
            "status": self.status,
        }


@records.record
class Domain:
    """A ComputeDomain as the controller and the node agents read it (defaults applied)."""

    uid: str
    name: str
    namespace: str
    num_nodes: int
    template_name: str
    allocation_mode: str
    status: str
    nodes: tuple[DomainNode, ...]
    deleting: bool
    finalizers: tuple[str, ...]

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any]) -> Domain:
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        channel = spec.get("channel") or {}
        status = obj.get("status") or {}
        return cls(
            uid=str(meta.get("uid") or ""),
            name=str(meta.get("name") or ""),
            namespace=str(meta.get("namespace") or ""),
            num_nodes=int(spec.get("numNodes") or 0),
            template_name=str((channel.get("resourceClaimTemplate") or {}).get("name") or ""),
            allocation_mode=str(channel.get("allocationMode") or SINGLE),
            status=str(status.get("status") or NOT_READY),
            nodes=tuple(
                DomainNode(
                    name=str(n.get("name") or ""),
                    ip_address=str(n.get("ipAddress") or ""),
                    clique_id=str(n.get("cliqueID") or ""),
                    index=int(n.get("index") or 0),
                    status=str(n.get("status") or NOT_READY),
                )
                for n in status.get("nodes") or ()
                if isinstance(n, Mapping)
            ),
            deleting=bool(meta.get("deletionTimestamp")),
            finalizers=tuple(meta.get("finalizers") or ()),
        )

    def __str__(self) -> str:
        return f"ComputeDomain {self.namespace}/{self.name}"

    def node(self, name: str) -> DomainNode | None:
        return next((n for n in self.nodes if n.name == name), None)

    def overall_status(self) -> str:
        """Ready once ``numNodes`` nodes' daemons are ready (``numNodes`` 0: once every node
        that joined is, and at least one did)."""
        ready = sum(1 for n in self.nodes if n.status == READY)
        if self.num_nodes > 0:
            return READY if ready >= self.num_nodes else NOT_READY
        return READY if self.nodes and ready == len(self.nodes) else NOT_READY


def with_nodes(obj: Mapping[str, Any], nodes: Sequence[DomainNode]) -> dict[str, Any]:
    """``obj`` with ``status.nodes`` replaced (``status.status`` kept, defaulted)."""
    new = copy.deepcopy(dict(obj))
    status = new.setdefault("status", {})
    status.setdefault("status", NOT_READY)
    status["nodes"] = [n.to_obj() for n in sorted(nodes, key=lambda n: (n.clique_id, n.index))]
    return new


# A domain UID is a path segment and a label value: refuse anything else before using it.
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def valid_domain_id(value: object) -> bool:
    return isinstance(value, str) and bool(_LABEL_VALUE.match(value)) and ".." not in value
