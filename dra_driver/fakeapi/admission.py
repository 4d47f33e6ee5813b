"""What the API server does to ResourceClaims and DeviceClasses before it stores them:
defaulting and validation, as far as our in-memory API needs them.

Why it exists: tests and the demo create claims and classes through the in-memory API, and a
fake that accepts what the real server refuses (or stores a claim without the server's
defaults) lets bugs through. The rules follow contracts.md §5.2-5.3 and the recorded verdicts of
a real kube-apiserver (``../shared/reference/apiserver-verdicts``). CEL selectors are compiled
with the allocator's compiler, so a selector the server rejects fails here
too, with the expression in the message.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from dra_driver.allocation import cel as cel_module
from dra_driver.apimachinery import fielderrors, names, schema
from dra_driver.apimachinery.fielderrors import FieldError
from dra_driver.slices import validate as slice_validate

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
    """Apply the server's defaults in place: ``allocationMode: ExactCount``, ``count: 1``."""
    devices = (obj.get("spec") or {}).get("devices") or {}
    for request in devices.get("requests") or ():
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


def validate_claim(
    obj: Mapping[str, Any],
    *,
    namespace_labels: Mapping[str, str],
    cel: CelCompiler | None,
) -> list[FieldError]:
    """Problems with a (defaulted) ResourceClaim, decode problems (400) alone when any."""
    decoding = schema.decode_errors("ResourceClaim", dict(obj))
    if decoding:
        return decoding
    errors = slice_validate.validate_metadata(obj.get("metadata") or {}, namespaced=True)
    devices = (obj.get("spec") or {}).get("devices") or {}
    path = "spec.devices"
    requests = devices.get("requests") or []
    errors += _limit(f"{path}.requests", requests, MAX_REQUESTS)
    known: dict[str, set[str]] = {}
    for i, request in enumerate(requests):
        rpath = f"{path}.requests[{i}]"
        name = request.get("name") or ""
        if name in known:
            errors.append(fielderrors.duplicate(rpath, name))
        errors += _dns_label(f"{rpath}.name", name)
        subs = request.get("firstAvailable") or []
        known[name] = {s.get("name") or "" for s in subs}
        exact = request.get("exactly")
        listing = "exactly one of `exactly` or `firstAvailable` is required"
        if exact is not None and subs:
            errors.append(
                fielderrors.invalid(rpath, None, f"{listing}, but multiple fields are set")
            )
        elif exact is None and not subs:
            errors.append(fielderrors.required(rpath, listing))
        elif exact is not None:
            errors += _exact(f"{rpath}.exactly", exact, cel)
            if exact.get("adminAccess") and namespace_labels.get(ADMIN_ACCESS_LABEL) != "true":
                errors.append(
                    fielderrors.forbidden(
                        f"{rpath}.adminAccess",
                        "admin access to devices requires the "
                        f"`{ADMIN_ACCESS_LABEL}: true` label on the containing namespace",
                    )
                )
        else:
            errors += _limit(f"{rpath}.firstAvailable", subs, MAX_SUBREQUESTS)
            seen: set[str] = set()
            for j, sub in enumerate(subs):
                spath = f"{rpath}.firstAvailable[{j}]"
                sub_name = sub.get("name") or ""
                if sub_name in seen:
                    errors.append(fielderrors.duplicate(spath, sub_name))
                seen.add(sub_name)
                errors += _dns_label(f"{spath}.name", sub_name)
                errors += _exact(spath, sub, cel)
    constraints = devices.get("constraints") or []
    errors += _limit(f"{path}.constraints", constraints, MAX_CONSTRAINTS)
    for i, constraint in enumerate(constraints):
        cpath = f"{path}.constraints[{i}]"
        errors += _request_refs(f"{cpath}.requests", constraint.get("requests") or [], known)
        given = [f for f in ("matchAttribute", "distinctAttribute") if constraint.get(f)]
        if len(given) != 1:
            errors.append(
                fielderrors.invalid(
                    cpath,
                    None,
                    "exactly one of `matchAttribute` or `distinctAttribute` is required",
                )
            )
        for field in given:
            errors += fully_qualified_name_errors(f"{cpath}.{field}", constraint[field])
    configs = devices.get("config") or []
    errors += _limit(f"{path}.config", configs, MAX_CONFIGS)
    for i, config in enumerate(configs):
        cpath = f"{path}.config[{i}]"
        errors += _request_refs(f"{cpath}.requests", config.get("requests") or [], known)
        errors += _opaque(f"{cpath}.opaque", config.get("opaque"))
    return errors


