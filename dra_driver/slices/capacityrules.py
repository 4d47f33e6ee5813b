"""Validation of a device capacity and its consumable ``requestPolicy``.

Why it exists: a capacity of a device that can be allocated several times
(``allowMultipleAllocations``) may say which amounts a claim may consume; the API server checks
that policy, and a slice we publish with a bad one would be refused. Each check mirrors the
Kubernetes v1.36 ``pkg/apis/resource/validation`` function named beside it
(``validateSingleAllocatableDeviceCapacity``, ``validateRequestPolicy``, ...).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dra_driver.apimachinery import fielderrors, quantity
from dra_driver.apimachinery.fielderrors import FieldError

MAX_VALID_VALUES = 10  # CapacityRequestPolicyDiscreteMaxOptions


def capacity_errors(
    path: str, cap: Mapping[str, Any], *, multi: bool, device: str | None
) -> list[FieldError]:
    """``validateSingleAllocatableDeviceCapacity`` / ``validateMultiAllocatableDeviceCapacity``.
    The value itself needs no check: any quantity that decoded is valid."""
    policy = cap.get("requestPolicy")
    if policy is None:
        return []
    if not multi:
        return [
            fielderrors.forbidden(
                f"{path}.requestPolicy", "allowMultipleAllocations must be true", device=device
            )
        ]
    return _request_policy(f"{path}.requestPolicy", _q(cap.get("value")), policy, device)


def _q(value: Any) -> quantity.Quantity:
    return quantity.parse_quantity(str(value)) if value not in (None, "") else quantity.Quantity(0)


def _request_policy(
    path: str, cap: quantity.Quantity, policy: Mapping[str, Any], dev: str | None
) -> list[FieldError]:
    """``validateRequestPolicy`` and ``validateValidRequestValues``."""
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
    default = policy.get("default")
    if valid_values:
        if default is None:
            return [
                fielderrors.required(
                    f"{path}.default", "required when validValues is defined", device=dev
                )
            ]
        return _valid_values(f"{path}.validValues", _q(default), cap, valid_values, dev)
    if valid_range is not None:
        if default is None:
            return [
                fielderrors.required(
                    f"{path}.default", "required when validRange is defined", device=dev
                )
            ]
        return _valid_range(f"{path}.validRange", _q(default), cap, valid_range, dev)
    return []


def _valid_values(
    path: str, default: quantity.Quantity, cap: quantity.Quantity, raw: list[Any], dev: str | None
) -> list[FieldError]:
    """``validateRequestPolicyValidValues``: ascending, at most 10, none above the capacity,
    no duplicates, the default among them."""
    values = [_q(v) for v in raw]
    errors: list[FieldError] = []
    for i in range(len(values) - 1):
        if values[i].compare(values[i + 1]) > 0:
            errors.append(
                fielderrors.invalid(
                    f"{path}[{i + 1}]",
                    str(values[i + 1]),
                    "values must be sorted in ascending order",
                    device=dev,
                )
            )
    if len(values) > MAX_VALID_VALUES:
        errors.append(fielderrors.too_many(path, len(values), MAX_VALID_VALUES, device=dev))
    else:
        seen: set[int] = set()
        for i, option in enumerate(values):
            if option.compare(cap) > 0:
                errors.append(
                    fielderrors.invalid(
                        f"{path}[{i}]",
                        str(option),
                        f"option is larger than capacity value: {cap}",
                        device=dev,
                    )
                )
            if option.nanos in seen:
                errors.append(fielderrors.duplicate(f"{path}[{i}]", str(option), device=dev))
            seen.add(option.nanos)
    if default not in values:
        errors.append(
            fielderrors.invalid(
                path,
                str(default),
                "default value is not valid according to the requestPolicy",
                device=dev,
            )
        )
    return errors


def _valid_range(
    path: str,
    default: quantity.Quantity,
    cap: quantity.Quantity,
    rng: Mapping[str, Any],
    dev: str | None,
) -> list[FieldError]:
    """``validateRequestPolicyRange``: min required and within the capacity, default within
    [min, max], max within the capacity, default and max whole steps above min."""
    if rng.get("min") is None:
        return [
            fielderrors.required(f"{path}.min", "required when validRange is defined", device=dev)
        ]
    low = _q(rng["min"])
    errors: list[FieldError] = []
    if low.compare(cap) > 0:
        errors.append(
            fielderrors.invalid(
                f"{path}.min", str(low), f"min is larger than capacity value: {cap}", device=dev
            )
        )
    if default.compare(low) < 0:
        errors.append(
            fielderrors.invalid(
                f"{path}.min", str(default), f"default is less than min: {low}", device=dev
            )
        )
    high = _q(rng["max"]) if rng.get("max") is not None else None
    if high is not None:
        if low.compare(high) > 0:
            errors.append(
                fielderrors.invalid(
                    f"{path}.max", str(low), f"min is larger than max: {high}", device=dev
                )
            )
        if high.compare(cap) > 0:
            errors.append(
                fielderrors.invalid(
                    f"{path}.max",
                    str(high),
                    f"max is larger than capacity value: {cap}",
                    device=dev,
                )
            )
        if default.compare(high) > 0:
            errors.append(
                fielderrors.invalid(
                    f"{path}.max", str(default), f"default is more than max: {high}", device=dev
                )
            )
    if rng.get("step") is not None:
        step = _q(rng["step"])
        one_step = low.add(step)
        if one_step.compare(cap) > 0:
            errors.append(
                fielderrors.invalid(
                    f"{path}.step",
                    str(step),
                    f"one step {one_step} is larger than capacity value: {cap}",
                    device=dev,
                )
            )
        for value in (default, high):
            if value is not None and step.nanos and (value.nanos - low.nanos) % step.nanos:
                errors.append(
                    fielderrors.invalid(
                        f"{path}.step",
                        str(value),
                        f"value is not a multiple of a given step ({step}) from ({low})",
                        device=dev,
                    )
                )
    return errors
