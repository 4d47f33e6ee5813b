"""apimachinery's name validators, message for message: what each returns for the edge cases
the server distinguishes (dots in a label, empty parts, length and format both failing)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dra_driver.apimachinery import names

LABEL = "a lowercase RFC 1123 label must consist of"
SUBDOMAIN = "a lowercase RFC 1123 subdomain must consist of"
NAME_PART = "name part must consist of alphanumeric characters"


def starts(problems: list[str], expected: list[str]) -> bool:
    """Same number of messages, each beginning as expected."""
    return len(problems) == len(expected) and all(
        p.startswith(e) for p, e in zip(problems, expected, strict=True)
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("gpu-0", []),
        ("a" * 63, []),
        ("a" * 64, ["must be no more than 63 characters"]),
        ("gpu.0", ["must not contain dots"]),  # a subdomain, so only the dots are wrong
        ("GPU", [LABEL]),
        ("", [LABEL]),
        ("-" * 64, ["must be no more than 63 characters", LABEL]),
    ],
)
def test_dns_label(value: str, expected: list[str]) -> None:
    assert starts(names.dns_label(value), expected)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("example.com", []),
        ("a" * 253, []),
        ("a" * 254, ["must be no more than 253 characters"]),
        ("Example.com", [SUBDOMAIN]),
        ("a..b", [SUBDOMAIN]),
        ("", [SUBDOMAIN]),
    ],
)
def test_dns_subdomain(value: str, expected: list[str]) -> None:
    assert starts(names.dns_subdomain(value), expected)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("k", []),
        ("example.com/My.Key_1", []),
        ("", ["name part must be non-empty", NAME_PART]),
        ("/k", ["prefix part must be non-empty"]),
        ("x/", ["name part must be non-empty", NAME_PART]),
        ("Example.com/k", [f"prefix part {SUBDOMAIN}"]),
        ("a/b/c", ["a qualified name must consist of"]),
        ("k" * 64, ["name part must be no more than 63 characters"]),
        ("-" * 64, ["name part must be no more than 63 characters", NAME_PART]),
        ("a b", [NAME_PART]),
    ],
)
def test_qualified_name(value: str, expected: list[str]) -> None:
    assert starts(names.qualified_name(value), expected)


def test_label_value_and_c_identifier() -> None:
    assert names.label_value("") == []
    assert starts(names.label_value("v" * 64), ["must be no more than 63 characters"])
    assert starts(names.label_value("-v"), ["a valid label must be an empty string or"])
    assert names.c_identifier("_a1") == []
    assert starts(names.c_identifier("1a"), ["a valid C identifier must start with alph"])
    assert names.c_identifier("x" * 100) == []  # format only: callers check the length


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("nvidia.com/gpu", True),
        ("gpu", False),
        ("kubernetes.io/gpu", False),
        ("a.kubernetes.io/gpu", False),
        ("requests.nvidia.com/gpu", False),
        ("nvidia.com/" + "g" * 63, True),  # the name part of requests.<domain>/<name>
        ("nvidia.com/" + "g" * 64, False),
    ],
)
def test_extended_resource_names(value: str, ok: bool) -> None:
    assert names.is_extended_resource_name(value) is ok


@pytest.mark.parametrize(
    ("check", "value", "expected"),
    [
        # Go's `^...$` ends at the end of the text; Python's `$` also matches before a final
        # newline, which must not make these names valid.
        (names.dns_label, "gpu-0\n", [LABEL]),
        (names.dns_subdomain, "example.com\n", [SUBDOMAIN]),
        (names.qualified_name, "k\n", [NAME_PART]),
        (names.qualified_name, "example.com\n/k", [f"prefix part {SUBDOMAIN}"]),
        (names.label_value, "v\n", ["a valid label must be an empty string or"]),
        (names.c_identifier, "x\n", ["a valid C identifier must start with alph"]),
    ],
)
def test_a_trailing_newline_is_not_part_of_a_valid_name(
    check: Callable[[str], list[str]], value: str, expected: list[str]
) -> None:
    assert starts(check(value), expected)


def test_lengths_are_counted_in_bytes_as_go_does() -> None:
    # 32 two-byte characters: 64 bytes, over the 63 that len() measures in Go
    assert starts(
        names.label_value("é" * 32),
        ["must be no more than 63 characters", "a valid label must be an empty string or"],
    )
    assert starts(
        names.qualified_name("é" * 32),
        ["name part must be no more than 63 characters", NAME_PART],
    )
    assert starts(names.dns_label("é" * 32), ["must be no more than 63 characters", LABEL])
    assert starts(names.label_value("é" * 31), ["a valid label must be an empty string or"])
