"""Kubernetes quantity parsing: grammar, exact values, rounding and the Go parser's edge cases."""

from __future__ import annotations

import pytest

from dra_driver.apimachinery.quantity import (
    NANO_PER_UNIT,
    Format,
    Quantity,
    QuantityError,
    is_quantity,
    parse_quantity,
)


@pytest.mark.parametrize(
    ("text", "nanos", "fmt"),
    [
        ("0", 0, Format.DECIMAL_SI),
        ("80Gi", 80 * 2**30 * NANO_PER_UNIT, Format.BINARY_SI),
        ("1.5Gi", 3 * 2**29 * NANO_PER_UNIT, Format.BINARY_SI),
        ("-1Ki", -1024 * NANO_PER_UNIT, Format.BINARY_SI),
        ("100m", 10**8, Format.DECIMAL_SI),
        ("1.5", 15 * 10**8, Format.DECIMAL_SI),
        ("+.5", 5 * 10**8, Format.DECIMAL_SI),
        ("1.", NANO_PER_UNIT, Format.DECIMAL_SI),
        ("2e3", 2000 * NANO_PER_UNIT, Format.DECIMAL_EXPONENT),
        ("1E-3", 10**6, Format.DECIMAL_EXPONENT),
        ("1E", 10**18 * NANO_PER_UNIT, Format.DECIMAL_SI),  # "E" alone is exa
        ("5n", 5, Format.DECIMAL_SI),
        ("7u", 7000, Format.DECIMAL_SI),
        ("0.1n", 1, Format.DECIMAL_SI),  # finer than 1n rounds up (away from zero)
        ("-0.1n", -1, Format.DECIMAL_SI),
        ("8Ei", (2**63 - 1) * NANO_PER_UNIT, Format.BINARY_SI),  # binary values cap at int64
        ("Mi", 0, Format.BINARY_SI),  # the Go scanner reads a missing number as 0
    ],
)
def test_parse(text: str, nanos: int, fmt: Format) -> None:
    quantity = parse_quantity(text)
    assert quantity.nanos == nanos
    assert quantity.format is fmt


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty"),
        ("80 Gi", "regular expression"),
        ("1,5G", "regular expression"),
        ("10Mo", "regular expression"),
        ("200K", "suffix"),
        ("10Mm", "suffix"),
        ("1e", "suffix"),
        ("Ei", "numeric part"),
        ("1e99999", "out of range"),
    ],
)
def test_parse_errors_name_the_string(text: str, reason: str) -> None:
    with pytest.raises(QuantityError) as info:
        parse_quantity(text)
    assert repr(text) in str(info.value)
    assert reason in str(info.value)
    assert not is_quantity(text)


def test_equality_ignores_spelling_and_format() -> None:
    assert parse_quantity("1Gi") == parse_quantity("1024Mi") == parse_quantity("1073741824")
    assert hash(parse_quantity("200M")) == hash(parse_quantity("0.2G"))
    assert parse_quantity("50M").compare(parse_quantity("50Mi")) == -1
    assert parse_quantity("50Mi").compare(parse_quantity("50M")) == 1


def test_arithmetic_and_conversions() -> None:
    q = parse_quantity("50k").add(Quantity.from_int(20)).sub(parse_quantity("100k"))
    assert q.as_integer() == -49980
    assert q.sign() == -1
    assert str(parse_quantity("1500m")) == "1.5"
    assert parse_quantity("50.703k").as_approximate_float() == 50703.0
    assert not parse_quantity("1m").is_integer()
    big = parse_quantity("9999999999999999999999999999999999999G")
    assert not big.is_integer()
    with pytest.raises(QuantityError, match="cannot convert value to integer"):
        big.as_integer()
