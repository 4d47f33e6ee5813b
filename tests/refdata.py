"""The shared reference data (``<repo>/../shared/reference``) and how tests that read it say so.

Why it exists: the recorded verdicts of a real API server, the recorded allocations, the
OpenAPI document and the CDI schema live beside the repository, not in it. CI has them (and
``CI=true`` makes their absence a failure); a plain ``git clone`` does not, and its ``make test``
must still pass. A test that reads this data carries ``@pytest.mark.reference`` (or uses the
``reference_dir`` / ``cdi_validator`` fixtures); ``tests/conftest.py`` skips exactly those, with
one short reason counted on one summary line, when the folder is absent. Data is loaded lazily
(never at import), so a missing folder cannot break collection.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
REFERENCE = REPO_ROOT.parent / "shared" / "reference"

#: Marks a test that reads ``../shared/reference`` (skipped without it, failed under CI=true).
MARK = pytest.mark.reference


def available() -> bool:
    return REFERENCE.is_dir()


def required() -> bool:
    """Whether the data must be present: CI runs with ``CI=true`` and ``../shared`` beside."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def path(*parts: str) -> Path:
    """A path inside the reference folder (which may not exist: see :func:`available`)."""
    return REFERENCE.joinpath(*parts)


@functools.cache
def load_json(*parts: str) -> Any:
    """A JSON file of the reference folder, read once; a clear error when it is missing."""
    file = path(*parts)
    if not file.is_file():
        raise FileNotFoundError(
            f"{file} not found: tests reading ../shared/reference must be marked "
            "@pytest.mark.reference so a clone without it skips them"
        )
    return json.loads(file.read_text(encoding="utf-8"))


def placeholder(*, argnames: int = 1) -> list[Any]:
    """The parameter list of a data-driven test when the data is absent: one marked stand-in,
    so the test is collected (and skipped, or failed under CI) instead of vanishing."""
    values = (None,) * argnames
    return [pytest.param(*values, id="no-reference-data", marks=MARK)]


# The shape of real-allocations.json with nothing in it: modules that build module-level
# constants from the file use it when the file is absent (their tests are skipped then).
_EMPTY_ALLOCATIONS: dict[str, Any] = {
    "node": "",
    "slice": {"spec": {"driver": "", "pool": {"name": ""}, "devices": []}},
    "deviceClasses": [],
    "claims": [],
}


def real_allocations() -> dict[str, Any]:
    """``real-allocations.json``, or an empty stand-in of the same shape when it is absent."""
    if not available():
        return _EMPTY_ALLOCATIONS
    data: dict[str, Any] = load_json("real-allocations.json")
    return data
