"""Semantic versions (semver 2.0.0) parsed and ordered like the Kubernetes CEL ``semver()``.

Why it exists: ResourceSlice ``version`` attributes (e.g. the GPU driver version) reach CEL
selectors as semver objects, and selectors compare them with ``semver("550.0.0")``. Kubernetes
uses the strict Go parser (no leading ``v``, no leading zeros, exactly MAJOR.MINOR.PATCH); this
module implements the same rules and precedence so selectors give the scheduler's answer.
"""

from __future__ import annotations

import dataclasses
import functools

from dra_driver import records

_ALNUM_HYPHEN = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-")
_DIGITS = frozenset("0123456789")
_UINT64_MAX = 2**64 - 1


class SemverError(ValueError):
    """A string is not a valid semantic version."""


@records.record
class Semver:
    """A parsed version; ``prerelease`` holds the dot-separated identifiers after ``-``.

    Build metadata is kept for display but ignored by equality and ordering, as in semver.
    """

    major: int
    minor: int
    patch: int
    prerelease: tuple[int | str, ...] = ()
    build: tuple[str, ...] = dataclasses.field(default=(), compare=False)

    def compare(self, other: Semver) -> int:
        """-1, 0 or 1 as this version has lower, equal or higher precedence than ``other``."""
        mine = (self.major, self.minor, self.patch)
        theirs = (other.major, other.minor, other.patch)
        if mine != theirs:
            return -1 if mine < theirs else 1
        return _compare_prerelease(self.prerelease, other.prerelease)

    def canonical(self) -> str:
        """MAJOR.MINOR.PATCH[-PRERELEASE], the part that decides equality."""
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.prerelease:
            text += "-" + ".".join(str(p) for p in self.prerelease)
        return text

    def __str__(self) -> str:
        return self.canonical() + ("+" + ".".join(self.build) if self.build else "")


def _compare_prerelease(a: tuple[int | str, ...], b: tuple[int | str, ...]) -> int:
    if not a or not b:
        # A version without pre-release outranks one with it.
        return (not a) - (not b)
    for x, y in zip(a, b, strict=False):
        if x == y:
            continue
        if isinstance(x, int) and isinstance(y, int):
            return -1 if x < y else 1
        if isinstance(x, int):
            return -1  # numeric identifiers rank below alphanumeric ones
        if isinstance(y, int):
            return 1
        return -1 if x < y else 1
    return (len(a) > len(b)) - (len(a) < len(b))


def _number(text: str, part: str, what: str) -> int:
    if not part or not all(c in _DIGITS for c in part):
        raise SemverError(f"version {text!r}: invalid character(s) in {what} number {part!r}")
    if len(part) > 1 and part[0] == "0":
        raise SemverError(f"version {text!r}: {what} number must not contain leading zeroes")
    value = int(part)
    if value > _UINT64_MAX:
        raise SemverError(f"version {text!r}: {what} number {part} is out of range")
    return value


@functools.lru_cache(maxsize=4096)
def parse_semver(text: str, *, normalize: bool = False) -> Semver:
    """Parse ``text`` strictly; with ``normalize`` first drop a leading ``v``, pad a missing
    minor/patch with 0 and strip leading zeros (the CEL ``semver(s, true)`` form).

    Raises :class:`SemverError` naming the string.
    """
    if not isinstance(text, str) or not text:
        raise SemverError(f"version {text!r}: version string empty")
    source = _normalized(text) if normalize else text
    parts = source.split(".", 2)
    if len(parts) != 3:
        raise SemverError(f"version {text!r}: no Major.Minor.Patch elements found")
    major = _number(text, parts[0], "major")
    minor = _number(text, parts[1], "minor")
    rest = parts[2]
    build: tuple[str, ...] = ()
    if "+" in rest:
        rest, build_text = rest.split("+", 1)
        build = tuple(build_text.split("."))
        for ident in build:
            if not ident or not set(ident) <= _ALNUM_HYPHEN:
                raise SemverError(f"version {text!r}: invalid build metadata {ident!r}")
    prerelease: tuple[int | str, ...] = ()
    if "-" in rest:
        rest, pre_text = rest.split("-", 1)
        prerelease = tuple(_prerelease_ident(text, p) for p in pre_text.split("."))
    patch = _number(text, rest, "patch")
    return Semver(major, minor, patch, prerelease, build)


def _prerelease_ident(text: str, ident: str) -> int | str:
    if not ident:
        raise SemverError(f"version {text!r}: pre-release identifier must not be empty")
    if not set(ident) <= _ALNUM_HYPHEN:
        raise SemverError(f"version {text!r}: invalid character(s) in pre-release {ident!r}")
    if all(c in _DIGITS for c in ident):
        if len(ident) > 1 and ident[0] == "0":
            raise SemverError(f"version {text!r}: pre-release number {ident!r} has leading zeroes")
        if int(ident) > _UINT64_MAX:
            raise SemverError(f"version {text!r}: pre-release number {ident} is out of range")
        return int(ident)
    return ident


def _normalized(text: str) -> str:
    text = text.removeprefix("v")
    parts = text.split(".", 2)
    for i, part in enumerate(parts):
        if len(part) > 1:
            stripped = part.lstrip("0")
            if not stripped or stripped[0] not in _DIGITS:
                stripped = "0" + stripped
            parts[i] = stripped
    if len(parts) < 3:
        if any(c in parts[-1] for c in "+-"):
            raise SemverError(f"version {text!r}: short version cannot contain pre-release/build")
        parts += ["0"] * (3 - len(parts))
    return ".".join(parts)


def is_semver(text: str, *, normalize: bool = False) -> bool:
    """True when ``text`` parses as a semantic version."""
    try:
        parse_semver(text, normalize=normalize)
    except SemverError:
        return False
    return True
