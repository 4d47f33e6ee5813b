"""Label and field selectors as the API server parses and applies them.

Why it exists: owners of Pods, Leases and ComputeDomain objects list and watch by label
(``app=...,node in (a,b)``) and by a few fields (``metadata.name``, ``metadata.namespace``,
``spec.nodeName``; Events: ``regarding.uid``, ``reason``, ...); the in-memory server must filter
the same way and refuse what a server refuses (an unsupported field label is a 400), or tests
pass on selectors that match nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from dra_driver.kube import api

# Field labels every kind supports, and Pods' spec.nodeName / status.phase.
FIELDS: dict[str, tuple[str, ...]] = {
    "metadata.name": ("metadata", "name"),
    "metadata.namespace": ("metadata", "namespace"),
    "spec.nodeName": ("spec", "nodeName"),
    "status.phase": ("status", "phase"),
}
# Events (events.k8s.io/v1) add what they regard, their reason, type and reporter.
KIND_FIELDS: dict[str, dict[str, tuple[str, ...]]] = {
    "Event": {
        **{f"regarding.{f}": ("regarding", f) for f in ("kind", "namespace", "name", "uid")},
        "reason": ("reason",),
        "type": ("type",),
        "reportingController": ("reportingController",),
    }
}
_SET = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_KEY = re.compile(r"([a-z0-9.-]+/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
Match = Callable[[api.Obj], bool]


def matcher(label_selector: str, field_selector: str, *, kind: str = "") -> Match:
    """One predicate for both selectors (``kind``: the fields of that kind too); raises
    Invalid (400) for what a server refuses."""
    fields = {**FIELDS, **KIND_FIELDS.get(kind, {})}
    terms = [_label_term(t) for t in _split(label_selector)]
    terms += [_field_term(t, fields) for t in _split(field_selector)]
    return lambda obj: all(term(obj) for term in terms)


def _split(selector: str) -> list[str]:
    """Terms at top-level commas (commas inside ``in (a,b)`` stay)."""
    out, depth, current = [], 0, ""
    for ch in selector:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            out.append(current)
            current = ""
        else:
            current += ch
    out.append(current)
    return [t.strip() for t in out if t.strip()]


def _labels(obj: api.Obj) -> dict[str, Any]:
    return (obj.get("metadata") or {}).get("labels") or {}


def _label_term(term: str) -> Match:
    found = _SET.match(term)
    if found:
        key, op, values = found.group(1), found.group(2), found.group(3)
        wanted = {v.strip() for v in values.split(",") if v.strip()}
        if op == "in":
            return lambda o: _labels(o).get(key) in wanted
        return lambda o: _labels(o).get(key) not in wanted
    for op in ("!=", "==", "="):
        if op in term:
            key, value = (p.strip() for p in term.split(op, 1))
            _label_key(key, term)
            if op == "!=":
                return lambda o: _labels(o).get(key) != value
            return lambda o: _labels(o).get(key) == value
    if term.startswith("!"):
        key = _label_key(term[1:].strip(), term)
        return lambda o: key not in _labels(o)
    key = _label_key(term, term)
    return lambda o: key in _labels(o)


def _label_key(key: str, term: str) -> str:
    if not key or not re.fullmatch(r"([a-z0-9.-]+/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", key):
        raise api.Invalid(
            f"unable to parse requirement: invalid label key {key!r} in {term!r}", status=400
        )
    return key


def _field_term(term: str, fields: dict[str, tuple[str, ...]]) -> Match:
    negate = "!=" in term
    key, _, value = term.replace("!=", "=").replace("==", "=").partition("=")
    key, value = key.strip(), value.strip()
    if key not in fields:
        raise api.Invalid(f'field label not supported: "{key}"', status=400)
    path = fields[key]

    def match(obj: api.Obj) -> bool:
        got: Any = obj
        for part in path:
            got = got.get(part) if isinstance(got, dict) else None
        text = str(got or "")
        return (text != value) if negate else (text == value)

    return match
