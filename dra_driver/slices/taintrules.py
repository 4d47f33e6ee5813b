"""Validation rules for the taints of a ResourceSlice device, and when an update skips them.

Why it exists: device taints have rules of their own (a label-name key, a label-value value, one
of three effects, at most 16, repeats allowed) and one exception the other device fields lack:
a device whose taints did not change keeps them unchecked on update, which needs
``apiequality.Semantic``'s idea of equal taints, times compared as instants. The slice rules
(:mod:`.devicerules`) apply them to each device; the in-memory API's admission and the taint
builder (:mod:`.taints`) share the effects and the limit. Each check mirrors the Kubernetes
v1.36 ``pkg/apis/resource/validation`` function named in its docstring (``validateDeviceTaint``,
``validateDevice``'s taint test).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dra_driver.apimachinery import fielderrors, metarules, rfc3339
from dra_driver.apimachinery.fielderrors import FieldError

MAX_TAINTS = 16  # DeviceTaintsMaxLength
TAINT_EFFECTS = ("NoExecute", "NoSchedule", "None")


def same_taints(old: list[Any], new: list[Any]) -> bool:
    """``apiequality.Semantic.DeepEqual(oldDevice.Taints, device.Taints)``, the test
    ``validateDevice`` uses to skip the taints of an updated device: a nil and an empty list
    are equal, an unset key, value or effect is ``""``, and ``timeAdded`` values are equal when
    they name the same instant (``metav1.Time``: ``a.UTC() == b.UTC()``, nanoseconds kept),
    however they are spelled; an unset ``timeAdded`` equals only an unset one."""
    return len(old) == len(new) and all(
        _taint_fields(a) == _taint_fields(b) for a, b in zip(old, new, strict=True)
    )


def _taint_fields(taint: Any) -> tuple[str, str, str, int | str | None]:
    taint = taint if isinstance(taint, Mapping) else {}
    added = taint.get("timeAdded")
    instant = None if added is None else rfc3339.time_instant(added)
    return (
        taint.get("key") or "",
        taint.get("value") or "",
        taint.get("effect") or "",
        added if added is not None and instant is None else instant,
    )


def taint_list_errors(path: str, taints: list[Any], dev: str | None) -> list[FieldError]:
    """``validateSlice(taints, 16, validateDeviceTaint)``: too many short-circuits. Unlike pod
    and node taints, device taints may repeat a key and effect (a slice, not a set)."""
    if len(taints) > MAX_TAINTS:
        return [fielderrors.too_many(path, len(taints), MAX_TAINTS, device=dev)]
    errors: list[FieldError] = []
    for i, taint in enumerate(taints):
        errors += taint_errors(f"{path}[{i}]", taint, dev)
    return errors


def taint_errors(path: str, taint: Mapping[str, Any], dev: str | None = None) -> list[FieldError]:
    """``validateDeviceTaint(taint, nil, ...)``: the key is a label name
    (``metav1validation.ValidateLabelName``: an empty key fails that check twice, there is no
    separate "required"), a non-empty value is a label value (``IsValidLabelValue``), the
    effect is required and one of ``validDeviceTaintEffects`` (``None``, ``NoSchedule``,
    ``NoExecute``; no ``PreferNoSchedule``). ``timeAdded`` is not validated: any time that
    decodes is accepted (see :func:`dra_driver.apimachinery.rfc3339.time_instant`). A slice
    passes no old taint, so the effect is checked on create and update alike (only a
    DeviceTaintRule update skips an unchanged effect); gates play no part here."""
    errors = metarules.label_name(f"{path}.key", taint.get("key") or "", device=dev)
    value = taint.get("value") or ""
    if value:
        errors += metarules.label_value(f"{path}.value", value, device=dev)
    effect = taint.get("effect") or ""
    if not effect:
        errors.append(fielderrors.required(f"{path}.effect", device=dev))
    elif effect not in TAINT_EFFECTS:
        errors.append(
            fielderrors.not_supported(f"{path}.effect", effect, TAINT_EFFECTS, device=dev)
        )
    return errors
