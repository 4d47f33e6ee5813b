"""Server-side apply of a ResourceClaim's ``status.devices``, as the in-memory API emulates it.

Why it exists: drivers report per-device status with ``PATCH .../resourceclaims/<name>/status``
(``application/apply-patch+yaml``, ``fieldManager``, ``force``), and what matters to them is
what the real server guarantees: the entries are validated (``validateDeviceStatus`` of the
resource validation, and the schema of ``AllocatedDeviceStatus``), and the list is a list-map
keyed by (driver, device, pool, shareID) whose entries belong to the manager that applied them.

What is emulated, and only that:

* the applied object: ``apiVersion``/``kind`` must be ``resource.k8s.io/v1`` ResourceClaim,
  ``metadata.name`` must be the URL's, a ``metadata.uid`` that is not the stored claim's is a
  409 (the UID precondition); strict decoding of the whole body (unknown fields, wrong JSON types:
  400); a ``status`` field other than ``devices`` (and any ``spec``) is refused with 400 —
  *not* what the server does (it applies or ignores them), we simply never send them;
* validation (422), path and wording as the server's: driver (``ValidateCSIDriverName``),
  pool (≤253, DNS subdomains split by ``/``), device (DNS label), the entry must name a device
  (and shareID) of ``status.allocation.devices.results``, ≤8 conditions, each a valid
  ``metav1.Condition`` (type a qualified name and unique, status True/False/Unknown, reason
  CamelCase ≤1024, message ≤32768, lastTransitionTime set, observedGeneration ≥ 0), ``data`` a
  JSON object of ≤10 KiB, ``networkData`` limits (interfaceName ≤256, hardwareAddress ≤128,
  ≤16 unique IPs in CIDR form); duplicate keys in one apply: 422;
* ownership at the granularity of a whole entry (the server tracks single fields): an apply by
  manager M sets the entries M lists and removes those M owned before and no longer lists
  (unless another manager also owns them); entries of other managers stay. An entry another
  manager owns with different content is a 409 conflict without ``force``, taken over with it.
  Ownership lives beside the claim (not in ``metadata.managedFields``); entries present with
  no known owner (a test put them) belong to nobody and survive every apply.
"""

from __future__ import annotations

import copy
import ipaddress
import json
import re
from collections.abc import Mapping
from typing import Any

from dra_driver.apimachinery import fielderrors, metarules, names, strictdecode
from dra_driver.apimachinery.fielderrors import FieldError

Key = tuple[str, str, str, str | None]  # (driver, device, pool, shareID)
Owners = dict[Key, set[str]]

MAX_CONDITIONS = 8
MAX_DATA = 10 * 1024
MAX_POOL_NAME = 253
MAX_REASON = 1024
MAX_MESSAGE = 32 * 1024
MAX_IPS = 16
_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
_STATUSES = ("True", "False", "Unknown")


