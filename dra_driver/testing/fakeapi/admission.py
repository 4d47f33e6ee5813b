"""What the API server does to ResourceClaims and DeviceClasses before it stores them:
defaulting and validation, as far as our in-memory API needs them.

Why it exists: tests and the demo create claims and classes through the in-memory API, and a
fake that accepts what the real server refuses (or stores a claim without the server's
defaults) lets bugs through. Each rule mirrors the Kubernetes v1.36
``pkg/apis/resource/validation`` function named beside it (``validateDeviceRequest``,
``validateDeviceToleration``, ...), after the strict JSON decoding of
:mod:`dra_driver.apimachinery.strictdecode`; tests hold it to the recorded verdicts of a real
kube-apiserver (``../shared/reference/apiserver-verdicts``) and to cases of their own. CEL
selectors are compiled with the allocator's compiler, so a selector the server rejects fails
here too, with the expression in the message.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from dra_driver.allocation import cel as cel_module
from dra_driver.apimachinery import fielderrors, metarules, names, strictdecode
from dra_driver.apimachinery.fielderrors import FieldError
from dra_driver.slices import attrnames, devicerules, taintrules

ADMIN_ACCESS_LABEL = "resource.kubernetes.io/admin-access"
MAX_REQUESTS = 32
MAX_SUBREQUESTS = 8
MAX_SELECTORS = 32
MAX_CONSTRAINTS = 32
MAX_CONFIGS = 32
MAX_TOLERATIONS = 16
MAX_CEL_BYTES = 10 * 1024
MAX_OPAQUE_BYTES = 10 * 1024
ALLOCATION_MODES = ("All", "ExactCount")
TOLERATION_OPERATORS = ("Equal", "Exists")
_REQUEST_REF_MSG = (
    "must be the name of a request in the claim or the name of a request and a subrequest "
    "separated by '/'"
)

CelCompiler = Callable[[str], object]


def default_cel_compiler() -> CelCompiler:
    """The allocator's selector compiler (raises ``cel.CelCompileError``)."""
    return cel_module.compile_selector


def default_claim(obj: dict[str, Any]) -> None:
    """Apply the server's defaults in place (``SetDefaults_ExactDeviceRequest``,
    ``SetDefaults_DeviceSubRequest``, ``SetDefaults_DeviceToleration``): ``allocationMode:
    ExactCount`` with ``count: 1``, and toleration operator ``Equal``."""
    devices = (obj.get("spec") or {}).get("devices") or {}
    for request in devices.get("requests") or ():
        if not isinstance(request, dict):
            continue
        exact = request.get("exactly")
        targets = [exact] if isinstance(exact, dict) else []
        targets += [s for s in request.get("firstAvailable") or () if isinstance(s, dict)]
        for target in targets:
            if not target.get("allocationMode"):
                target["allocationMode"] = "ExactCount"
            if target["allocationMode"] == "ExactCount" and not target.get("count"):
                target["count"] = 1
            if target.get("count") == 0:
                del target["count"]
            for toleration in target.get("tolerations") or ():
                if isinstance(toleration, dict) and not toleration.get("operator"):
                    toleration["operator"] = "Equal"


