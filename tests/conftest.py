"""Fixtures every test package may use: where the shared reference data lives."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
REFERENCE = REPO_ROOT.parent / "shared" / "reference"


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    """``../shared/reference``: wire contracts, OpenAPI, CDI schema, recorded API verdicts."""
    if not REFERENCE.is_dir():
        pytest.fail(f"shared reference data not found at {REFERENCE}")
    return REFERENCE