class ApplyError(Exception):
    """The apply is refused: ``status`` (400, 409, 422) and the server's message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def key_of(entry: Mapping[str, Any]) -> Key:
    return (
        str(entry.get("driver") or ""),
        str(entry.get("device") or ""),
        str(entry.get("pool") or ""),
        entry.get("shareID") or None,
    )


def apply(
    claim: Mapping[str, Any],
    patch: Any,
    *,
    manager: str,
    force: bool,
    owners: Owners,
) -> tuple[dict[str, Any], Owners]:
    """The claim after ``manager`` applied ``patch`` to its status, and the new ownership.
    Raises :class:`ApplyError`. ``claim`` and ``owners`` are not modified."""
    name = claim["metadata"]["name"]
    if not manager:
        raise ApplyError(
            400,
            'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required '
            "value: is required for apply patch",
        )
    _check_envelope(claim, patch)
    applied = list(((patch.get("status") or {}).get("devices")) or [])
    errors: list[FieldError] = []
    seen: set[Key] = set()
    for i, entry in enumerate(applied):
        if not isinstance(entry, dict):
            raise ApplyError(400, f"status.devices[{i}]: expected an object")
        k = key_of(entry)
        if k in seen:
            errors.append(fielderrors.duplicate(f"status.devices[{i}]", _render_key(k)))
        seen.add(k)
    _raise(errors, name)

    old_entries = list((claim.get("status") or {}).get("devices") or [])
    by_key = {key_of(e): e for e in old_entries}
    new_owners: Owners = {k: set(v) for k, v in owners.items() if k in by_key}
    conflicts = [
        k
        for e in applied
        if (k := key_of(e)) in by_key and (new_owners.get(k, set()) - {manager}) and by_key[k] != e
    ]
    if conflicts and not force:
        others = sorted({m for k in conflicts for m in new_owners[k] - {manager}})
        raise ApplyError(
            409,
            f"Apply failed with {len(conflicts)} conflict(s): conflict with "
            + ", ".join(f'"{m}"' for m in others)
            + ": "
            + ", ".join(f".status.devices[{_render_key(k)}]" for k in conflicts),
        )
    result: list[dict[str, Any]] = []
    applied_by_key = {key_of(e): e for e in applied}
    for entry in old_entries:
        k = key_of(entry)
        owned = new_owners.get(k, set())
        if k in applied_by_key:  # (another owner with other content: a conflict, or forced)
            applied_entry = applied_by_key.pop(k)
            result.append(copy.deepcopy(applied_entry))
            new_owners[k] = (owned | {manager}) if entry == applied_entry else {manager}
        elif manager in owned and not owned - {manager}:
            new_owners.pop(k, None)  # only ours, no longer applied: removed
        else:
            new_owners[k] = owned - {manager}
            result.append(copy.deepcopy(entry))
            if not new_owners[k]:
                new_owners.pop(k)
    for k, entry in applied_by_key.items():
        result.append(copy.deepcopy(entry))
        new_owners[k] = {manager}

    _raise(validate(result, claim), name)
    new = copy.deepcopy(dict(claim))
    status = new.setdefault("status", {})
    if result:
        status["devices"] = result
    else:
        status.pop("devices", None)
    return new, new_owners


def validate(entries: list[dict[str, Any]], claim: Mapping[str, Any]) -> list[FieldError]:
    """The server's ``validateDeviceStatus`` for each entry of ``status.devices``."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    allocated = {key_of(r) for r in (allocation.get("devices") or {}).get("results") or ()}
    errors: list[FieldError] = []
    for i, entry in enumerate(entries):
        path = f"status.devices[{i}]"
        errors += metarules.driver_name(f"{path}.driver", entry.get("driver") or "")
        errors += _pool(f"{path}.pool", entry.get("pool") or "")
        device = entry.get("device") or ""
        if not device:
            errors.append(fielderrors.required(f"{path}.device"))
        else:
            errors += metarules.each(f"{path}.device", device, names.dns_label(device))
        k = key_of(entry)
        if k not in allocated:
            errors.append(
                fielderrors.invalid(
                    path, _render_key(k), "must be an allocated device in the claim"
                )
            )
        errors += _conditions(f"{path}.conditions", entry.get("conditions") or [])
        if "data" in entry and entry["data"] is not None:
            errors += _data(f"{path}.data", entry["data"])
        errors += _network(f"{path}.networkData", entry.get("networkData") or {})
    return errors


def _check_envelope(claim: Mapping[str, Any], patch: Any) -> None:
    if not isinstance(patch, dict):
        raise ApplyError(400, "the apply patch must be an object")
    if patch.get("apiVersion") != "resource.k8s.io/v1" or patch.get("kind") != "ResourceClaim":
        raise ApplyError(
            400, "apiVersion and kind must be resource.k8s.io/v1 ResourceClaim in an apply patch"
        )
    decode = strictdecode.decode_errors("ResourceClaim", patch)
    if decode:
        raise ApplyError(400, fielderrors.summary(decode))
    meta = patch.get("metadata") or {}
    name = claim["metadata"]["name"]
    if meta.get("name") != name:
        raise ApplyError(
            400, "metadata.name: Invalid value: the name of the object does not match the URL"
        )
    uid = meta.get("uid")
    if uid and uid != claim["metadata"].get("uid"):
        raise ApplyError(
            409,
            f'Operation cannot be fulfilled on resourceclaims.resource.k8s.io "{name}": '
            f"Precondition failed: UID in precondition: {uid}, UID in object meta: "
            f"{claim['metadata'].get('uid')}",
        )
    extra = set(patch) - {"apiVersion", "kind", "metadata", "status"}
    extra |= {f"status.{f}" for f in (patch.get("status") or {}) if f != "devices"}
    if extra:
        raise ApplyError(
            400, f"the fake API server applies status.devices only, not {', '.join(sorted(extra))}"
        )


