"""Semantic versions: the strict Go parser's rules, normalisation and semver 2.0.0 precedence."""

from __future__ import annotations

import itertools

import pytest

from dra_driver.apimachinery.semver import Semver, SemverError, is_semver, parse_semver


def test_parse_fields() -> None:
    v = parse_semver("1.2.3-rc.1+build.5")
    assert (v.major, v.minor, v.patch, v.prerelease, v.build) == (
        1,
        2,
        3,
        ("rc", 1),
        ("build", "5"),
    )
    assert str(v) == "1.2.3-rc.1+build.5"
    assert v.canonical() == "1.2.3-rc.1"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "1.2",
        "v1.2.3",
        "01.2.3",
        "1.02.3",
        "1.2.03",
        "1.2.3-",
        "1.2.3-01",
        "1.2.3-a..b",
        "1.2.3+",
        "1.2.3-a_b",
        "1.2.x",
        "18446744073709551616.0.0",
    ],
)
def test_invalid_versions(text: str) -> None:
    with pytest.raises(SemverError) as info:
        parse_semver(text)
    assert repr(text) in str(info.value)
    assert not is_semver(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("v1.2", "1.2.0"), ("1", "1.0.0"), ("01.01.01", "1.1.1"), ("v1.2.3", "1.2.3")],
)
def test_normalize(text: str, expected: str) -> None:
    assert parse_semver(text, normalize=True) == parse_semver(expected)
    assert is_semver(text, normalize=True)


def test_normalize_rejects_short_prerelease() -> None:
    with pytest.raises(SemverError):
        parse_semver("1.0-rc", normalize=True)


def test_precedence() -> None:
    ordered = [
        "1.0.0-alpha",
        "1.0.0-alpha.1",
        "1.0.0-alpha.beta",
        "1.0.0-beta",
        "1.0.0-beta.2",
        "1.0.0-beta.11",
        "1.0.0-rc.1",
        "1.0.0",
        "1.0.1",
        "1.1.0",
        "2.0.0",
        "580.9.50",
        "580.95.5",
    ]
    versions = [parse_semver(v) for v in ordered]
    for low, high in itertools.pairwise(versions):
        assert low.compare(high) == -1, (low, high)
        assert high.compare(low) == 1, (low, high)


def test_build_metadata_is_ignored_by_equality() -> None:
    assert parse_semver("1.0.0+a") == parse_semver("1.0.0+b") == Semver(1, 0, 0)
    assert parse_semver("1.0.0+a").compare(parse_semver("1.0.0")) == 0
