"""The exact text of every request-policy error (consumable capacity, KEP-5075): the server's
wording, quantities rendered as the server renders them, the path under the capacity, and the
device hint (the rest of the slice rules: test_validate_messages)."""

from __future__ import annotations

import pytest

from .conftest import Obj, slice_with
from .test_validate_messages import G0, dev, lines

RP = "spec.devices[0].capacity[m].requestPolicy"


def policy_lines(policy: Obj, value: str = "10") -> list[str]:
    device = dev(
        capacity={"m": {"value": value, "requestPolicy": policy}}, allowMultipleAllocations=True
    )
    got = lines(slice_with([device]))
    assert all(line.startswith(RP) and line.endswith(f" {G0}") for line in got), got
    return [line.removeprefix(RP).removesuffix(f" {G0}") for line in got]


POLICY_CASES: list[tuple[str, Obj, str, list[str]]] = [
    (
        "both kinds",
        {"default": "1", "validValues": ["1"], "validRange": {"min": "1"}},
        "10",
        [
            ': Forbidden: exactly one policy can be specified, cannot specify "validValues" and '
            '"validRange" at the same time'
        ],
    ),
    (
        "too many values",
        {"default": "1", "validValues": [str(i) for i in range(1, 12)]},
        "20",
        [".validValues: Too many: 11: must have at most 10 items"],
    ),
    ("ten values", {"default": "1", "validValues": [str(i) for i in range(1, 11)]}, "20", []),
    (
        "no default, values",
        {"validValues": ["1"]},
        "10",
        [".default: Required value: required when validValues is defined"],
    ),
    (
        "no default, range",
        {"validRange": {"min": "1"}},
        "10",
        [".default: Required value: required when validRange is defined"],
    ),
    ("neither", {"default": "1"}, "10", []),
    (
        "values: order, duplicate, above capacity, default",
        {"default": "3", "validValues": ["2Gi", "1Gi", "1Gi", "20Gi"]},
        "10Gi",
        [
            '.validValues[1]: Invalid value: "1Gi": values must be sorted in ascending order',
            '.validValues[2]: Duplicate value: "1Gi"',
            '.validValues[3]: Invalid value: "20Gi": option is larger than capacity value: 10Gi',
            '.validValues: Invalid value: "3": default value is not valid according to the '
            "requestPolicy",
        ],
    ),
    (
        "values spelled differently are equal",
        {"default": "1024Mi", "validValues": ["1Gi", "2048Mi", "10Gi"]},
        "10Gi",
        [],
    ),
    (
        "a value equal to the capacity",
        {"default": "10", "validValues": ["10"]},
        "10",
        [],
    ),
    (
        "range without min",
        {"default": "1", "validRange": {"max": "2"}},
        "10",
        [".validRange.min: Required value: required when validRange is defined"],
    ),
    (
        "min above capacity and max, default above max",
        {"default": "12Gi", "validRange": {"min": "11Gi", "max": "2Gi"}},
        "10Gi",
        [
            '.validRange.min: Invalid value: "11Gi": min is larger than capacity value: 10Gi',
            '.validRange.max: Invalid value: "11Gi": min is larger than max: 2Gi',
            '.validRange.max: Invalid value: "12Gi": default is more than max: 2Gi',
        ],
    ),
    (
        "default below min",
        {"default": "1", "validRange": {"min": "2"}},
        "10",
        ['.validRange.min: Invalid value: "1": default is less than min: 2'],
    ),
    (
        "max above capacity",
        {"default": "12k", "validRange": {"min": "1k", "max": "11k"}},
        "10k",
        [
            '.validRange.max: Invalid value: "11k": max is larger than capacity value: 10k',
            '.validRange.max: Invalid value: "12k": default is more than max: 11k',
        ],
    ),
    (
        "everything at the capacity",
        {"default": "10", "validRange": {"min": "10", "max": "10"}},
        "10",
        [],
    ),
    (
        "a negative step",
        {"default": "2", "validRange": {"min": "1", "max": "9", "step": "-1"}},
        "10",
        ['.validRange.step: Invalid value: "-1": must be positive'],
    ),
    (
        "a zero step, after the other errors",
        {"default": "20", "validRange": {"min": "1", "step": "0"}},
        "10",
        ['.validRange.step: Invalid value: "0": must be positive'],
    ),
    (
        "one step above capacity",
        {"default": "1Gi", "validRange": {"min": "1Gi", "max": "4Gi", "step": "3Gi"}},
        "3Gi",
        [
            '.validRange.max: Invalid value: "4Gi": max is larger than capacity value: 3Gi',
            '.validRange.step: Invalid value: "3Gi": one step 4Gi is larger than capacity '
            "value: 3Gi",
        ],
    ),
    (
        "one step to exactly the capacity",
        {"default": "1Gi", "validRange": {"min": "1Gi", "step": "2Gi"}},
        "3Gi",
        [],
    ),
    (
        "default and max not whole steps from min",
        {"default": "2M", "validRange": {"min": "1M", "max": "6M", "step": "2M"}},
        "10M",
        [
            '.validRange.step: Invalid value: "2M": value is not a multiple of a given step (2M) '
            "from (1M)",
            '.validRange.step: Invalid value: "6M": value is not a multiple of a given step (2M) '
            "from (1M)",
        ],
    ),
    (
        "whole steps from a min that is not zero",
        {"default": "3", "validRange": {"min": "1", "max": "9", "step": "2"}},
        "10",
        [],
    ),
]


@pytest.mark.parametrize(
    ("policy", "value", "expected"),
    [c[1:] for c in POLICY_CASES],
    ids=[c[0] for c in POLICY_CASES],
)
def test_request_policy_text(policy: Obj, value: str, expected: list[str]) -> None:
    assert policy_lines(policy, value) == expected


def test_request_policy_errors_name_the_device() -> None:
    device = dev(
        "gpu-7",
        capacity={"m": {"value": "10", "requestPolicy": {"validValues": ["1"]}}},
        allowMultipleAllocations=True,
    )
    assert lines(slice_with([device])) == [
        f"{RP}.default: Required value: required when validValues is defined (device 'gpu-7')"
    ]