def validate_claim(
    obj: Mapping[str, Any],
    *,
    namespace_labels: Mapping[str, str],
    cel: CelCompiler | None,
) -> list[FieldError]:
    """``ValidateResourceClaim`` (plus the strategy's admin-access check) on a defaulted
    claim; decode problems (400) alone when any."""
    decoding = strictdecode.decode_errors("ResourceClaim", dict(obj))
    if decoding:
        return decoding
    obj = strictdecode.decoded("ResourceClaim", dict(obj))
    errors = metarules.object_meta(obj.get("metadata") or {}, namespaced=True)
    devices = (obj.get("spec") or {}).get("devices") or {}
    path = "spec.devices"
    requests = devices.get("requests") or []
    known = _request_names(requests)
    if len(requests) > MAX_REQUESTS:  # validateSet: too many short-circuits
        errors.append(fielderrors.too_many(f"{path}.requests", len(requests), MAX_REQUESTS))
    else:
        for i, request in enumerate(requests):
            errors += _request(f"{path}.requests[{i}]", request, namespace_labels, cel)
        errors += devicerules.duplicates(
            f"{path}.requests", [r.get("name") or "" for r in requests]
        )
    constraints = devices.get("constraints") or []
    if len(constraints) > MAX_CONSTRAINTS:
        errors.append(
            fielderrors.too_many(f"{path}.constraints", len(constraints), MAX_CONSTRAINTS)
        )
    else:
        for i, constraint in enumerate(constraints):
            errors += _constraint(f"{path}.constraints[{i}]", constraint, known)
    configs = devices.get("config") or []
    if len(configs) > MAX_CONFIGS:
        errors.append(fielderrors.too_many(f"{path}.config", len(configs), MAX_CONFIGS))
    else:
        for i, config in enumerate(configs):
            cpath = f"{path}.config[{i}]"
            errors += _request_refs(f"{cpath}.requests", config.get("requests") or [], known)
            errors += _opaque(f"{cpath}.opaque", config.get("opaque"))
    return errors


def _request_names(requests: list[Mapping[str, Any]]) -> dict[str, set[str]]:
    """``gatherRequestNames``: request name → its subrequest names."""
    return {
        r.get("name") or "": {s.get("name") or "" for s in r.get("firstAvailable") or []}
        for r in requests
    }


def _request(
    path: str,
    request: Mapping[str, Any],
    namespace_labels: Mapping[str, str],
    cel: CelCompiler | None,
) -> list[FieldError]:
    """``validateDeviceRequest``: a DNS-label name and exactly one of ``exactly`` /
    ``firstAvailable`` (a non-empty list); admin access needs the namespace label."""
    errors = _dns_label(f"{path}.name", request.get("name") or "")
    exact = request.get("exactly")
    subs = request.get("firstAvailable") or []
    listing = "exactly one of `exactly` or `firstAvailable` is required"
    if exact is not None and subs:
        errors.append(fielderrors.invalid(path, None, f"{listing}, but multiple fields are set"))
    elif exact is None and not subs:
        errors.append(fielderrors.required(path, listing))
    elif subs:
        if len(subs) > MAX_SUBREQUESTS:
            errors.append(
                fielderrors.too_many(f"{path}.firstAvailable", len(subs), MAX_SUBREQUESTS)
            )
        else:
            for j, sub in enumerate(subs):
                spath = f"{path}.firstAvailable[{j}]"
                errors += _dns_label(f"{spath}.name", sub.get("name") or "")
                errors += _exact(spath, sub, cel)
            errors += devicerules.duplicates(
                f"{path}.firstAvailable", [s.get("name") or "" for s in subs]
            )
    elif exact is not None:
        errors += _exact(f"{path}.exactly", exact, cel)
        # The strategy's AdminAccess check (not part of validation proper).
        if exact.get("adminAccess") and namespace_labels.get(ADMIN_ACCESS_LABEL) != "true":
            errors.append(
                fielderrors.forbidden(
                    f"{path}.adminAccess",
                    "admin access to devices requires the "
                    f"`{ADMIN_ACCESS_LABEL}: true` label on the containing namespace",
                )
            )
    return errors


def _constraint(
    path: str, constraint: Mapping[str, Any], known: Mapping[str, set[str]]
) -> list[FieldError]:
    """``validateDeviceConstraint``: request references, then ``matchAttribute`` if set, else
    ``distinctAttribute`` if set (a set one is validated even when empty), else the server's
    required-error (its wording, "but multiple fields are set" included, is the server's)."""
    errors = _request_refs(f"{path}.requests", constraint.get("requests") or [], known)
    for field in ("matchAttribute", "distinctAttribute"):
        if constraint.get(field) is not None:
            return errors + attrnames.fully_qualified_name_errors(
                f"{path}.{field}", constraint[field]
            )
    errors.append(
        fielderrors.required(
            path,
            'exactly one of "matchAttribute" or "distinctAttribute" is required, but multiple '
            "fields are set",
        )
    )
    return errors


