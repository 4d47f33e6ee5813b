"""The names of device attributes and capacities: ``identifier`` or ``domain/identifier``.

Why it exists: the same name rule is applied by the ResourceSlice validator (the keys of every
device's ``attributes`` and ``capacity`` maps, :mod:`.devicerules`) and by the in-memory API's
claim admission (``matchAttribute`` / ``distinctAttribute`` of a claim's constraints, which must
be fully qualified), and its limits decide how a too-long key is shown in a field path. Each
check mirrors a function of the Kubernetes v1.36 ``pkg/apis/resource/validation``
(``validateQualifiedName``, ``validateFullyQualifiedName``, ``validateCIdentifier``), named in
its docstring: same checks, same order, same field paths and wording.
"""

from __future__ import annotations

from dra_driver.apimachinery import fielderrors, metarules, names
from dra_driver.apimachinery.fielderrors import FieldError

MAX_ID_LEN = 32  # DeviceMaxIDLength
MAX_DOMAIN_LEN = 63  # DeviceMaxDomainLength
MAX_KEY_LEN = MAX_DOMAIN_LEN + 1 + MAX_ID_LEN  # attributeAndCapacityMaxKeyLength


def qualified_name_errors(path: str, key: str, *, device: str | None = None) -> list[FieldError]:
    """``validateQualifiedName``: an attribute or capacity name, ``identifier`` or
    ``domain/identifier``; errors are reported on the map itself (``...attributes``).

    Like the v1.36 server, a name with more than one ``/`` is not checked at all (upstream
    marks this as a known gap to be closed with ratcheting), so it is accepted.
    """
    parts = key.split("/")
    if len(parts) == 1:
        return _c_identifier(path, parts[0], device)
    if len(parts) != 2:
        return []
    domain, ident = parts
    errors: list[FieldError] = []
    if not domain:
        errors.append(fielderrors.invalid(path, "", "the domain must not be empty", device=device))
    else:
        errors += metarules.driver_name(path, domain, device=device)
    if not ident:
        errors.append(fielderrors.invalid(path, "", "the name must not be empty", device=device))
    else:
        errors += _c_identifier(path, ident, device)
    return errors


def fully_qualified_name_errors(path: str, value: str) -> list[FieldError]:
    """``validateFullyQualifiedName``: a qualified name that really has a domain."""
    errors = qualified_name_errors(path, value)
    if "/" not in value:
        errors.append(
            fielderrors.invalid(
                path,
                value,
                "a fully qualified name must be a domain and a name separated by a slash",
            )
        )
    return errors


def _c_identifier(path: str, ident: str, device: str | None) -> list[FieldError]:
    """``validateCIdentifier``: at most 32 characters and a C identifier (both reported)."""
    errors: list[FieldError] = []
    if len(ident) > MAX_ID_LEN:
        errors.append(fielderrors.too_long(path, MAX_ID_LEN, device=device))
    errors += [
        fielderrors.invalid(path, ident, p, device=device) for p in names.c_identifier(ident)
    ]
    return errors


def map_key_path(path: str, key: str) -> str:
    """``fldPath.Key(truncateIfTooLong(key, 96))``: keys longer than a valid one are shown
    shortened in the middle."""
    if len(key) > MAX_KEY_LEN:
        remaining = MAX_KEY_LEN - 3
        key = key[: (remaining + 1) // 2] + "..." + key[len(key) - remaining // 2 :]
    return f"{path}[{key}]"
