"""Recorded reference data from ``../shared/reference``, under the suite's fixture convention.

A test that needs a file is skipped with a clear reason when ``../shared`` is absent, and fails
when ``CI=true`` (CI always has it). Tests parametrized over a file's cases collect no cases
then, and :func:`require` in a plain test of the same module carries the skip or failure.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

REFERENCE = Path(__file__).resolve().parents[2].parent / "shared" / "reference"


def load(name: str) -> Any | None:
    """The parsed JSON file, or ``None`` when the shared reference data is not there."""
    path = REFERENCE / name
    return json.loads(path.read_text()) if path.is_file() else None


def require(name: str) -> Any:
    """The parsed JSON file; skips (or fails under CI) when it is not there."""
    found = load(name)
    if found is None:
        message = f"shared reference data not found: {REFERENCE / name}"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found
