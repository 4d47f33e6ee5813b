"""Validation rules for one device of a ResourceSlice, and the name rules slices share.

Why it exists: a device entry carries most of a slice's API limits (name, attributes and
capacities, semver values, taints, counters, binding conditions, per-device node selection);
:mod:`dra_driver.slices.validate` applies them to every device and adds the slice-level rules.
Paths and wording follow the API server's messages so errors can be compared with its verdicts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dra_driver.apimachinery import fielderrors, names, semver
from dra_driver.apimachinery.fielderrors import FieldError
from dra_driver.slices import requestpolicy

MAX_DEVICES = 128
MAX_DEVICES_SPECIAL = 64  # when any device uses taints, consumesCounters or list attributes
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_ATTRIBUTE_VALUES = 48
MAX_ID_LEN = 32
MAX_DOMAIN_LEN = 63
MAX_DRIVER_LEN = 63
MAX_VALUE_LEN = 64
MAX_TAINTS = 16
MAX_COUNTERS = 32
MAX_CONSUMPTIONS = 2
MAX_BINDING_CONDITIONS = 4
MAX_VALID_VALUES = requestpolicy.MAX_VALID_VALUES
TAINT_EFFECTS = ("NoExecute", "NoSchedule", "None")
NODE_SELECTION = ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")
_SCALAR_KINDS = ("int", "bool", "string", "version")
_LIST_KINDS = ("ints", "bools", "strings", "versions")
_SEMVER_MSG = "must be a string compatible with semver.org spec 2.0.0"


def driver_name_errors(path: str, value: str) -> list[FieldError]:
    if not value:
        return [fielderrors.required(path)]
    if len(value) > MAX_DRIVER_LEN:
        return [fielderrors.too_long(path, MAX_DRIVER_LEN)]
    return [fielderrors.invalid(path, value, p) for p in names.driver_name(value)]


def qualified_name_errors(path: str, key: str, *, device: str | None = None) -> list[FieldError]:
    """An attribute or capacity name: ``identifier`` or ``domain/identifier``."""
    domain, sep, ident = key.rpartition("/")
    if key.count("/") > 1:
        return [
            fielderrors.invalid(
                path, key, "a qualified name must contain at most one '/'", device=device
            )
        ]
    errors: list[FieldError] = []
    if sep:
        if not domain:
            errors.append(fielderrors.required(path, "the domain must not be empty", device=device))
        elif len(domain) > MAX_DOMAIN_LEN:
            errors.append(fielderrors.too_long(path, MAX_DOMAIN_LEN, device=device))
        else:
            errors += [
                fielderrors.invalid(path, domain, p, device=device)
                for p in names.driver_name(domain)
            ]
    if not ident:
        errors.append(fielderrors.required(path, "the name must not be empty", device=device))
    elif len(ident) > MAX_ID_LEN:
        errors.append(fielderrors.too_long(path, MAX_ID_LEN, device=device))
    else:
        errors += [
            fielderrors.invalid(path, ident, p, device=device) for p in names.c_identifier(ident)
        ]
    return errors


def uses_special_limit(device: Mapping[str, Any]) -> bool:
    """Whether a device lowers the per-slice device limit to 64."""
    attrs = (device.get("attributes") or {}).values()
    return bool(
        device.get("taints")
        or device.get("consumesCounters")
        or any(k in (a or {}) for a in attrs for k in _LIST_KINDS)
    )


def node_selection_errors(
    obj: Mapping[str, Any], path: str, *, allow_per_device: bool, device: str | None = None
) -> list[FieldError]:
    fields = NODE_SELECTION if allow_per_device else NODE_SELECTION[:3]
    given = [f for f in fields if obj.get(f) is not None]
    listing = ", ".join(f"`{f}`" for f in fields)
    if not given:
        return [fielderrors.required(path, f"exactly one of {listing} is required", device=device)]
    if len(given) > 1:
        shown = "{" + ", ".join(f"`{f}`" for f in given) + "}"
        return [
            fielderrors.invalid(
                path,
                shown,
                f"exactly one of {listing} is required, but multiple fields are set",
                device=device,
            )
        ]
    field, value = given[0], obj[given[0]]
    sub = f"{path}.{field}"
    if field == "nodeName":
        if not value:
            return [fielderrors.required(sub, device=device)]
        return [
            fielderrors.invalid(sub, value, p, device=device) for p in names.dns_subdomain(value)
        ]
    if field == "nodeSelector":
        terms = value.get("nodeSelectorTerms") or []
        if len(terms) != 1:
            return [
                fielderrors.invalid(
                    f"{sub}.nodeSelectorTerms",
                    len(terms),
                    "must have exactly one node selector term",
                    device=device,
                )
            ]
        return []
    if value is not True:
        return [fielderrors.invalid(sub, value, "must be true", device=device)]
    return []


def device_errors(path: str, device: Mapping[str, Any], *, per_device: bool) -> list[FieldError]:
    name = device.get("name") or ""
    dev = name or None
    errors: list[FieldError] = []
    if not name:
        errors.append(fielderrors.required(f"{path}.name"))
    else:
        errors += [
            fielderrors.invalid(f"{path}.name", name, p, device=dev) for p in names.dns_label(name)
        ]
    attributes = device.get("attributes") or {}
    capacity = device.get("capacity") or {}
    total = len(attributes) + len(capacity)
    if total > MAX_ATTRIBUTES_AND_CAPACITIES:
        errors.append(
            fielderrors.invalid(
                path,
                total,
                "the total number of attributes and capacities must not exceed "
                f"{MAX_ATTRIBUTES_AND_CAPACITIES}",
                device=dev,
            )
        )
    values = 0
    for key, attr in attributes.items():
        errors += qualified_name_errors(f"{path}.attributes", key, device=dev)
        errors += _attribute(f"{path}.attributes[{key}]", attr or {}, dev)
        values += sum(len((attr or {}).get(k) or ()) for k in _LIST_KINDS) or 1
    if values > MAX_ATTRIBUTE_VALUES:
        errors.append(
            fielderrors.invalid(
                f"{path}.attributes",
                values,
                f"the total number of attribute values must not exceed {MAX_ATTRIBUTE_VALUES}",
                device=dev,
            )
        )
    multi = device.get("allowMultipleAllocations") is True
    for key, cap in capacity.items():
        errors += qualified_name_errors(f"{path}.capacity", key, device=dev)
        errors += _capacity(f"{path}.capacity[{key}]", cap or {}, multi, dev)
    errors += _taints(f"{path}.taints", device.get("taints") or [], dev)
    consumes = device.get("consumesCounters") or []
    if len(consumes) > MAX_CONSUMPTIONS:
        errors.append(
            fielderrors.too_many(
                f"{path}.consumesCounters", len(consumes), MAX_CONSUMPTIONS, device=dev
            )
        )
    for i, use in enumerate(consumes):
        errors += label_errors(
            f"{path}.consumesCounters[{i}].counterSet", use.get("counterSet") or ""
        )
        errors += counters_errors(
            f"{path}.consumesCounters[{i}].counters", use.get("counters"), dev
        )
    if per_device:
        errors += node_selection_errors(device, path, allow_per_device=False, device=dev)
    else:
        for field in NODE_SELECTION[:3]:
            if device.get(field) is not None:
                errors.append(
                    fielderrors.forbidden(
                        f"{path}.{field}",
                        "only allowed when perDeviceNodeSelection is true",
                        device=dev,
                    )
                )
    errors += _binding(path, device, dev)
    return errors


def _attribute(path: str, attr: Mapping[str, Any], dev: str | None) -> list[FieldError]:
    given = [k for k in (*_SCALAR_KINDS, *_LIST_KINDS) if attr.get(k) is not None]
    if len(given) != 1:
        shown = attr if attr else ""
        return [fielderrors.invalid(path, shown, "exactly one value must be specified", device=dev)]
    kind = given[0]
    value = attr[kind]
    if kind in _LIST_KINDS and not value:
        return [fielderrors.required(f"{path}.{kind}", device=dev)]
    items = (
        [(f"{path}.{kind}[{i}]", v) for i, v in enumerate(value)]
        if kind in _LIST_KINDS
        else [(f"{path}.{kind}", value)]
    )
    errors: list[FieldError] = []
    for item_path, item in items:
        if kind in ("string", "strings", "version", "versions"):
            if len(item.encode()) > MAX_VALUE_LEN:
                errors.append(fielderrors.too_long(item_path, MAX_VALUE_LEN, device=dev))
            elif kind.startswith("version") and not semver.is_semver(item):
                errors.append(fielderrors.invalid(item_path, item, _SEMVER_MSG, device=dev))
    return errors


def _capacity(path: str, cap: Mapping[str, Any], multi: bool, dev: str | None) -> list[FieldError]:
    if cap.get("value") is None:
        return [fielderrors.required(f"{path}.value", device=dev)]
    policy = cap.get("requestPolicy")
    if policy is None:
        return []
    if not multi:
        return [
            fielderrors.forbidden(
                f"{path}.requestPolicy",
                "allowed only when allowMultipleAllocations is true",
                device=dev,
            )
        ]
    return requestpolicy.errors(f"{path}.requestPolicy", cap["value"], policy, dev)


def _taints(path: str, taints: list[Any], dev: str | None) -> list[FieldError]:
    errors: list[FieldError] = []
    if len(taints) > MAX_TAINTS:
        errors.append(fielderrors.too_many(path, len(taints), MAX_TAINTS, device=dev))
    for i, taint in enumerate(taints):
        key = taint.get("key") or ""
        if not key:
            errors.append(fielderrors.required(f"{path}[{i}].key", device=dev))
        errors += [
            fielderrors.invalid(f"{path}[{i}].key", key, p, device=dev)
            for p in (names.label_key(key) if key else ())
        ]
        value = taint.get("value") or ""
        errors += [
            fielderrors.invalid(f"{path}[{i}].value", value, p, device=dev)
            for p in names.label_value(value)
        ]
        effect = taint.get("effect") or ""
        if not effect:
            errors.append(fielderrors.required(f"{path}[{i}].effect", device=dev))
        elif effect not in TAINT_EFFECTS:
            errors.append(
                fielderrors.not_supported(f"{path}[{i}].effect", effect, TAINT_EFFECTS, device=dev)
            )
    return errors


def label_errors(path: str, value: str) -> list[FieldError]:
    if not value:
        return [fielderrors.required(path)]
    return [fielderrors.invalid(path, value, p) for p in names.dns_label(value)]


def counters_errors(
    path: str, counters: Mapping[str, Any] | None, dev: str | None
) -> list[FieldError]:
    if not counters:
        return [fielderrors.required(path, device=dev)]
    errors: list[FieldError] = []
    if len(counters) > MAX_COUNTERS:
        errors.append(fielderrors.too_many(path, len(counters), MAX_COUNTERS, device=dev))
    for key, counter in counters.items():
        errors += [fielderrors.invalid(path, key, p, device=dev) for p in names.dns_label(key)]
        if (counter or {}).get("value") is None:
            errors.append(fielderrors.required(f"{path}[{key}].value", device=dev))
    return errors


def _binding(path: str, device: Mapping[str, Any], dev: str | None) -> list[FieldError]:
    errors: list[FieldError] = []
    conditions = device.get("bindingConditions") or []
    failures = device.get("bindingFailureConditions") or []
    for field, items in (("bindingConditions", conditions), ("bindingFailureConditions", failures)):
        sub = f"{path}.{field}"
        if len(items) > MAX_BINDING_CONDITIONS:
            errors.append(fielderrors.too_many(sub, len(items), MAX_BINDING_CONDITIONS, device=dev))
        seen: set[str] = set()
        for i, item in enumerate(items):
            if item in seen:
                errors.append(fielderrors.duplicate(f"{sub}[{i}]", item, device=dev))
            seen.add(item)
            errors += [
                fielderrors.invalid(f"{sub}[{i}]", item, p, device=dev)
                for p in names.label_key(item)
            ]
    if bool(conditions) != bool(failures):
        errors.append(
            fielderrors.invalid(
                path,
                "",
                "bindingConditions and bindingFailureConditions must be set together",
                device=dev,
            )
        )
    for item in set(conditions) & set(failures):
        errors.append(
            fielderrors.invalid(
                f"{path}.bindingFailureConditions",
                item,
                "must not also be a binding condition",
                device=dev,
            )
        )
    return errors
