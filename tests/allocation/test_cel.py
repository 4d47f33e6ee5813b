"""DRA CEL selectors: evaluation rules, the quantity/semver libraries, and agreement with the
compile verdicts a real kube-apiserver gave on our DeviceClasses and ResourceClaims."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import refdata

from dra_driver.allocation import cel

DRIVER = "gpu.nvidia.com"

H100: dict[str, Any] = {
    "name": "gpu-0",
    "attributes": {
        "type": {"string": "gpu"},
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "driverVersion": {"version": "580.95.5"},
        "index": {"int": 0},
        "resource.kubernetes.io/numaNode": {"int": 0},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
        "mig": {"bool": False},
    },
    "capacity": {"memory": {"value": "80Gi"}, "example.com/slots": {"value": "1024Mi"}},
}
L4: dict[str, Any] = {
    "name": "gpu-1",
    "attributes": {
        "type": {"string": "gpu"},
        "productName": {"string": "NVIDIA L4"},
        "driverVersion": {"version": "535.104.12"},
        "resource.kubernetes.io/numaNode": {"int": 1},
    },
    "capacity": {"memory": {"value": "23034Mi"}},
}
BARE: dict[str, Any] = {"name": "gpu-9"}


def matches(expression: str, device: Mapping[str, Any] = H100, driver: str = DRIVER) -> bool:
    return cel.compile_selector(expression).matches(device, driver)


# --- selectors a GPU user writes -------------------------------------------------------------


@pytest.mark.parametrize(("device", "expected"), [(H100, True), (L4, False)])
def test_product_name_equality(device: dict[str, Any], expected: bool) -> None:
    expr = 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3"'
    assert matches(expr, device) is expected


@pytest.mark.parametrize(("device", "expected"), [(H100, True), (L4, False)])
def test_memory_at_least_40gi(device: dict[str, Any], expected: bool) -> None:
    expr = 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0'
    assert matches(expr, device) is expected


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        (
            'device.attributes["gpu.nvidia.com"].driverVersion.isGreaterThan(semver("550.0.0"))',
            True,
        ),
        ('device.attributes["gpu.nvidia.com"].driverVersion.isLessThan(semver("550.0.0"))', False),
        (
            'device.attributes["gpu.nvidia.com"].driverVersion.compareTo(semver("580.95.5")) == 0',
            True,
        ),
        ('device.attributes["gpu.nvidia.com"].driverVersion == semver("580.95.5")', True),
        ('device.attributes["gpu.nvidia.com"].driverVersion.major() == 580', True),
        ('device.attributes["gpu.nvidia.com"].driverVersion.minor() == 95', True),
        ('device.attributes["gpu.nvidia.com"].driverVersion.patch() == 5', True),
        # 580.95.5 > 580.9.50: numeric, not string, ordering.
        (
            'device.attributes["gpu.nvidia.com"].driverVersion.isGreaterThan(semver("580.9.50"))',
            True,
        ),
    ],
)
def test_driver_version_is_a_semver(expression: str, expected: bool) -> None:
    assert matches(expression) is expected


def test_quantities_of_different_spellings_are_equal() -> None:
    assert matches('device.capacity["example.com"].slots.compareTo(quantity("1Gi")) == 0')
    assert matches('device.capacity["example.com"].slots == quantity("1Gi")')
    assert matches('device.capacity["gpu.nvidia.com"].memory == quantity("81920Mi")')
    assert not matches('device.capacity["gpu.nvidia.com"].memory == quantity("80G")')


def test_unqualified_names_belong_to_the_slice_driver() -> None:
    assert matches('device.attributes["gpu.nvidia.com"].index == 0')
    assert matches('device.attributes["resource.kubernetes.io"].numaNode == 0')
    other = cel.compile_selector('has(device.attributes["gpu.nvidia.com"].index)')
    assert other.matches(H100, "other.example.com") is False
    assert cel.compile_selector('device.attributes["other.example.com"].index == 0').matches(
        H100, "other.example.com"
    )


def test_driver_bool_int_and_allow_multiple_allocations() -> None:
    assert matches('device.driver == "gpu.nvidia.com" && !device.attributes["gpu.nvidia.com"].mig')
    assert matches("device.allowMultipleAllocations == false")
    assert matches("device.allowMultipleAllocations", {**H100, "allowMultipleAllocations": True})


def test_bind_optional_and_string_functions() -> None:
    assert matches(
        'cel.bind(gpu, device.attributes["gpu.nvidia.com"], '
        'gpu.productName.startsWith("NVIDIA H100") && gpu.type == "gpu")'
    )
    assert matches('device.attributes["gpu.nvidia.com"].?nvlinkIsland.orValue(-1) == -1')
    assert matches('device.attributes["gpu.nvidia.com"].productName.lowerAscii().contains("h100")')
    assert matches('device.attributes["gpu.nvidia.com"].productName.matches("^NVIDIA [HL]")')


# --- errors, not mismatches -----------------------------------------------------------------


def test_missing_attribute_is_an_error_naming_device_and_key() -> None:
    expr = 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA L4"'
    with pytest.raises(cel.CelEvalError) as info:
        matches(expr, BARE)
    message = str(info.value)
    assert "no such key: productName" in message
    assert '"gpu-9"' in message
    assert json.dumps(expr) in message
    assert info.value.device == "gpu-9"


def test_missing_attribute_guarded_by_has_is_false() -> None:
    expr = (
        'has(device.attributes["gpu.nvidia.com"].productName) && '
        'device.attributes["gpu.nvidia.com"].productName == "NVIDIA L4"'
    )
    assert matches(expr, BARE) is False
    assert matches(expr, L4) is True


def test_error_absorbed_by_short_circuit() -> None:
    assert matches('true || device.attributes["gpu.nvidia.com"].nope == 1', BARE)
    assert not matches('false && device.attributes["gpu.nvidia.com"].nope == 1', BARE)


def test_unknown_domain_is_an_empty_map() -> None:
    assert matches('size(device.attributes["example.com"]) == 0')
    assert matches('has(device.attributes["example.com"].foo) == false')
    assert matches('size(device.capacity["other.example.com"]) == 0')
    assert not matches('"example.com" in device.attributes')
    assert matches('device.attributes["example.com"].?foo.orValue("x") == "x"')
    # ...but an id looked up in it is still an error, not a mismatch.
    with pytest.raises(cel.CelEvalError, match="no such key: foo"):
        matches('device.attributes["example.com"].foo == 1')
    with pytest.raises(cel.CelEvalError, match="no such key: mem"):
        matches(
            'device.capacity["a.example.com"].mem.isGreaterThan(quantity("1")) || '
            'device.attributes["b.example.com"].x == 1'
        )


def test_non_bool_result_at_run_time_is_an_error() -> None:
    with pytest.raises(cel.CelEvalError, match="string could not be converted to bool"):
        matches('device.attributes["gpu.nvidia.com"].productName')


def test_runtime_type_errors_are_errors() -> None:
    with pytest.raises(cel.CelEvalError, match=r"[Nn]o matching overload"):
        matches('device.capacity["gpu.nvidia.com"].memory > 1')
    with pytest.raises(cel.CelEvalError, match=r"cannot compare kubernetes\.Quantity"):
        matches('device.capacity["gpu.nvidia.com"].memory.compareTo(semver("1.0.0")) == 0')
    with pytest.raises(cel.CelEvalError, match="quantity 'lots'"):
        matches('quantity("lots").isInteger()')


@pytest.mark.parametrize(
    ("attributes", "capacity", "needle"),
    [
        ({"driverVersion": {"version": "v580"}}, {}, "driverVersion"),
        ({"cores": {"ints": [1, 2]}}, {}, "unsupported attribute value"),
        ({}, {"memory": {"value": "80 GiB"}}, "memory"),
        ({}, {"memory": {}}, "memory"),
    ],
)
def test_bad_device_values_are_errors_naming_device(
    attributes: dict[str, Any], capacity: dict[str, Any], needle: str
) -> None:
    device = {"name": "gpu-7", "attributes": attributes, "capacity": capacity}
    with pytest.raises(cel.CelEvalError) as info:
        matches("true", device)
    assert '"gpu-7"' in str(info.value)
    assert needle in str(info.value)


# --- compile errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("device.driver == ", "Syntax error"),
        ("gpu.memory > 1", "undeclared reference to 'gpu"),
        ("device.gpu == 1", "undefined field 'gpu'"),
        ("device.driver", "must evaluate to bool or the unknown type, not string"),
        ('quantity("1")', "not kubernetes.Quantity"),
        ('device.attributes["gpu.nvidia.com"]', "not map("),
        ('quantity("1").compareTo(semver("1.0.0")) == 0', "no matching overload"),
        ("x" * (cel.MAX_EXPRESSION_BYTES + 1), "at most 10240 bytes"),
    ],
)
def test_compile_errors_name_expression_and_reason(expression: str, reason: str) -> None:
    with pytest.raises(cel.CelCompileError) as info:
        cel.compile_selector(expression)
    assert info.value.expression == expression
    assert json.dumps(expression) in str(info.value)
    assert reason in info.value.reason


def test_compiled_selectors_are_cached() -> None:
    expr = 'device.driver == "cache.example.com"'
    assert cel.compile_selector(expr) is cel.compile_selector(expr)
    for _ in range(2):  # a cached failure still raises, every time
        with pytest.raises(cel.CelCompileError):
            cel.compile_selector("device.driver ==")


def test_prepared_device_serves_many_selectors() -> None:
    prepared = cel.prepare_device(H100, driver=DRIVER)
    selectors = [
        cel.compile_selector('device.attributes["gpu.nvidia.com"].type == "gpu"'),
        cel.compile_selector('device.attributes["gpu.nvidia.com"].productName == "NVIDIA L4"'),
        cel.compile_selector('size(device.attributes["x.example.com"]) == 0'),
    ]
    assert [s.evaluate(prepared) for s in selectors] == [True, False, True]
    # The unknown-domain retry must not leak into the prepared device.
    assert cel.compile_selector('!("x.example.com" in device.attributes)').evaluate(prepared)


# --- the Kubernetes quantity and semver libraries ---------------------------------------------


@pytest.mark.parametrize(
    "expression",
    [
        'quantity("200M") == quantity("0.2G")',
        'quantity("200M").compareTo(quantity("0.2G")) == 0',
        'quantity("50M").compareTo(quantity("50Mi")) == -1',
        'quantity("50Mi").isGreaterThan(quantity("50M"))',
        'quantity("50M").isLessThan(quantity("100M"))',
        'quantity("50k").add(quantity("20")) == quantity("50.02k")',
        'quantity("50k").add(20) == quantity("50020")',
        'quantity("50k").sub(20000) == quantity("30k")',
        'quantity("50k").add(20).sub(quantity("100k")).sub(-50000).asInteger() == 20',
        'quantity("50.703k").asApproximateFloat() == 50703.0',
        'quantity("50k").isInteger() && !quantity("1m").isInteger()',
        '!quantity("9999999999999999999999999999999999999G").isInteger()',
        'sign(quantity("-1Ki")) == -1 && quantity("0").sign() == 0',
        'isQuantity("1.3Gi") && !isQuantity("1,3G") && !isQuantity("200K")',
        'semver("1.0.0-alpha.1").isLessThan(semver("1.0.0"))',
        'semver("1.0.0-alpha.beta").isGreaterThan(semver("1.0.0-alpha.1"))',
        'semver("1.0.0+build.1") == semver("1.0.0")',
        'semver("v1.2", true) == semver("1.2.0")',
        'isSemver("1.2.3") && !isSemver("v1.2.3") && isSemver("v1.2", true)',
    ],
)
def test_kubernetes_library(expression: str) -> None:
    assert matches(expression, BARE)


def test_as_integer_overflow_is_an_error() -> None:
    with pytest.raises(cel.CelEvalError, match="cannot convert value to integer"):
        matches('quantity("9999999999999999999999999999999999999G").asInteger() > 0', BARE)


# --- agreement with a real API server's compile verdicts ---------------------------------------


def _reference_dir() -> Path:
    return refdata.REFERENCE


def _selectors(kind: str, spec: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(field path, expression) of every CEL selector in a DeviceClass or ResourceClaim spec."""

    def from_list(prefix: str, selectors: Any) -> Iterator[tuple[str, str]]:
        for i, selector in enumerate(selectors or []):
            expression = (selector.get("cel") or {}).get("expression")
            if isinstance(expression, str):
                yield f"{prefix}.selectors[{i}].cel.expression", expression

    if kind == "deviceclasses":
        yield from from_list("spec", spec.get("selectors"))
        return
    for r, request in enumerate((spec.get("devices") or {}).get("requests") or []):
        prefix = f"spec.devices.requests[{r}]"
        yield from from_list(f"{prefix}.exactly", (request.get("exactly") or {}).get("selectors"))
        for s, sub in enumerate(request.get("firstAvailable") or []):
            yield from from_list(f"{prefix}.firstAvailable[{s}]", sub.get("selectors"))


