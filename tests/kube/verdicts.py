"""The recorded verdicts of a real kube-apiserver (``../shared/reference/apiserver-verdicts``),
loaded at collection time so a case added to a file becomes a test without a code change."""

from __future__ import annotations

import re
from typing import Any

import pytest
import refdata

VERDICTS = refdata.path("apiserver-verdicts")

# The recording ran with this namespace labelled for admin access (README of the folder).
NAMESPACE_LABELS = {"admin-ns": {"resource.kubernetes.io/admin-access": "true"}}

_KINDS = (
    "Invalid value|Required value|Duplicate value|Too many|Too long|Unsupported value|Forbidden"
)
_FIELD_ERROR = re.compile(rf"(?:is invalid: \[?|, )([A-Za-z0-9_.\[\]/-]+): (?:{_KINDS})")
_UNKNOWN_FIELD = re.compile(r'unknown field "([^"]+)"')


def load(kind: str) -> dict[str, Any]:
    """One verdict file (the caller is a test marked ``reference``)."""
    data: dict[str, Any] = refdata.load_json("apiserver-verdicts", f"{kind}.json")
    return data


def params(kind: str) -> list[Any]:
    """``pytest.param(case, id=<case name>)`` for every case of ``<kind>.json``; one marked
    stand-in when the reference data is absent (the test is then skipped, or fails in CI)."""
    if not refdata.available():
        return refdata.placeholder()
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