def validate_device_class(obj: Mapping[str, Any], *, cel: CelCompiler | None) -> list[FieldError]:
    """``ValidateDeviceClass``; decode problems (400) alone when any."""
    decoding = strictdecode.decode_errors("DeviceClass", dict(obj))
    if decoding:
        return decoding
    obj = strictdecode.decoded("DeviceClass", dict(obj))
    errors = metarules.object_meta(obj.get("metadata") or {}, namespaced=False)
    spec = obj.get("spec") or {}
    errors += _selectors("spec.selectors", spec.get("selectors") or [], cel)
    configs = spec.get("config") or []
    if len(configs) > MAX_CONFIGS:
        errors.append(fielderrors.too_many("spec.config", len(configs), MAX_CONFIGS))
    else:
        for i, config in enumerate(configs):
            errors += _opaque(f"spec.config[{i}].opaque", config.get("opaque"))
    extended = spec.get("extendedResourceName")
    if extended is not None and not names.is_extended_resource_name(extended):
        errors.append(
            fielderrors.invalid(
                "spec.extendedResourceName", extended, "must be a valid extended resource name"
            )
        )
    return errors


def fully_qualified_name_errors(path: str, value: str) -> list[FieldError]:
    """``validateFullyQualifiedName`` (``domain/identifier``, as constraints require)."""
    return attrnames.fully_qualified_name_errors(path, value)


def _dns_label(path: str, value: str) -> list[FieldError]:
    """``validateRequestName`` = ``ValidateDNS1123Label``: an empty name is an invalid label,
    not a missing value."""
    return [fielderrors.invalid(path, value, p) for p in names.dns_label(value)]


def _exact(path: str, request: Mapping[str, Any], cel: CelCompiler | None) -> list[FieldError]:
    """``validateExactDeviceRequest`` / the shared part of ``validateDeviceSubRequest``."""
    errors: list[FieldError] = []
    class_name = request.get("deviceClassName") or ""
    if not class_name:
        errors.append(fielderrors.required(f"{path}.deviceClassName"))
    else:
        errors += [
            fielderrors.invalid(f"{path}.deviceClassName", class_name, p)
            for p in names.dns_subdomain(class_name)
        ]
    errors += _selectors(f"{path}.selectors", request.get("selectors") or [], cel)
    mode = request.get("allocationMode") or ""
    count = request.get("count") or 0
    if mode == "All":  # validateDeviceAllocationMode
        if count != 0:
            errors.append(
                fielderrors.invalid(
                    f"{path}.count", count, "must not be specified when allocationMode is 'All'"
                )
            )
    elif mode == "ExactCount":
        if count <= 0:
            errors.append(fielderrors.invalid(f"{path}.count", count, "must be greater than zero"))
    else:
        errors.append(fielderrors.not_supported(f"{path}.allocationMode", mode, ALLOCATION_MODES))
    tolerations = request.get("tolerations") or []
    errors += _limit(f"{path}.tolerations", tolerations, MAX_TOLERATIONS)
    for i, toleration in enumerate(tolerations):
        errors += _toleration(f"{path}.tolerations[{i}]", toleration)
    return errors


def _limit(path: str, items: list[Any], limit: int) -> list[FieldError]:
    return [fielderrors.too_many(path, len(items), limit)] if len(items) > limit else []


