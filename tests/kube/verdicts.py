"""The recorded verdicts of a real kube-apiserver (``../shared/reference/apiserver-verdicts``),
loaded at collection time so a case added to a file becomes a test without a code change."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
REFERENCE = REPO_ROOT.parent / "shared" / "reference"
VERDICTS = REFERENCE / "apiserver-verdicts"

# The recording ran with this namespace labelled for admin access (README of the folder).
NAMESPACE_LABELS = {"admin-ns": {"resource.kubernetes.io/admin-access": "true"}}

_KINDS = (
    "Invalid value|Required value|Duplicate value|Too many|Too long|Unsupported value|Forbidden"
)
_FIELD_ERROR = re.compile(rf"(?:is invalid: \[?|, )([A-Za-z0-9_.\[\]/-]+): (?:{_KINDS})")
_UNKNOWN_FIELD = re.compile(r'unknown field "([^"]+)"')


def load(kind: str) -> dict[str, Any]:
    """One verdict file; fails collection loudly when the reference data is missing."""
    path = VERDICTS / f"{kind}.json"
    if not path.is_file():
        raise FileNotFoundError(f"recorded API verdicts not found at {path}")
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def params(kind: str) -> list[Any]:
    """``pytest.param(case, id=<case name>)`` for every case of ``<kind>.json``."""
    return [pytest.param(case, id=case["case"]) for case in load(kind)["cases"]]


def paths(message: str) -> list[str]:
    """Field paths a server message names (422 field errors, 400 unknown fields)."""
    found = _UNKNOWN_FIELD.findall(message)
    return found or _FIELD_ERROR.findall(message)


def reason(message: str) -> str:
    """What a 400 says after the 'cannot be handled as a <Kind>: ' prefix."""
    return message.split("cannot be handled as a ", 1)[-1].split(": ", 1)[-1]


def assert_same_verdict(case: dict[str, Any], status: int, message: str) -> None:
    """Our outcome (HTTP status, message) against the server's for one case."""
    assert status == case["httpStatus"], f"{case['case']}: {message}"
    if case["accepted"]:
        return
    server = paths(case["message"])
    if server:
        assert paths(message) == server, f"server: {case['message']}\nours:   {message}"
    else:
        assert reason(case["message"]) in message, f"server: {case['message']}\nours: {message}"