def _verdict_cases() -> list[Any]:
    if not refdata.available():
        return refdata.placeholder(argnames=4)
    params = []
    for kind in ("deviceclasses", "resourceclaims"):
        path = _reference_dir() / "apiserver-verdicts" / f"{kind}.json"
        if not path.is_file():
            params.append(pytest.param(kind, "", "", {}, id=f"{kind}-missing"))
            continue
        for case in json.loads(path.read_text())["cases"]:
            spec = case["object"].get("spec") or {}
            for field, expression in _selectors(kind, spec):
                params.append(
                    pytest.param(kind, field, expression, case, id=f"{kind}:{case['case']}:{field}")
                )
    return params


def _server_reason(message: str, field: str) -> str | None:
    """The server's reason for rejecting ``field``, or None when it did not complain about it."""
    marker = f"{field}: Invalid value: "
    start = message.find(marker)
    if start < 0:
        return None
    _, end = json.JSONDecoder().raw_decode(message, start + len(marker))
    return message[end:].removeprefix(": ")


@refdata.MARK
@pytest.mark.parametrize(("kind", "field", "expression", "case"), _verdict_cases())
def test_compile_agrees_with_api_server(
    kind: str, field: str, expression: str, case: dict[str, Any]
) -> None:
    assert case, f"recorded verdicts for {kind} not found under {_reference_dir()}"
    reason = None if case["accepted"] else _server_reason(case["message"], field)
    if reason is None:
        # Accepted, or rejected for something other than this selector: it compiled there.
        cel.compile_selector(expression)
        return
    with pytest.raises(cel.CelCompileError) as info:
        cel.compile_selector(expression)
    assert json.dumps(expression) in str(info.value)
    # Same kind of failure: "compilation failed" or "must evaluate to bool ... not <type>".
    assert info.value.reason.split(":")[0] == reason.split(":")[0]