def _selectors(path: str, selectors: list[Any], cel: CelCompiler | None) -> list[FieldError]:
    """``validateSelectorSlice``: at most 32 (short-circuits), each with a CEL expression of at
    most 10 KiB that compiles (too long is not compiled)."""
    if len(selectors) > MAX_SELECTORS:
        return [fielderrors.too_many(path, len(selectors), MAX_SELECTORS)]
    errors: list[FieldError] = []
    for i, selector in enumerate(selectors):
        cel_path = f"{path}[{i}].cel"
        expression = (selector.get("cel") or {}).get("expression")
        if selector.get("cel") is None:
            errors.append(fielderrors.required(cel_path))
        elif not expression:
            errors.append(fielderrors.required(f"{cel_path}.expression"))
        elif len(expression.encode()) > MAX_CEL_BYTES:
            errors.append(fielderrors.too_long(f"{cel_path}.expression", MAX_CEL_BYTES))
        elif cel is not None:
            try:
                cel(expression)
            except cel_module.CelCompileError as exc:
                errors.append(fielderrors.invalid(f"{cel_path}.expression", expression, exc.reason))
    return errors


def _toleration(path: str, toleration: Mapping[str, Any]) -> list[FieldError]:
    """``validateDeviceToleration``: a non-empty key is a label name; ``Exists`` wants no
    value, ``Equal`` a label value; a non-empty effect is a taint effect. (Unlike pod
    tolerations there is no rule tying an empty key or ``tolerationSeconds`` to anything.)"""
    errors: list[FieldError] = []
    key = toleration.get("key") or ""
    if key:
        errors += metarules.label_name(f"{path}.key", key)
    operator = toleration.get("operator") or ""
    value = toleration.get("value") or ""
    if operator == "Exists":
        if value:
            errors.append(
                fielderrors.invalid(f"{path}.value", value, "must be empty for operator `Exists`")
            )
    elif operator == "Equal":
        errors += metarules.label_value(f"{path}.value", value)
    elif not operator:
        errors.append(fielderrors.required(f"{path}.operator"))
    else:
        errors.append(fielderrors.not_supported(f"{path}.operator", operator, TOLERATION_OPERATORS))
    effect = toleration.get("effect") or ""
    if effect and effect not in taintrules.TAINT_EFFECTS:
        errors.append(fielderrors.not_supported(f"{path}.effect", effect, taintrules.TAINT_EFFECTS))
    return errors


def _request_refs(path: str, refs: list[str], known: Mapping[str, set[str]]) -> list[FieldError]:
    """``validateSet(requests, 32, validateRequestNameRef)``: ``request`` or
    ``request/subrequest`` of this claim, each segment a DNS label, no duplicates."""
    if len(refs) > MAX_REQUESTS:
        return [fielderrors.too_many(path, len(refs), MAX_REQUESTS)]
    errors: list[FieldError] = []
    for i, ref in enumerate(refs):
        item = f"{path}[{i}]"
        segments = ref.split("/")
        if len(segments) > 2:
            errors.append(fielderrors.invalid(item, ref, _REQUEST_REF_MSG))
            continue
        for segment in segments:
            errors += _dns_label(item, segment)
        request, sub = segments[0], segments[1] if len(segments) == 2 else None
        if request not in known or (sub is not None and sub not in known[request]):
            errors.append(fielderrors.invalid(item, ref, _REQUEST_REF_MSG))
    return errors + devicerules.duplicates(path, list(refs))


def _opaque(path: str, opaque: Mapping[str, Any] | None) -> list[FieldError]:
    """``validateOpaqueConfiguration``: a driver name, and parameters that are a JSON object
    of at most 10 KiB (``validateRawExtension``)."""
    if opaque is None:
        return [fielderrors.required(path)]
    errors = metarules.driver_name(f"{path}.driver", opaque.get("driver") or "")
    params = opaque.get("parameters")
    if params is None:
        errors.append(fielderrors.required(f"{path}.parameters"))
    elif len(json.dumps(params, separators=(",", ":")).encode()) > MAX_OPAQUE_BYTES:
        errors.append(fielderrors.too_long(f"{path}.parameters", MAX_OPAQUE_BYTES))
    elif not isinstance(params, dict):
        errors.append(
            fielderrors.invalid(
                f"{path}.parameters", "<value omitted>", "must be a valid JSON object"
            )
        )
    return errors