def _pool(path: str, pool: str) -> list[FieldError]:
    if not pool:
        return [fielderrors.required(path)]
    errors: list[FieldError] = []
    if len(pool) > MAX_POOL_NAME:
        errors.append(fielderrors.too_long(path, MAX_POOL_NAME))
    for part in pool.split("/"):
        errors += metarules.each(path, part, names.dns_subdomain(part))
    return errors


def _conditions(path: str, conditions: list[dict[str, Any]]) -> list[FieldError]:
    errors: list[FieldError] = []
    if len(conditions) > MAX_CONDITIONS:
        errors.append(fielderrors.too_many(path, len(conditions), MAX_CONDITIONS))
    types: set[str] = set()
    for i, cond in enumerate(conditions):
        p = f"{path}[{i}]"
        typ = cond.get("type") or ""
        errors += metarules.label_name(f"{p}.type", typ)  # ValidateLabelName: qualified name
        if typ in types:
            errors.append(fielderrors.duplicate(f"{p}.type", typ))
        types.add(typ)
        status = cond.get("status") or ""
        if status not in _STATUSES:
            errors.append(fielderrors.not_supported(f"{p}.status", status, list(_STATUSES)))
        if int(cond.get("observedGeneration") or 0) < 0:
            errors.append(
                fielderrors.invalid(
                    f"{p}.observedGeneration",
                    cond["observedGeneration"],
                    "must be greater than or equal to zero",
                )
            )
        if not cond.get("lastTransitionTime"):
            errors.append(fielderrors.required(f"{p}.lastTransitionTime", "must be set"))
        reason = cond.get("reason") or ""
        if not reason:
            errors.append(fielderrors.required(f"{p}.reason", "must be set"))
        else:
            if len(reason) > MAX_REASON:
                errors.append(fielderrors.too_long(f"{p}.reason", MAX_REASON))
            if not _REASON.match(reason):
                errors.append(
                    fielderrors.invalid(
                        f"{p}.reason",
                        reason,
                        "a condition reason must start with alphabetic character, optionally "
                        "followed by a string of alphanumeric characters or '_,:', and must end "
                        "with an alphanumeric character or '_' (regex used for validation is "
                        f"'{_REASON.pattern[1:-1]}')",
                    )
                )
        if len(cond.get("message") or "") > MAX_MESSAGE:
            errors.append(fielderrors.too_long(f"{p}.message", MAX_MESSAGE))
    return errors


def _data(path: str, data: Any) -> list[FieldError]:
    raw = json.dumps(data, separators=(",", ":"))
    if len(raw.encode()) > MAX_DATA:
        return [fielderrors.too_long(path, MAX_DATA)]
    if not isinstance(data, dict):
        return [
            fielderrors.invalid(path, "<value omitted>", "parameters must be a valid JSON object")
        ]
    return []


def _network(path: str, net: Mapping[str, Any]) -> list[FieldError]:
    errors: list[FieldError] = []
    if len(net.get("interfaceName") or "") > 256:
        errors.append(fielderrors.too_long(f"{path}.interfaceName", 256))
    if len(net.get("hardwareAddress") or "") > 128:
        errors.append(fielderrors.too_long(f"{path}.hardwareAddress", 128))
    ips = list(net.get("ips") or [])
    if len(ips) > MAX_IPS:
        errors.append(fielderrors.too_many(f"{path}.ips", len(ips), MAX_IPS))
    seen: set[str] = set()
    for i, ip in enumerate(ips):
        try:
            ipaddress.ip_interface(ip)
            ok = "/" in ip
        except ValueError:
            ok = False
        if not ok:
            errors.append(
                fielderrors.invalid(f"{path}.ips[{i}]", ip, "must be an IP address in CIDR form")
            )
        if ip in seen:
            errors.append(fielderrors.duplicate(f"{path}.ips[{i}]", ip))
        seen.add(ip)
    return errors


def _render_key(k: Key) -> str:
    driver, device, pool, share = k
    return f"{driver}/{pool}/{device}" + (f" (shareID {share})" if share else "")


def _raise(errors: list[FieldError], name: str) -> None:
    if errors:
        status, message = fielderrors.status_message("ResourceClaim", name, errors)
        raise ApplyError(status, message)
