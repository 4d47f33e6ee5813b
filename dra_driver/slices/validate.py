"""Local validation of ResourceSlices against every limit the API server enforces.

Why it exists: a slice the server refuses is a node whose GPUs the scheduler never sees, found
out only at publish time and only as a 422 in a log. The publisher runs this before sending, so
a bad slice is caught with an error that names the device, the field and the rule, and the
in-memory API runs it so tests see the server's verdicts. Field paths and error kinds follow the
server's messages (``spec.devices[0].attributes[driverVersion].version: Invalid value: ...``):
each rule mirrors the Kubernetes v1.36 ``pkg/apis/resource/validation`` function named beside
it, after the strict JSON decoding of :mod:`dra_driver.apimachinery.strictdecode`; tests hold it to
the recorded verdicts of a real kube-apiserver and to cases of their own. Limits:
docs/api-limits.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dra_driver.apimachinery import fielderrors, metarules, names, strictdecode
from dra_driver.apimachinery.fielderrors import FieldError
from dra_driver.slices import attrnames, devicerules, taintrules

API_VERSION = "resource.k8s.io/v1"
KIND = "ResourceSlice"

MAX_POOL_NAME_LEN = 253  # PoolNameMaxLength
MAX_COUNTER_SETS = 8  # ResourceSliceMaxCounterSets
# Per-device limits and helpers live in devicerules, attrnames and taintrules; re-exported for
# callers of this module.
MAX_DEVICES = devicerules.MAX_DEVICES
MAX_DEVICES_SPECIAL = devicerules.MAX_DEVICES_SPECIAL
TAINT_EFFECTS = taintrules.TAINT_EFFECTS
uses_special_limit = devicerules.uses_special_limit
qualified_name_errors = attrnames.qualified_name_errors
_NODE_SELECTION_MSG = (
    "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required"
)


class SliceInvalid(Exception):
    """A ResourceSlice the API server would refuse; ``errors`` say where and why."""

    def __init__(self, name: str, errors: list[FieldError]) -> None:
        self.name = name
        self.errors = errors
        self.status, message = fielderrors.status_message(KIND, name, errors)
        super().__init__(message)


def check(obj: Mapping[str, Any]) -> None:
    """Raise :class:`SliceInvalid` unless the server would accept ``obj``."""
    errors = validate(obj)
    if errors:
        meta = obj.get("metadata") or {}
        raise SliceInvalid(str(meta.get("name") or meta.get("generateName") or "?"), errors)


def validate(obj: Mapping[str, Any]) -> list[FieldError]:
    """``ValidateResourceSlice`` after strict decoding: decode problems (HTTP 400) alone when
    there are any, else every validation problem (422)."""
    return _validate(obj, None)


def validate_update(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[FieldError]:
    """``ValidateResourceSliceUpdate``: ``new`` as a replacement of ``old`` (driver, pool name
    and node name are immutable; devices whose taints did not change keep them unchecked)."""
    return _validate(new, strictdecode.decoded(KIND, dict(old)))


def _decoding(obj: Mapping[str, Any]) -> list[FieldError]:
    decoding = strictdecode.decode_errors(KIND, dict(obj))
    for key, want in (("apiVersion", API_VERSION), ("kind", KIND)):
        if obj.get(key) not in (None, "", want):
            decoding.append(fielderrors.decode(key, f"{key} {obj.get(key)!r} is not {want!r}"))
    return decoding


def _validate(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    decoding = _decoding(obj)
    if decoding:
        return decoding
    new = strictdecode.decoded(KIND, dict(obj))
    errors = validate_metadata(new.get("metadata") or {})
    return errors + _spec(new.get("spec") or {}, None if old is None else old.get("spec") or {})


def validate_metadata(meta: Mapping[str, Any], *, namespaced: bool = False) -> list[FieldError]:
    """``ValidateObjectMeta`` with ``NameIsDNSSubdomain`` (the slice's own name rule)."""
    return metarules.object_meta(meta, namespaced=namespaced)


def _spec(spec: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    """``validateResourceSliceSpec``."""
    errors = metarules.driver_name("spec.driver", spec.get("driver") or "")
    errors += _pool(spec.get("pool") or {})
    if old is not None:  # ValidateImmutableField for pool name, driver, node name
        for path, a, b in (
            (
                "spec.pool.name",
                (old.get("pool") or {}).get("name"),
                (spec.get("pool") or {}).get("name"),
            ),
            ("spec.driver", old.get("driver"), spec.get("driver")),
            ("spec.nodeName", old.get("nodeName"), spec.get("nodeName")),
        ):
            if a != b:
                errors.append(fielderrors.invalid(path, b, "field is immutable"))
    errors += _node_selection(spec)
    devices = spec.get("devices")
    counters = spec.get("sharedCounters")
    if devices is not None and counters is not None:  # both non-nil, even empty
        errors.append(
            fielderrors.invalid("spec", "", "only one of `sharedCounters` or `devices` is allowed")
        )
    errors += _devices(spec, old)
    counters = counters or []
    if len(counters) > MAX_COUNTER_SETS:  # validateSet: too many short-circuits
        errors.append(fielderrors.too_many("spec.sharedCounters", len(counters), MAX_COUNTER_SETS))
    else:
        for i, counter_set in enumerate(counters):
            errors += devicerules.counter_set_errors(
                f"spec.sharedCounters[{i}]", counter_set, name_field="name"
            )
        errors += devicerules.duplicates(
            "spec.sharedCounters", [c.get("name") or "" for c in counters]
        )
    return errors


def _devices(spec: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    """``validateSet(devices, maxDevices, validateDevice, name)``."""
    devices = spec.get("devices") or []
    limit = MAX_DEVICES_SPECIAL if any(uses_special_limit(d) for d in devices) else MAX_DEVICES
    if len(devices) > limit:  # short-circuits: no device is looked at
        return [fielderrors.too_many("spec.devices", len(devices), limit)]
    per_device = spec.get("perDeviceNodeSelection") is True
    old_devices: dict[Any, Mapping[str, Any]] = {}
    for old_device in (old or {}).get("devices") or []:  # lookupDevice: the first of a name
        old_devices.setdefault(old_device.get("name"), old_device)
    errors: list[FieldError] = []
    for i, device in enumerate(devices):
        errors += devicerules.device_errors(
            f"spec.devices[{i}]",
            device,
            per_device=per_device,
            old=old_devices.get(device.get("name")) if old is not None else None,
        )
    for error in devicerules.duplicates("spec.devices", [d.get("name") or "" for d in devices]):
        errors.append(fielderrors.duplicate(error.path, error.value, device=error.value))
    return errors


def _node_selection(spec: Mapping[str, Any]) -> list[FieldError]:
    """The node-selection part of ``validateResourceSliceSpec``: exactly one of four."""
    errors: list[FieldError] = []
    chosen: list[str] = []
    node = spec.get("nodeName")
    if node is not None:
        if node:
            chosen.append("`nodeName`")
            errors += metarules.node_name("spec.nodeName", node)
        else:
            errors.append(
                fielderrors.invalid(
                    "spec.nodeName", node, "must be either unset or set to a non-empty string"
                )
            )
    selector = spec.get("nodeSelector")
    if selector is not None:
        chosen.append("`nodeSelector`")
        errors += metarules.node_selector("spec.nodeSelector", selector)
        terms = selector.get("nodeSelectorTerms") or []
        if len(terms) != 1:
            errors.append(
                fielderrors.invalid(
                    "spec.nodeSelector.nodeSelectorTerms",
                    terms or None,
                    "must have exactly one node selector term",
                )
            )
    for field in ("allNodes", "perDeviceNodeSelection"):
        value = spec.get(field)
        if value is True:
            chosen.append(f"`{field}`")
        elif value is not None:
            errors.append(
                fielderrors.invalid(f"spec.{field}", value, "must be either unset or set to true")
            )
    if not chosen:
        errors.append(fielderrors.required("spec", _NODE_SELECTION_MSG))
    elif len(chosen) > 1:
        shown = "{" + ", ".join(chosen) + "}"
        errors.append(
            fielderrors.invalid(
                "spec", shown, f"{_NODE_SELECTION_MSG}, but multiple fields are set"
            )
        )
    return errors


def _pool(pool: Mapping[str, Any]) -> list[FieldError]:
    """``validateResourcePool``: the name (``validatePoolName``), then the count, then the
    generation."""
    errors: list[FieldError] = []
    name = pool.get("name") or ""
    if not name:
        errors.append(fielderrors.required("spec.pool.name"))
    else:
        if len(name) > MAX_POOL_NAME_LEN:
            errors.append(fielderrors.too_long("spec.pool.name", MAX_POOL_NAME_LEN))
        for part in name.split("/"):  # each part a DNS subdomain, reported with the part
            errors += [
                fielderrors.invalid("spec.pool.name", part, p) for p in names.dns_subdomain(part)
            ]
    count = pool.get("resourceSliceCount") or 0
    if count <= 0:
        errors.append(
            fielderrors.invalid("spec.pool.resourceSliceCount", count, "must be greater than zero")
        )
    generation = pool.get("generation") or 0
    if generation < 0:
        errors.append(
            fielderrors.invalid(
                "spec.pool.generation", generation, "must be greater than or equal to zero"
            )
        )
    return errors
