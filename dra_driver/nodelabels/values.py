"""Label values the way GPU Feature Discovery writes them, always valid for the API server.

Why it exists: NVML's names are free text ("NVIDIA TITAN X (Pascal)", DMI product names with
slashes) and a label value must be at most 63 characters of ``[A-Za-z0-9._-]`` that start and
end alphanumeric, or the API server refuses the whole Node update. GFD's rules, reproduced here:
each name part drops every character outside letters, digits, ``-``, ``_``, ``.`` and space,
runs of whitespace become one ``-``, the parts are joined with ``-`` (``<model>-MIG-<profile>``,
plus ``-SHARED`` when time-sliced). Two guards GFD itself lacks (its values can be refused):
a value over 63 characters is cut in the *model* part only, so the discriminating suffix
(MIG profile, ``SHARED``) survives, and a cut part loses trailing ``-._`` (the approach of
NVIDIA/k8s-device-plugin PR #1880); a value is also trimmed to start and end alphanumeric.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from dra_driver.apimachinery import names

MAX = names.LABEL_VALUE_MAX
UNKNOWN = "unknown"
_DROP = re.compile(r"[^A-Za-z0-9\-_. ]")
_EDGE = "-_."


def sanitize(part: str) -> str:
    """One name part: foreign characters dropped, whitespace runs → ``-`` (GFD's ``sanitise``)."""
    return "-".join(_DROP.sub("", part).split())


def _trim(value: str) -> str:
    """Strip what may not start or end a label value."""
    return value.strip(_EDGE)


def joined(parts: Sequence[str]) -> str:
    """Sanitized non-empty parts joined with ``-``, cut to a valid label value.

    Only the first part (the model) is shortened when the whole does not fit; if the rest
    alone does not fit either, the whole is cut at the limit.
    """
    clean = [p for p in (_trim(sanitize(x)) for x in parts) if p]
    if not clean:
        return ""
    whole = "-".join(clean)
    if len(whole) <= MAX:
        return whole
    suffix = "-".join(clean[1:])
    room = MAX - len(suffix) - (1 if suffix else 0)
    head = _trim(clean[0][:room]) if room > 0 else ""
    if head and suffix:
        return f"{head}-{suffix}"
    return _trim(whole[:MAX])


def text(value: str | None, *, default: str = UNKNOWN) -> str:
    """Free text (a machine type) as one label value; ``default`` when nothing valid remains."""
    return joined([value or ""]) or default


def product(parts: Sequence[str], *, shared: bool) -> str:
    """``gpu.product``: ``NVIDIA-A100-SXM4-40GB``, ``...-MIG-1g.5gb``, ``...-SHARED``."""
    if not any(_trim(sanitize(p)) for p in parts):
        return ""
    return joined([*parts, "SHARED"] if shared else parts)


def family(compute_capability: str) -> str:
    """GFD's ``gpu.family`` from the CUDA compute capability (``9.0`` → ``hopper``)."""
    major, minor = version_pair(compute_capability) or (0, 0)
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ampere" if minor < 9 else "ada-lovelace"
    return {
        1: "tesla",
        2: "fermi",
        3: "kepler",
        5: "maxwell",
        6: "pascal",
        9: "hopper",
        10: "blackwell",
        12: "blackwell",
    }.get(major, "undefined")


def version_pair(value: str) -> tuple[int, int] | None:
    """``"9.0"`` → ``(9, 0)``; None when it is not ``<int>.<int>``."""
    major, sep, minor = value.partition(".")
    if not sep or not major.isdigit() or not minor.isdigit():
        return None
    return int(major), int(minor)


def driver_parts(version: str) -> tuple[str, str, str] | None:
    """``580.95.05`` → ``("580", "95", "05")``; ``X.Y`` gives an empty revision (as GFD).

    None when the version is not two or three dot-separated numbers (GFD refuses those too).
    """
    parts = version.split(".")
    if not 2 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        return None
    return parts[0], parts[1], parts[2] if len(parts) == 3 else ""
