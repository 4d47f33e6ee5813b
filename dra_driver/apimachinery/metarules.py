"""Validation rules shared by every resource.k8s.io object: ObjectMeta, node selectors, driver
and node names, label keys and values as field errors.

Why it exists: ResourceSlices (local validator and in-memory API), ResourceClaims and
DeviceClasses (in-memory API) all start with the same object-metadata rules and use the same
name helpers, so they live here once. Each function mirrors the upstream Kubernetes function
named in its docstring (``pkg/apis/core/validation``, apimachinery's
``api/validation/objectmeta.go``, ``apis/meta/v1/validation``): same checks, same order, same
field paths and wording, so our verdicts read like the server's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dra_driver.apimachinery import fielderrors, names
from dra_driver.apimachinery.fielderrors import FieldError

DRIVER_NAME_MAX = 63
TOTAL_ANNOTATION_SIZE = 256 * 1024


def each(path: str, value: Any, problems: list[str]) -> list[FieldError]:
    """One ``Invalid`` error per message, as the ``for _, msg := range ...`` loops do."""
    return [fielderrors.invalid(path, value, p) for p in problems]


def label_name(path: str, value: str, *, device: str | None = None) -> list[FieldError]:
    """``metav1validation.ValidateLabelName``: Invalid per ``IsQualifiedName`` message (an
    empty key gets two: non-empty and format)."""
    return [fielderrors.invalid(path, value, p, device=device) for p in names.qualified_name(value)]


def label_value(path: str, value: str, *, device: str | None = None) -> list[FieldError]:
    """The ``validateLabelValue`` helper of the resource validation: ``IsValidLabelValue``."""
    return [fielderrors.invalid(path, value, p, device=device) for p in names.label_value(value)]


def driver_name(path: str, value: str, *, device: str | None = None) -> list[FieldError]:
    """``corevalidation.ValidateCSIDriverName`` (what resource validation uses for driver names
    and attribute domains): required; at most 63 characters; a DNS subdomain once lower-cased
    (so upper case is accepted). Too long and badly formed are both reported."""
    if not value:
        return [fielderrors.required(path, device=device)]
    errors: list[FieldError] = []
    if len(value) > DRIVER_NAME_MAX:
        errors.append(fielderrors.too_long(path, DRIVER_NAME_MAX, device=device))
    errors += [
        fielderrors.invalid(path, value, p, device=device)
        for p in names.dns_subdomain(value.lower())
    ]
    return errors


def node_name(path: str, value: str, *, device: str | None = None) -> list[FieldError]:
    """``validateNodeName`` of the resource validation: ``ValidateNodeName`` is
    ``NameIsDNSSubdomain``."""
    return [fielderrors.invalid(path, value, p, device=device) for p in names.dns_subdomain(value)]


def object_meta(meta: Mapping[str, Any], *, namespaced: bool) -> list[FieldError]:
    """``ValidateObjectMeta(WithOpts)``: name or generateName (a DNS subdomain; for
    generateName the prefix is checked as if a suffix were appended), namespace required or
    forbidden, labels, annotations, owner references."""
    errors: list[FieldError] = []
    name, generate = meta.get("name") or "", meta.get("generateName") or ""
    if generate:
        errors += each("metadata.generateName", generate, names.dns_subdomain(generate + "x"))
    if not name and not generate:
        errors.append(fielderrors.required("metadata.name", "name or generateName is required"))
    elif name:
        errors += each("metadata.name", name, names.dns_subdomain(name))
    namespace = meta.get("namespace") or ""
    if namespaced and not namespace:
        errors.append(fielderrors.required("metadata.namespace"))
    elif namespaced:
        errors += each("metadata.namespace", namespace, names.dns_label(namespace))
    elif namespace:
        errors.append(fielderrors.forbidden("metadata.namespace", "not allowed on this type"))
    for key, value in (meta.get("labels") or {}).items():  # ValidateLabels
        errors += label_name("metadata.labels", key)
        errors += label_value("metadata.labels", value)
    errors += _annotations(meta.get("annotations") or {})
    errors += _owner_references(meta.get("ownerReferences") or [])
    return errors


def _annotations(annotations: Mapping[str, str]) -> list[FieldError]:
    """``ValidateAnnotations``: keys are qualified names once lower-cased; 256 KiB in all."""
    errors: list[FieldError] = []
    total = 0
    for key, value in annotations.items():
        errors += each("metadata.annotations", key, names.qualified_name(key.lower()))
        total += len(key) + len(value)
    if total > TOTAL_ANNOTATION_SIZE:
        errors.append(fielderrors.too_long("metadata.annotations", TOTAL_ANNOTATION_SIZE))
    return errors


def _owner_references(refs: list[Mapping[str, Any]]) -> list[FieldError]:
    """``ValidateOwnerReferences``: version, kind, name and uid present; one controller."""
    errors: list[FieldError] = []
    controllers = []
    for i, ref in enumerate(refs):
        path = f"metadata.ownerReferences[{i}]"
        api_version = ref.get("apiVersion") or ""
        if not api_version.rpartition("/")[2]:
            errors.append(
                fielderrors.invalid(f"{path}.apiVersion", api_version, "version must not be empty")
            )
        for field in ("kind", "name", "uid"):
            if not ref.get(field):
                errors.append(
                    fielderrors.invalid(f"{path}.{field}", "", f"{field} must not be empty")
                )
        if ref.get("controller") is True:
            controllers.append(f"{ref.get('kind')}/{ref.get('name')}")
    if len(controllers) > 1:
        errors.append(
            fielderrors.invalid(
                "metadata.ownerReferences",
                refs,
                'Only one reference can have Controller set to true. Found "true" in '
                f"references for {' and '.join(controllers)}",
            )
        )
    return errors


def node_selector(path: str, selector: Mapping[str, Any]) -> list[FieldError]:
    """``corevalidation.ValidateNodeSelector`` (label values checked, as for slices)."""
    terms = selector.get("nodeSelectorTerms") or []
    terms_path = f"{path}.nodeSelectorTerms"
    if not terms:
        return [fielderrors.required(terms_path, "must have at least one node selector term")]
    errors: list[FieldError] = []
    for i, term in enumerate(terms):
        for j, req in enumerate(term.get("matchExpressions") or []):
            errors += _requirement(f"{terms_path}[{i}].matchExpressions[{j}]", req)
        for j, req in enumerate(term.get("matchFields") or []):
            errors += _field_requirement(f"{terms_path}[{i}].matchFields[{j}]", req)
    return errors


def _requirement(path: str, req: Mapping[str, Any]) -> list[FieldError]:
    """``ValidateNodeSelectorRequirement``."""
    errors: list[FieldError] = []
    operator, values = req.get("operator") or "", req.get("values") or []
    if operator in ("In", "NotIn"):
        if not values:
            errors.append(
                fielderrors.required(
                    f"{path}.values", "must be specified when `operator` is 'In' or 'NotIn'"
                )
            )
    elif operator in ("Exists", "DoesNotExist"):
        if values:
            errors.append(
                fielderrors.forbidden(
                    f"{path}.values",
                    "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                )
            )
    elif operator in ("Gt", "Lt"):
        if len(values) != 1:
            errors.append(
                fielderrors.required(
                    f"{path}.values",
                    "must be specified single value when `operator` is 'Lt' or 'Gt'",
                )
            )
    else:
        errors.append(
            fielderrors.invalid(f"{path}.operator", operator, "not a valid selector operator")
        )
    errors += label_name(f"{path}.key", req.get("key") or "")
    for i, value in enumerate(values):
        errors += label_value(f"{path}.values[{i}]", value)
    return errors


def _field_requirement(path: str, req: Mapping[str, Any]) -> list[FieldError]:
    """``ValidateNodeFieldSelectorRequirement``: only ``metadata.name``, In/NotIn, one value."""
    errors: list[FieldError] = []
    operator, values = req.get("operator") or "", req.get("values") or []
    if operator in ("In", "NotIn"):
        if len(values) != 1:
            errors.append(
                fielderrors.required(
                    f"{path}.values",
                    "must be only one value when `operator` is 'In' or 'NotIn' for node field "
                    "selector",
                )
            )
    else:
        errors.append(
            fielderrors.invalid(f"{path}.operator", operator, "not a valid selector operator")
        )
    key = req.get("key") or ""
    if key != "metadata.name":
        errors.append(fielderrors.invalid(f"{path}.key", key, "not a valid field selector key"))
    else:
        for i, value in enumerate(values):
            errors += node_name(f"{path}.values[{i}]", value)
    return errors
