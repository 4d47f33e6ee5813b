"""What the API server we talk to really keeps of the ResourceSlices we publish.

Why it exists: a kube-apiserver with a DRA feature gate off does not refuse a ResourceSlice field
of that gate; it drops the field, stores the rest and answers 201 as if all were well. A driver
that publishes device taints, shared counters or shareable devices to such a server runs with
slices that say less than it thinks — unhealthy GPUs stay schedulable, dynamic MIG devices
consume nothing, GPU shares become whole GPUs — and nothing says so. So we ask the server
instead of guessing from its version: a server-side **dry-run** create (``?dryRun=All``, nothing
stored) of small probe slices that use every optional field we publish, and compare what comes
back with what was sent. With the served ``resource.k8s.io`` versions (API discovery), the
server version and the RBAC the credentials have, that is what ``dra-driver doctor`` prints.

The fields probed, by gate: ``devices[].taints`` (DRADeviceTaints; health taints on unhealthy
GPUs), ``sharedCounters`` and ``devices[].consumesCounters`` (DRAPartitionableDevices; dynamic
MIG), ``devices[].allowMultipleAllocations`` and ``capacity.<name>.requestPolicy``
(DRAConsumableCapacity; GPU shares). Binding conditions (DRADeviceBindingConditions) are not
probed: we publish none. Set ranks (``setRanks``) are a plain int attribute: no gate.

An adapter like :mod:`dra_driver.kube.client`: it talks to the server through the narrow
:class:`ServerApi` (which :class:`~dra_driver.kube.client.KubeClient` implements) and imports
no client library; the driver core does not import it.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Protocol

from dra_driver import records
from dra_driver.kube import api

Obj = dict[str, Any]
GROUP = "resource.k8s.io"
VERSION = "v1"  # the version this driver speaks
PROBE_SUFFIX = "-dra-driver-probe"
_MAX_PREFIX = 58  # the server truncates a generateName longer than this (63 - 5)

# What the node agent does, per resource (the Helm chart's ClusterRole).
NEEDED: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (GROUP, "resourceslices", ("list", "watch", "create", "update", "delete")),
    (GROUP, "resourceclaims", ("get",)),
    ("", "nodes", ("get", "patch")),
)


class ServerApi(Protocol):
    """What the probe asks of the API server (beyond the driver's own port)."""

    @property
    def server(self) -> str:
        """The server's URL, for messages."""
        ...

    def get_version(self) -> Obj:
        """``GET /version``."""
        ...

    def get_api_group(self, group: str) -> Obj:
        """``GET /apis/<group>``; raises :class:`~dra_driver.kube.api.NotFound`."""
        ...

    def dry_run_create_resource_slice(self, obj: Obj) -> Obj:
        """``POST .../resourceslices?dryRun=All``: the object as it would be stored."""
        ...

    def access_review(self, verb: str, group: str, resource: str) -> Obj:
        """A ``SelfSubjectAccessReview``, answered (``status.allowed``)."""
        ...


class ProbeError(Exception):
    """The server could not be reached or would not answer at all; one line for the operator,
    naming the server and the reason."""

    def __init__(self, server: str, exc: api.ApiError, what: str = "") -> None:
        reason = _reason(exc)
        if exc.status == 0:
            message = f"cannot reach the API server {server}: {reason}"
        else:
            message = f"the API server {server} refused {what or 'GET /version'}: {reason}"
        super().__init__(message)
        self.server = server
        self.reason = reason


@records.record
class Features:
    """What one API server serves and keeps. A feature is True when the server kept its
    fields, False when it dropped them (its gate is off), None when not probed (``not_probed``
    says why: ``resource.k8s.io/v1`` not served, or the dry-run refused)."""

    server_version: str  # gitVersion, e.g. "v1.36.2"
    served_versions: tuple[str, ...]  # of resource.k8s.io, as listed (empty: group not served)
    preferred_version: str
    device_taints: bool | None
    shared_counters: bool | None
    consumable_capacity: bool | None
    not_probed: str = ""

    @property
    def v1_served(self) -> bool:
        return VERSION in self.served_versions


@records.record
class Access:
    """The verbs the credentials may and may not use on one resource."""

    resource: str
    allowed: tuple[str, ...]
    denied: tuple[str, ...]


@records.record
class Rbac:
    """Access per resource the agent needs, or ``unknown`` saying why the server did not tell."""

    rows: tuple[Access, ...] = ()
    unknown: str = ""

    @property
    def complete(self) -> bool:
        return not self.unknown and all(not row.denied for row in self.rows)


def probe(api_: ServerApi, node_name: str, driver_name: str) -> Features:
    """Ask the server behind ``api_`` what it serves and keeps; raises :class:`ProbeError` when
    it cannot be reached or does not answer ``GET /version``. Nothing is stored."""
    try:
        version = api_.get_version()
    except api.ApiError as exc:
        raise ProbeError(api_.server, exc) from exc
    served, preferred = _served(api_)
    features = Features(
        server_version=str(version.get("gitVersion") or "unknown"),
        served_versions=served,
        preferred_version=preferred,
        device_taints=None,
        shared_counters=None,
        consumable_capacity=None,
    )
    if not features.v1_served:
        return dataclasses.replace(features, not_probed=f"{GROUP}/{VERSION} not served")
    counters_sent, devices_sent = probe_slices(node_name, driver_name)
    try:
        counters_back = api_.dry_run_create_resource_slice(counters_sent)
        devices_back = api_.dry_run_create_resource_slice(devices_sent)
    except api.ApiError as exc:
        if exc.status == 0:
            raise ProbeError(api_.server, exc) from exc
        return dataclasses.replace(
            features, not_probed=f"the dry-run create was refused (HTTP {exc.status}): {exc}"
        )
    device = _first_device(devices_back)
    capacity = device.get("capacity") or {}
    return dataclasses.replace(
        features,
        device_taints=any(
            t.get("key") == _taint_key(driver_name) for t in device.get("taints") or ()
        ),
        shared_counters=_counter_sets(counters_back.get("spec") or {}) == {"probe"}
        and bool(device.get("consumesCounters")),
        consumable_capacity=device.get("allowMultipleAllocations") is True
        and all(
            isinstance(capacity.get(name), dict) and bool(capacity[name].get("requestPolicy"))
            for name in ("memory", "compute")
        ),
    )


def rbac(api_: ServerApi) -> Rbac:
    """The access the agent needs (:data:`NEEDED`) as the server reviews it for these
    credentials; ``unknown`` when a review is not answered (no authorization API, refused)."""
    rows: list[Access] = []
    for group, resource, verbs in NEEDED:
        allowed: list[str] = []
        denied: list[str] = []
        for verb in verbs:
            try:
                review = api_.access_review(verb, group, resource)
            except api.ApiError as exc:
                return Rbac(unknown=f"server did not answer: {_reason(exc)}")
            status = review.get("status") or {}
            (allowed if status.get("allowed") is True else denied).append(verb)
        rows.append(Access(resource, tuple(allowed), tuple(denied)))
    return Rbac(rows=tuple(rows))


def probe_slices(node_name: str, driver_name: str) -> tuple[Obj, Obj]:
    """The two probe slices (a slice has counter sets or devices, never both): one pool of
    their own (not the node's), ``generateName`` so no name can collide. The device uses every
    optional device field we publish. Valid for any node and driver name a slice can carry;
    ``dra-driver doctor`` checks the names it is given (this adapter imports no slice code)."""
    prefix = probe_prefix(node_name)
    pool = {"name": prefix.rstrip("-"), "generation": 1, "resourceSliceCount": 2}

    def slice_(spec: Obj) -> Obj:
        return {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ResourceSlice",
            "metadata": {"generateName": prefix},
            "spec": {"driver": driver_name, "nodeName": node_name, "pool": dict(pool), **spec},
        }

    counters = slice_({"sharedCounters": [{"name": "probe", "counters": _counters("2Gi")}]})
    device: Obj = {
        "name": "probe",
        "attributes": {"type": {"string": "probe"}, "setRank1": {"int": 1}},
        "capacity": {
            "memory": {
                "value": "2Gi",
                "requestPolicy": {
                    "default": "1Gi",
                    "validRange": {"min": "1Gi", "max": "2Gi", "step": "1Gi"},
                },
            },
            "compute": {
                "value": "100",
                "requestPolicy": {
                    "default": "0",
                    "validRange": {"min": "0", "max": "100", "step": "1"},
                },
            },
        },
        "allowMultipleAllocations": True,
        "consumesCounters": [{"counterSet": "probe", "counters": _counters("1Gi")}],
        "taints": [{"key": _taint_key(driver_name), "value": "dry-run", "effect": "NoSchedule"}],
    }
    devices = slice_({"devices": [device]})
    return counters, devices


def probe_prefix(node_name: str) -> str:
    """``<node>-dra-driver-probe-``, the node part shortened so the server keeps it whole."""
    room = _MAX_PREFIX - len(PROBE_SUFFIX) - 1
    node = re.sub(r"[.-]+$", "", node_name[:room]) or "node"
    return f"{node}{PROBE_SUFFIX}-"


def _served(api_: ServerApi) -> tuple[tuple[str, ...], str]:
    try:
        group = api_.get_api_group(GROUP)
    except api.NotFound:
        return (), ""
    except api.ApiError as exc:
        raise ProbeError(api_.server, exc, f"GET /apis/{GROUP}") from exc
    versions = tuple(
        str(v.get("version") or "") for v in group.get("versions") or () if isinstance(v, dict)
    )
    preferred = str((group.get("preferredVersion") or {}).get("version") or "")
    return versions, preferred


def _counters(memory: str) -> Obj:
    return {"memory": {"value": memory}}


def _taint_key(driver_name: str) -> str:
    return f"{driver_name}/probe"


def _first_device(obj: Obj) -> Obj:
    devices = (obj.get("spec") or {}).get("devices") or [{}]
    first = devices[0]
    return first if isinstance(first, dict) else {}


def _counter_sets(spec: Obj) -> set[str]:
    return {str(c.get("name")) for c in spec.get("sharedCounters") or () if isinstance(c, dict)}


def _reason(exc: api.ApiError) -> str:
    """The error without the client's own prefix: what the operator needs to read."""
    text = str(exc).removeprefix("API server unreachable: ")
    return text if exc.status == 0 else f"HTTP {exc.status}: {text}"
