"""Fixtures for the deployment artefacts: the chart renderer script, loaded as a module."""

from __future__ import annotations

from types import ModuleType

import pytest
from scriptload import load_script


@pytest.fixture(scope="session")
def rc() -> ModuleType:
    """scripts/render_chart.py: render(), validate(), lint(), value_sets(), ..."""
    return load_script("render_chart")
