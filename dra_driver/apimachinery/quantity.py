"""Kubernetes resource quantities ("80Gi", "1.5", "100m", "2e3") parsed and compared exactly.

Why it exists: CEL selectors compare device capacities with ``quantity("40Gi")`` and the
Kubernetes API accepts or rejects ResourceSlices by whether their capacity values parse. Both
need the same grammar and arithmetic as the Go ``resource.Quantity`` type, which this module
re-implements in plain Python: the value is held as an integer count of nano-units (the Go type
rounds anything finer up to 1n), so equality and ordering never depend on the spelling.
"""

from __future__ import annotations

import dataclasses
import enum
import functools

from dra_driver import records

NANO_PER_UNIT = 10**9
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)

# Largest decimal exponent accepted ("1e1000"); Go keeps such numbers symbolically, we would
# materialise them, so absurd exponents are refused instead of burning memory.
_MAX_ABS_EXPONENT = 1000
# Digits an int64 mantissa can always hold (Go's maxInt64Factors).
_MAX_INT64_DIGITS = 18
_SUFFIX_CHARS = frozenset("eEinumkKMGTP")
_DIGITS = frozenset("0123456789")


class QuantityError(ValueError):
    """A string is not a valid Kubernetes quantity, or an operation on quantities failed."""


class Format(enum.StrEnum):
    """Which family of suffix a quantity was written with (kept for display only)."""

    DECIMAL_SI = "DecimalSI"
    BINARY_SI = "BinarySI"
    DECIMAL_EXPONENT = "DecimalExponent"


_DECIMAL_SUFFIXES: dict[str, int] = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
_BINARY_SUFFIXES: dict[str, int] = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}


@records.record
class Quantity:
    """An exact quantity: ``nanos`` is the value times 10**9 (always an integer)."""

    nanos: int
    format: Format = dataclasses.field(default=Format.DECIMAL_SI, compare=False)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Quantity):
            return NotImplemented
        return self.nanos == other.nanos

    def __hash__(self) -> int:
        return hash(self.nanos)

    def compare(self, other: Quantity) -> int:
        """-1, 0 or 1 as this quantity is less than, equal to or greater than ``other``."""
        return (self.nanos > other.nanos) - (self.nanos < other.nanos)

    def sign(self) -> int:
        return (self.nanos > 0) - (self.nanos < 0)

    def add(self, other: Quantity) -> Quantity:
        return Quantity(self.nanos + other.nanos, self.format)

    def sub(self, other: Quantity) -> Quantity:
        return Quantity(self.nanos - other.nanos, self.format)

    def is_integer(self) -> bool:
        """True when the value is whole and fits an int64 (Go's ``AsInt64`` succeeds)."""
        whole, rest = divmod(self.nanos, NANO_PER_UNIT)
        return rest == 0 and INT64_MIN <= whole <= INT64_MAX

    def as_integer(self) -> int:
        if not self.is_integer():
            raise QuantityError("cannot convert value to integer")
        return self.nanos // NANO_PER_UNIT

    def as_approximate_float(self) -> float:
        try:
            return self.nanos / NANO_PER_UNIT
        except OverflowError:
            return float("inf") if self.nanos > 0 else float("-inf")

    @classmethod
    def from_int(cls, value: int) -> Quantity:
        return cls(value * NANO_PER_UNIT)

    def __str__(self) -> str:
        whole, rest = divmod(abs(self.nanos), NANO_PER_UNIT)
        sign = "-" if self.nanos < 0 else ""
        if rest == 0:
            return f"{sign}{whole}"
        frac = f"{rest:09d}".rstrip("0")
        return f"{sign}{whole}.{frac}"


def _split(text: str) -> tuple[bool, str, str, str, str]:
    """Scan ``text`` into (positive, value, numerator, fraction digits, suffix) like Go does."""
    positive = True
    pos, end = 0, len(text)
    if pos < end and text[0] in "+-":
        positive = text[0] == "+"
        pos += 1
    while pos < end and text[pos] == "0":
        pos += 1
    if pos >= end:
        return positive, "0", "0", "", ""
    start = pos
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    num = text[start:pos] or "0"
    denom = ""
    if pos < end and text[pos] == ".":
        pos += 1
        start = pos
        while pos < end and text[pos] in _DIGITS:
            pos += 1
        denom = text[start:pos]
    value = text[:pos]
    suffix_start = pos
    while pos < end and text[pos] in _SUFFIX_CHARS:
        pos += 1
    if pos < end and text[pos] in "+-":
        pos += 1
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    if pos < end:
        raise QuantityError(
            f"quantity {text!r}: quantities must match the regular expression "
            "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
        )
    return positive, value, num, denom, text[suffix_start:]