def validate_device_class(obj: Mapping[str, Any], *, cel: CelCompiler | None) -> list[FieldError]:
    """Problems with a DeviceClass, decode problems (400) alone when any."""
    decoding = schema.decode_errors("DeviceClass", dict(obj))
    if decoding:
        return decoding
    errors = slice_validate.validate_metadata(obj.get("metadata") or {})
    spec = obj.get("spec") or {}
    errors += _selectors("spec.selectors", spec.get("selectors") or [], cel)
    configs = spec.get("config") or []
    errors += _limit("spec.config", configs, MAX_CONFIGS)
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
    """``domain/identifier`` as constraints require (the domain is mandatory)."""
    if "/" not in value:
        return [
            fielderrors.invalid(
                path,
                value,
                "a fully qualified name must be a domain and a name separated by a slash",
            )
        ]
    return slice_validate.qualified_name_errors(path, value)


def _limit(path: str, items: list[Any], limit: int) -> list[FieldError]:
    return [fielderrors.too_many(path, len(items), limit)] if len(items) > limit else []


def _dns_label(path: str, value: str) -> list[FieldError]:
    if not value:
        return [fielderrors.required(path)]
    return [fielderrors.invalid(path, value, p) for p in names.dns_label(value)]


def _exact(path: str, request: Mapping[str, Any], cel: CelCompiler | None) -> list[FieldError]:
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
    count = request.get("count")
    if mode not in ALLOCATION_MODES:
        errors.append(fielderrors.not_supported(f"{path}.allocationMode", mode, ALLOCATION_MODES))
    elif mode == "All" and count:
        errors.append(
            fielderrors.invalid(
                f"{path}.count", count, "must not be specified when allocationMode is 'All'"
            )
        )
    elif mode == "ExactCount" and (count is None or count <= 0):
        errors.append(fielderrors.invalid(f"{path}.count", count, "must be greater than zero"))
    tolerations = request.get("tolerations") or []
    errors += _limit(f"{path}.tolerations", tolerations, MAX_TOLERATIONS)
    for i, toleration in enumerate(tolerations):
        errors += _toleration(f"{path}.tolerations[{i}]", toleration)
    return errors


def _selectors(path: str, selectors: list[Any], cel: CelCompiler | None) -> list[FieldError]:
    errors = _limit(path, selectors, MAX_SELECTORS)
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
    errors: list[FieldError] = []
    key = toleration.get("key") or ""
    operator = toleration.get("operator") or "Equal"
    value = toleration.get("value") or ""
    if key:
        errors += [fielderrors.invalid(f"{path}.key", key, p) for p in names.label_key(key)]
    elif operator != "Exists":
        errors.append(
            fielderrors.invalid(
                f"{path}.operator", operator, "value must be Exists when `key` is empty"
            )
        )
    if operator not in TOLERATION_OPERATORS:
        errors.append(fielderrors.not_supported(f"{path}.operator", operator, TOLERATION_OPERATORS))
    elif operator == "Exists" and value:
        errors.append(
            fielderrors.invalid(
                f"{path}.value", value, "value must be empty when `operator` is 'Exists'"
            )
        )
    else:
        errors += [fielderrors.invalid(f"{path}.value", value, p) for p in names.label_value(value)]
    effect = toleration.get("effect") or ""
    if effect and effect not in slice_validate.TAINT_EFFECTS:
        errors.append(
            fielderrors.not_supported(f"{path}.effect", effect, slice_validate.TAINT_EFFECTS)
        )
    if toleration.get("tolerationSeconds") is not None and effect != "NoExecute":
        errors.append(
            fielderrors.invalid(
                f"{path}.tolerationSeconds",
                toleration["tolerationSeconds"],
                "only allowed when effect is NoExecute",
            )
        )
    return errors


def _request_refs(path: str, refs: list[str], known: Mapping[str, set[str]]) -> list[FieldError]:
    errors: list[FieldError] = []
    for i, ref in enumerate(refs):
        request, sep, sub = ref.partition("/")
        ok = request in known and (not sep or sub in known[request])
        if not ok:
            errors.append(fielderrors.invalid(f"{path}[{i}]", ref, _REQUEST_REF_MSG))
    return errors


def _opaque(path: str, opaque: Mapping[str, Any] | None) -> list[FieldError]:
    if opaque is None:
        return [fielderrors.required(path)]
    errors = slice_validate.driver_name_errors(f"{path}.driver", opaque.get("driver") or "")
    params = opaque.get("parameters")
    if params is None:
        errors.append(fielderrors.required(f"{path}.parameters"))
    elif not isinstance(params, dict):
        errors.append(
            fielderrors.invalid(
                f"{path}.parameters", "<value omitted>", "must be a valid JSON object"
            )
        )
    elif len(json.dumps(params, separators=(",", ":")).encode()) > MAX_OPAQUE_BYTES:
        errors.append(fielderrors.too_long(f"{path}.parameters", MAX_OPAQUE_BYTES))
    return errors
