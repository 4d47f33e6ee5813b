"""The ``requestPolicy`` of a consumable capacity, checked the way the API server does.

Why it exists: a device with ``allowMultipleAllocations`` publishes how claims may consume each
capacity (a default, and ``validValues`` or a ``validRange`` with a step). The server rejects a
slice whose policy contradicts itself or the capacity's value, and the scheduler rounds requests
by it, so the rules sit next to each other here: :func:`errors` for validation (wording and
paths as in the server's messages), used by :mod:`dra_driver.slices.devicerules`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dra_driver.apimachinery import fielderrors, quantity
from dra_driver.apimachinery.fielderrors import FieldError

MAX_VALID_VALUES = 10
_BINARY = ((60, "Ei"), (50, "Pi"), (40, "Ti"), (30, "Gi"), (20, "Mi"), (10, "Ki"))
_DECIMAL = (
    (18, "E"),
    (15, "P"),
    (12, "T"),
    (9, "G"),
    (6, "M"),
    (3, "k"),
    (0, ""),
    (-3, "m"),
    (-6, "u"),
    (-9, "n"),
)


def errors(path: str, value: Any, policy: Mapping[str, Any], dev: str | None) -> list[FieldError]:
    """A consumable capacity's ``requestPolicy`` against its ``value`` (the server's rules)."""
    valid_values = policy.get("validValues") or []
    valid_range = policy.get("validRange")
    if valid_values and valid_range is not None:
        return [
            fielderrors.forbidden(
                path,
                'exactly one policy can be specified, cannot specify "validValues" and '
                '"validRange" at the same time',
                device=dev,
            )
        ]
    if len(valid_values) > MAX_VALID_VALUES:
        return [
            fielderrors.too_many(
                f"{path}.validValues", len(valid_values), MAX_VALID_VALUES, device=dev
            )
        ]
    if not valid_values and valid_range is None:
        return []
    which = "validValues" if valid_values else "validRange"
    if policy.get("default") is None:
        return [
            fielderrors.required(f"{path}.default", f"required when {which} is defined", device=dev)
        ]
    total, default = _q(value), _q(policy["default"])
    if total is None or default is None:
        return []  # a quantity that does not parse is a decode error (schema), reported there
    if valid_values:
        return _valid_values(f"{path}.validValues", total, default, valid_values, dev)
    return _valid_range(f"{path}.validRange", total, default, valid_range or {}, dev)


def shown(value: quantity.Quantity) -> str:
    """A quantity as the API server prints it in messages (Go's canonical form): ``1000Gi``,
    ``5``, ``2k``, ``500m``, ``-2Gi``; binary suffixes only for whole values of at least 1Ki,
    else the largest decimal suffix that leaves a whole number."""
    if value.sign() == 0:
        return "0"
    sign = "-" if value.sign() < 0 else ""
    nanos = abs(value.nanos)
    whole, rest = divmod(nanos, quantity.NANO_PER_UNIT)
    if value.format is quantity.Format.BINARY_SI and not rest and whole >= 1024:
        for shift, suffix in _BINARY:
            if whole % (1 << shift) == 0:
                return f"{sign}{whole >> shift}{suffix}"
    # the largest suffix leaving a whole number (nano, the last, always does)
    exponent, suffix = next((e, s) for e, s in _DECIMAL if nanos % 10 ** (e + 9) == 0)
    if value.format is quantity.Format.DECIMAL_EXPONENT:
        suffix = f"e{exponent}" if exponent else ""
    return f"{sign}{nanos // 10 ** (exponent + 9)}{suffix}"


def _q(text: Any) -> quantity.Quantity | None:
    try:
        return quantity.parse_quantity(str(text))
    except quantity.QuantityError:
        return None


def _valid_values(
    path: str, total: quantity.Quantity, default: quantity.Quantity, raw: list[Any], dev: str | None
) -> list[FieldError]:
    errors: list[FieldError] = []
    values = [_q(v) for v in raw]
    known = [v for v in values if v is not None]
    for i in range(1, len(values)):
        a, b = values[i - 1], values[i]
        if a is not None and b is not None and a.compare(b) > 0:
            errors.append(
                fielderrors.invalid(
                    f"{path}[{i}]",
                    str(raw[i]),
                    "values must be sorted in ascending order",
                    device=dev,
                )
            )
    seen: set[int] = set()
    for i, option in enumerate(values):
        if option is None:
            continue
        if option.compare(total) > 0:
            errors.append(
                fielderrors.invalid(
                    f"{path}[{i}]",
                    str(raw[i]),
                    f"option is larger than capacity value: {shown(total)}",
                    device=dev,
                )
            )
        if option.nanos in seen:
            errors.append(fielderrors.duplicate(f"{path}[{i}]", str(raw[i]), device=dev))
        seen.add(option.nanos)
    if not any(v == default for v in known):
        errors.append(
            fielderrors.invalid(
                path,
                shown(default),
                "default value is not valid according to the requestPolicy",
                device=dev,
            )
        )
    return errors


def _valid_range(
    path: str,
    total: quantity.Quantity,
    default: quantity.Quantity,
    raw: Mapping[str, Any],
    dev: str | None,
) -> list[FieldError]:
    if raw.get("min") is None:
        return [
            fielderrors.required(f"{path}.min", "required when validRange is defined", device=dev)
        ]
    low, high, step = _q(raw["min"]), _q(raw.get("max")), _q(raw.get("step"))
    if low is None:
        return []
    errors: list[FieldError] = []
    if low.compare(total) > 0:
        errors.append(
            fielderrors.invalid(
                f"{path}.min",
                shown(low),
                f"min is larger than capacity value: {shown(total)}",
                device=dev,
            )
        )
    if default.compare(low) < 0:
        errors.append(
            fielderrors.invalid(
                f"{path}.min", shown(default), f"default is less than min: {shown(low)}", device=dev
            )
        )
    if high is not None:
        if low.compare(high) > 0:
            errors.append(
                fielderrors.invalid(
                    f"{path}.max", shown(low), f"min is larger than max: {shown(high)}", device=dev
                )
            )
        if high.compare(total) > 0:
            errors.append(
                fielderrors.invalid(
                    f"{path}.max",
                    shown(high),
                    f"max is larger than capacity value: {shown(total)}",
                    device=dev,
                )
            )
        if default.compare(high) > 0:
            errors.append(
                fielderrors.invalid(
                    f"{path}.max",
                    shown(default),
                    f"default is more than max: {shown(high)}",
                    device=dev,
                )
            )
    if step is not None:
        if step.sign() <= 0:
            return [
                *errors,
                fielderrors.invalid(f"{path}.step", shown(step), "must be positive", device=dev),
            ]
        if low.add(step).compare(total) > 0:
            errors.append(
                fielderrors.invalid(
                    f"{path}.step",
                    shown(step),
                    f"one step {shown(low.add(step))} is larger than capacity value: "
                    f"{shown(total)}",
                    device=dev,
                )
            )
        for what in (default, high):
            if what is not None and (what.nanos - low.nanos) % step.nanos:
                errors.append(
                    fielderrors.invalid(
                        f"{path}.step",
                        shown(what),
                        f"value is not a multiple of a given step ({shown(step)}) from "
                        f"({shown(low)})",
                        device=dev,
                    )
                )
    return errors