def _interpret_suffix(text: str, suffix: str) -> tuple[int, int, Format]:
    """(base, exponent, format) of a suffix, e.g. "Gi" -> (2, 30, BinarySI)."""
    if suffix in _DECIMAL_SUFFIXES:
        return 10, _DECIMAL_SUFFIXES[suffix], Format.DECIMAL_SI
    if suffix in _BINARY_SUFFIXES:
        return 2, _BINARY_SUFFIXES[suffix], Format.BINARY_SI
    if len(suffix) > 1 and suffix[0] in "eE":
        digits = suffix[1:]
        body = digits[1:] if digits[0] in "+-" else digits
        if body and all(c in _DIGITS for c in body):
            exponent = int(digits)
            if abs(exponent) > _MAX_ABS_EXPONENT:
                raise QuantityError(f"quantity {text!r}: exponent {exponent} is out of range")
            return 10, exponent, Format.DECIMAL_EXPONENT
    raise QuantityError(f"quantity {text!r}: unable to parse quantity's suffix")


def _ceil_div_away_from_zero(numerator: int, denominator: int) -> int:
    """Round ``numerator / denominator`` (denominator > 0) away from zero."""
    quotient = -(-abs(numerator) // denominator)
    return quotient if numerator >= 0 else -quotient


@functools.lru_cache(maxsize=4096)
def parse_quantity(text: str) -> Quantity:
    """Parse a quantity string with Go ``resource.ParseQuantity`` semantics.

    Raises :class:`QuantityError` naming the string when it does not parse.
    """
    if not isinstance(text, str) or not text:
        raise QuantityError(f"quantity {text!r}: quantities must not be empty")
    if text == "0":
        return Quantity(0)
    positive, value, num, denom, suffix = _split(text)
    base, exponent, fmt = _interpret_suffix(text, suffix)

    # Go takes an exact int64 fast path when the digits are few enough; otherwise it parses
    # ``value`` (the signed number as written) as an arbitrary-precision decimal, which fails
    # for inputs without any digit (e.g. "Ei"), rounds up to 1n and caps binary values at int64.
    if fmt is Format.BINARY_SI:
        fast = not denom and 15 - len(num) - int(exponent * 3 / 10) - 1 >= 0
    else:
        fast = _MAX_INT64_DIGITS - (len(num) + len(denom)) >= 0 and exponent - len(denom) >= -9
    mantissa = int(num + denom)  # the digits without the decimal point
    exact = False
    if fast and fmt is not Format.BINARY_SI:
        nanos = mantissa * 10 ** (exponent - len(denom) + 9)
        exact = True
    elif fast:
        nanos = mantissa * NANO_PER_UNIT << exponent
        exact = nanos <= INT64_MAX * NANO_PER_UNIT  # else Go's int64 multiply overflows
    if not exact:
        digits = value.lstrip("+-")
        if not any(c in _DIGITS for c in digits):
            raise QuantityError(f"quantity {text!r}: unable to parse numeric part of quantity")
        scale = len(denom)
        if base == 10:
            scale -= exponent
            multiplier = 1
        else:
            multiplier = 1 << exponent
        # value = mantissa * multiplier / 10**scale; in nanos: * 10**9, rounded away from zero.
        shift = 9 - scale
        if shift >= 0:
            nanos = mantissa * multiplier * 10**shift
        else:
            nanos = _ceil_div_away_from_zero(mantissa * multiplier, 10**-shift)
        if fmt is Format.BINARY_SI and nanos > INT64_MAX * NANO_PER_UNIT:
            nanos = INT64_MAX * NANO_PER_UNIT
        if fmt is Format.BINARY_SI and 0 < nanos < NANO_PER_UNIT:
            fmt = Format.DECIMAL_SI
    return Quantity(nanos if positive else -nanos, fmt)


def is_quantity(text: str) -> bool:
    """True when ``text`` parses as a quantity."""
    try:
        parse_quantity(text)
    except QuantityError:
        return False
    return True
