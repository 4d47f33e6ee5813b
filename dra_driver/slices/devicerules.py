"""Validation rules for one device of a ResourceSlice, and the counter and set rules slices
and claims share.

Why it exists: a device entry carries most of a slice's API limits (name, attributes and
capacities, semver values, taints, counters, binding conditions, per-device node selection);
:mod:`dra_driver.slices.validate` applies them to every device and adds the slice-level rules.
Each check mirrors a function of the Kubernetes v1.36 ``pkg/apis/resource/validation``
(``validateDevice``, ``validateDeviceAttribute``, ``validateCounterSet``,
``validateDeviceBindingParameters``, ...), named in the docstring or comment beside it: same
checks, same order, same field paths and wording, so errors can be compared with the server's
verdicts.
Input is the decoded form (:func:`dra_driver.apimachinery.strictdecode.decoded`: nulls are
zero). Attribute and capacity names are checked by :mod:`.attrnames`, taints by
:mod:`.taintrules`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from dra_driver.apimachinery import fielderrors, metarules, names, semver
from dra_driver.apimachinery.fielderrors import FieldError
from dra_driver.slices import attrnames, requestpolicy, taintrules

MAX_DEVICES = 128  # ResourceSliceMaxDevices
MAX_DEVICES_SPECIAL = 64  # ...WithTaintsOrConsumesCounters (list attributes too, since 1.36)
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_ATTRIBUTE_VALUES = 48  # ResourceSliceMaxAttributeValuesPerDevice (list items counted)
MAX_VALUE_LEN = 64  # DeviceAttributeMaxValueLength
MAX_COUNTERS = 32  # ResourceSliceMaxCountersPerCounterSet / ...PerDeviceCounterConsumption
MAX_CONSUMPTIONS = 2  # ResourceSliceMaxDeviceCounterConsumptionsPerDevice
MAX_BINDING_CONDITIONS = 4
MAX_VALID_VALUES = requestpolicy.MAX_VALID_VALUES
# DeviceAttribute's JSON fields and the Go field names the server prints the struct with.
_ATTRIBUTE_FIELDS = {
    "int": "IntValue",
    "bool": "BoolValue",
    "string": "StringValue",
    "version": "VersionValue",
    "ints": "IntValues",
    "bools": "BoolValues",
    "strings": "StringValues",
    "versions": "VersionValues",
}
_LIST_KINDS = ("ints", "bools", "strings", "versions")
_SEMVER_MSG = "must be a string compatible with semver.org spec 2.0.0"
_PER_DEVICE_MSG = (
    "exactly one of `nodeName`, `nodeSelector`, or `allNodes` is required when "
    "`perDeviceNodeSelection` is set to true in the ResourceSlice spec"
)


def uses_special_limit(device: Mapping[str, Any]) -> bool:
    """``haveDeviceTaints || haveConsumesCounters`` (and list attributes): the device lowers
    the per-slice device limit to 64."""
    attrs = (device.get("attributes") or {}).values()
    return bool(
        device.get("taints")
        or device.get("consumesCounters")
        or any(k in (a or {}) for a in attrs for k in _LIST_KINDS)
    )


def device_errors(
    path: str,
    device: Mapping[str, Any],
    *,
    per_device: bool,
    old: Mapping[str, Any] | None = None,
) -> list[FieldError]:
    """``validateDevice``; ``old`` is the same-named device of the slice being replaced."""
    name = device.get("name") or ""
    dev = name or None
    errors = [
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
    values = sum(_value_count(a) for a in attributes.values())
    if values > MAX_ATTRIBUTE_VALUES:
        errors.append(
            fielderrors.invalid(
                path,
                values,
                f"the total number of attribute values must not exceed {MAX_ATTRIBUTE_VALUES}",
                device=dev,
            )
        )
    for key, attr in attributes.items():  # validateMap(attributes, validateQualifiedName, ...)
        errors += attrnames.qualified_name_errors(f"{path}.attributes", key, device=dev)
        errors += _attribute(attrnames.map_key_path(f"{path}.attributes", key), attr, dev)
    multi = device.get("allowMultipleAllocations") is True
    for key, cap in capacity.items():
        errors += attrnames.qualified_name_errors(f"{path}.capacity", key, device=dev)
        errors += _capacity(attrnames.map_key_path(f"{path}.capacity", key), cap, multi, dev)
    taints = device.get("taints") or []
    unchanged = old is not None and taintrules.same_taints(old.get("taints") or [], taints)
    if not unchanged:  # an updated device's unchanged taints are not checked
        errors += taintrules.taint_list_errors(f"{path}.taints", taints, dev)
    errors += _consumptions(f"{path}.consumesCounters", device.get("consumesCounters") or [], dev)
    errors += _node_selection(path, device, per_device, dev)
    errors += binding_errors(path, device, dev)
    return errors


def _value_count(attr: Mapping[str, Any]) -> int:
    """Values one attribute contributes: 1 per scalar field set, the length of each list."""
    return sum(len(attr[k]) if k in _LIST_KINDS else 1 for k in _ATTRIBUTE_FIELDS if k in attr)


def _attribute(path: str, attr: Mapping[str, Any], dev: str | None) -> list[FieldError]:
    """``validateDeviceAttribute``: each value checked, then exactly one field set (an empty
    list counts as set: ``ints: []`` is not ``ints: null``)."""
    errors: list[FieldError] = []
    for kind in ("string", "version"):
        if kind in attr:
            errors += _text(f"{path}.{kind}", attr[kind], kind == "version", dev)
    for kind in _LIST_KINDS:
        if kind not in attr:
            continue
        items = attr[kind]
        if not items:
            errors.append(
                fielderrors.invalid(
                    f"{path}.{kind}", items, "must not be empty if specified", device=dev
                )
            )
        if kind in ("strings", "versions"):
            for i, item in enumerate(items):
                errors += _text(f"{path}.{kind}[{i}]", item, kind == "versions", dev)
    given = [k for k in _ATTRIBUTE_FIELDS if k in attr]
    if not given:
        errors.append(
            fielderrors.invalid(path, "", "exactly one value must be specified", device=dev)
        )
    elif len(given) > 1:
        errors.append(
            fielderrors.invalid(
                path, _go_struct(attr), "exactly one value must be specified", device=dev
            )
        )
    return errors


def _go_struct(attr: Mapping[str, Any]) -> fielderrors.Rendered:
    """The internal DeviceAttribute as the server prints it in this error."""
    shown = {go: attr.get(field) for field, go in _ATTRIBUTE_FIELDS.items()}
    return fielderrors.Rendered(json.dumps(shown, separators=(",", ":")))


def _text(path: str, value: str, version: bool, dev: str | None) -> list[FieldError]:
    """``validateDeviceAttributeStringValue`` / ``...VersionValue``: a version must be semver
    (checked first) and either must fit in 64 bytes; both can be reported."""
    errors: list[FieldError] = []
    if version and not semver.is_semver(value):
        errors.append(fielderrors.invalid(path, value, _SEMVER_MSG, device=dev))
    if len(value.encode()) > MAX_VALUE_LEN:
        errors.append(fielderrors.too_long(path, MAX_VALUE_LEN, device=dev))
    return errors


def _capacity(path: str, cap: Mapping[str, Any], multi: bool, dev: str | None) -> list[FieldError]:
    """``validateSingleAllocatableDeviceCapacity`` / ``validateMultiAllocatableDeviceCapacity``:
    the value needs no check (any quantity that decoded is valid); a ``requestPolicy`` only on
    a device allowing multiple allocations, then checked by :mod:`requestpolicy`."""
    policy = cap.get("requestPolicy")
    if policy is None:
        return []
    if not multi:
        return [
            fielderrors.forbidden(
                f"{path}.requestPolicy", "allowMultipleAllocations must be true", device=dev
            )
        ]
    return requestpolicy.errors(f"{path}.requestPolicy", cap.get("value") or "0", policy, dev)


def _consumptions(path: str, consumes: list[Any], dev: str | None) -> list[FieldError]:
    """``validateSet(consumesCounters, 2, validateDeviceCounterConsumption, counterSet)``."""
    if len(consumes) > MAX_CONSUMPTIONS:
        return [fielderrors.too_many(path, len(consumes), MAX_CONSUMPTIONS, device=dev)]
    errors: list[FieldError] = []
    for i, use in enumerate(consumes):
        errors += counter_set_errors(f"{path}[{i}]", use, name_field="counterSet", dev=dev)
    return errors + duplicates(path, [use.get("counterSet") or "" for use in consumes], dev)


def counter_set_errors(
    path: str, entry: Mapping[str, Any], *, name_field: str, dev: str | None = None
) -> list[FieldError]:
    """``validateCounterSet`` / ``validateDeviceCounterConsumption``: a DNS-label name, and a
    non-empty map of at most 32 DNS-label counters (any parsed quantity is a valid value)."""
    errors = label_errors(f"{path}.{name_field}", entry.get(name_field) or "", dev)
    counters = entry.get("counters") or {}
    counters_path = f"{path}.counters"
    if not counters:
        errors.append(fielderrors.required(counters_path, device=dev))
    elif len(counters) > MAX_COUNTERS:  # validateMap: too many short-circuits
        errors.append(fielderrors.too_many(counters_path, len(counters), MAX_COUNTERS, device=dev))
    else:
        for key in counters:
            errors += [
                fielderrors.invalid(counters_path, key, p, device=dev) for p in names.dns_label(key)
            ]
    return errors


def label_errors(path: str, value: str, dev: str | None = None) -> list[FieldError]:
    """A required DNS label (``validateCounterName`` with the ``Required`` check before it)."""
    if not value:
        return [fielderrors.required(path, device=dev)]
    return [fielderrors.invalid(path, value, p, device=dev) for p in names.dns_label(value)]


def duplicates(path: str, keys: list[Any], dev: str | None = None) -> list[FieldError]:
    """The uniqueness half of ``validateSet``: ``Duplicate`` at each repeated index."""
    seen: set[Any] = set()
    errors: list[FieldError] = []
    for i, key in enumerate(keys):
        if key in seen:
            errors.append(fielderrors.duplicate(f"{path}[{i}]", key, device=dev))
        seen.add(key)
    return errors


def _node_selection(
    path: str, device: Mapping[str, Any], per_device: bool, dev: str | None
) -> list[FieldError]:
    """The per-device node selection part of ``validateDevice``."""
    fields = ("nodeName", "nodeSelector", "allNodes")
    if not per_device:
        if any(device.get(f) is not None for f in fields):
            return [
                fielderrors.invalid(
                    path,
                    None,
                    "`nodeName`, `nodeSelector` and `allNodes` can only be set if "
                    "`perDeviceNodeSelection` is set to true in the ResourceSlice spec",
                    device=dev,
                )
            ]
        return []
    errors: list[FieldError] = []
    chosen: list[str] = []
    node = device.get("nodeName")
    if node is not None:
        if node:
            chosen.append("`nodeName`")
            errors += metarules.node_name(f"{path}.nodeName", node, device=dev)
        else:
            errors.append(
                fielderrors.invalid(f"{path}.nodeName", node, "must not be empty", device=dev)
            )
    if device.get("nodeSelector") is not None:
        chosen.append("`nodeSelector`")
        errors += metarules.node_selector(f"{path}.nodeSelector", device["nodeSelector"])
    all_nodes = device.get("allNodes")
    if all_nodes is True:
        chosen.append("`allNodes`")
    elif all_nodes is not None:
        errors.append(
            fielderrors.invalid(
                f"{path}.allNodes", all_nodes, "must be either unset or set to true", device=dev
            )
        )
    if not chosen:
        errors.append(fielderrors.required(path, _PER_DEVICE_MSG, device=dev))
    elif len(chosen) > 1:
        shown = "{" + ", ".join(chosen) + "}"
        errors.append(fielderrors.invalid(path, shown, _PER_DEVICE_MSG, device=dev))
    return errors


def binding_errors(path: str, device: Mapping[str, Any], dev: str | None) -> list[FieldError]:
    """``validateDeviceBindingParameters``."""
    conditions = device.get("bindingConditions") or []
    failures = device.get("bindingFailureConditions") or []
    errors: list[FieldError] = []
    for field, items in (("bindingConditions", conditions), ("bindingFailureConditions", failures)):
        sub = f"{path}.{field}"
        if len(items) > MAX_BINDING_CONDITIONS:  # validateSlice: too many short-circuits
            errors.append(fielderrors.too_many(sub, len(items), MAX_BINDING_CONDITIONS, device=dev))
            continue
        for i, item in enumerate(items):
            errors += metarules.label_name(f"{sub}[{i}]", item, device=dev)
    errors += duplicates(f"{path}.bindingConditions", conditions, dev)
    seen: set[str] = set()
    for i, item in enumerate(failures):
        sub = f"{path}.bindingFailureConditions[{i}]"
        if item in seen:
            errors.append(fielderrors.duplicate(sub, item, device=dev))
        seen.add(item)
        if item in conditions:
            errors.append(
                fielderrors.invalid(
                    sub,
                    item,
                    "bindingFailureConditions must not overlap with bindingConditions",
                    device=dev,
                )
            )
    if not conditions and failures:
        errors.append(
            fielderrors.invalid(
                f"{path}.bindingConditions",
                None,
                "bindingConditions are required to use bindingFailureConditions",
                device=dev,
            )
        )
    if not failures and conditions:
        errors.append(
            fielderrors.invalid(
                f"{path}.bindingFailureConditions",
                None,
                "bindingFailureConditions are required to use bindingConditions",
                device=dev,
            )
        )
    return errors
