"""Local validation of ResourceSlices against every limit the API server enforces.

Why it exists: a slice the server refuses is a node whose GPUs the scheduler never sees, found
out only at publish time and only as a 422 in a log. The publisher runs this before sending, so
a bad slice is caught with an error that names the device, the field and the rule, and the
in-memory API runs it so tests see the server's verdicts. Field paths and error kinds follow the
server's messages (``spec.devices[0].attributes[driverVersion].version: Invalid value: ...``);
tests hold it to the recorded verdicts of a real kube-apiserver. Limits: contracts.md §5.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dra_driver.apimachinery import fielderrors, names, schema
from dra_driver.apimachinery.fielderrors import FieldError
from dra_driver.slices import devicerules

API_VERSION = "resource.k8s.io/v1"
KIND = "ResourceSlice"

MAX_DRIVER_LEN = 63
MAX_POOL_NAME_LEN = 253
MAX_COUNTER_SETS = 8
# Per-device limits and helpers live in devicerules; re-exported for callers of this module.
MAX_DEVICES = devicerules.MAX_DEVICES
MAX_DEVICES_SPECIAL = devicerules.MAX_DEVICES_SPECIAL
TAINT_EFFECTS = devicerules.TAINT_EFFECTS
uses_special_limit = devicerules.uses_special_limit
qualified_name_errors = devicerules.qualified_name_errors
driver_name_errors = devicerules.driver_name_errors


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
    """All problems with ``obj``; decode problems (HTTP 400) alone when there are any."""
    decoding = schema.decode_errors(KIND, dict(obj))
    for key, want in (("apiVersion", API_VERSION), ("kind", KIND)):
        if obj.get(key) not in (None, "", want):
            decoding.append(fielderrors.decode(key, f"{key} {obj.get(key)!r} is not {want!r}"))
    if decoding:
        return decoding
    errors = validate_metadata(obj.get("metadata") or {})
    spec = obj.get("spec")
    if spec is None:
        return [*errors, fielderrors.required("spec")]
    return errors + _spec(spec)


def validate_update(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[FieldError]:
    """Problems of ``new`` as a replacement of ``old`` (adds the immutable fields)."""
    errors = validate(new)
    if any(e.status == 400 for e in errors):
        return errors
    old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
    for path, a, b in (
        ("spec.driver", old_spec.get("driver"), new_spec.get("driver")),
        (
            "spec.pool.name",
            (old_spec.get("pool") or {}).get("name"),
            (new_spec.get("pool") or {}).get("name"),
        ),
        ("spec.nodeName", old_spec.get("nodeName"), new_spec.get("nodeName")),
    ):
        if a != b:
            errors.append(fielderrors.invalid(path, b, "field is immutable"))
    return errors


def validate_metadata(meta: Mapping[str, Any], *, namespaced: bool = False) -> list[FieldError]:
    """ObjectMeta rules every object shares: name or generateName, owner references, labels."""
    errors: list[FieldError] = []
    name, generate = meta.get("name") or "", meta.get("generateName") or ""
    if not name and not generate:
        errors.append(fielderrors.required("metadata.name", "name or generateName is required"))
    elif name:
        errors += [fielderrors.invalid("metadata.name", name, p) for p in names.dns_subdomain(name)]
    else:
        errors += [
            fielderrors.invalid("metadata.generateName", generate, p)
            for p in names.dns_subdomain(generate + "x")
        ]
    if namespaced and not meta.get("namespace"):
        errors.append(fielderrors.required("metadata.namespace"))
    for i, ref in enumerate(meta.get("ownerReferences") or ()):
        for field in ("apiVersion", "kind", "name", "uid"):
            if not ref.get(field):
                errors.append(
                    fielderrors.invalid(
                        f"metadata.ownerReferences[{i}].{field}", "", f"{field} must not be empty"
                    )
                )
    for key, value in (meta.get("labels") or {}).items():
        errors += [fielderrors.invalid("metadata.labels", key, p) for p in names.label_key(key)]
        errors += [
            fielderrors.invalid("metadata.labels", value, p) for p in names.label_value(value)
        ]
    return errors


def _spec(spec: Mapping[str, Any]) -> list[FieldError]:
    errors = driver_name_errors("spec.driver", spec.get("driver") or "")
    errors += _pool(spec.get("pool"))
    errors += devicerules.node_selection_errors(spec, "spec", allow_per_device=True)
    devices = spec.get("devices") or []
    counters = spec.get("sharedCounters") or []
    if devices and counters:
        errors.append(
            fielderrors.forbidden(
                "spec.sharedCounters", "only one of devices and sharedCounters may be set"
            )
        )
    limit = MAX_DEVICES_SPECIAL if any(uses_special_limit(d) for d in devices) else MAX_DEVICES
    if len(devices) > limit:
        errors.append(fielderrors.too_many("spec.devices", len(devices), limit))
    seen: set[str] = set()
    per_device = spec.get("perDeviceNodeSelection") is True
    for i, device in enumerate(devices):
        path = f"spec.devices[{i}]"
        name = device.get("name") or ""
        if name and name in seen:
            errors.append(fielderrors.duplicate(path, name, device=name))
        seen.add(name)
        errors += devicerules.device_errors(path, device, per_device=per_device)
    if len(counters) > MAX_COUNTER_SETS:
        errors.append(fielderrors.too_many("spec.sharedCounters", len(counters), MAX_COUNTER_SETS))
    set_names: set[str] = set()
    for i, counter_set in enumerate(counters):
        path = f"spec.sharedCounters[{i}]"
        set_name = counter_set.get("name") or ""
        if set_name in set_names:
            errors.append(fielderrors.duplicate(f"{path}.name", set_name))
        set_names.add(set_name)
        errors += devicerules.label_errors(f"{path}.name", set_name)
        errors += devicerules.counters_errors(f"{path}.counters", counter_set.get("counters"), None)
    return errors


def _pool(pool: Mapping[str, Any] | None) -> list[FieldError]:
    if pool is None:
        return [fielderrors.required("spec.pool")]
    errors: list[FieldError] = []
    name = pool.get("name") or ""
    if not name:
        errors.append(fielderrors.required("spec.pool.name"))
    elif len(name) > MAX_POOL_NAME_LEN:
        errors.append(fielderrors.too_long("spec.pool.name", MAX_POOL_NAME_LEN))
    else:
        problems = [p for part in name.split("/") for p in names.dns_subdomain(part)]
        errors += [fielderrors.invalid("spec.pool.name", name, p) for p in dict.fromkeys(problems)]
    if (pool.get("generation") or 0) < 0:
        errors.append(
            fielderrors.invalid(
                "spec.pool.generation", pool["generation"], "must be greater than or equal to zero"
            )
        )
    count = pool.get("resourceSliceCount") or 0
    if count <= 0:
        errors.append(
            fielderrors.invalid("spec.pool.resourceSliceCount", count, "must be greater than zero")
        )
    return errors
