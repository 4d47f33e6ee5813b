"""Shared helpers for the command-line tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import pytest

RunCli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def run_cli() -> RunCli:
    """``run_cli("fake-event", "--gpu", "0", ..., env={...})``: ``dra-driver`` as a subprocess."""

    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "dra_driver", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, **(env or {})},
        )

    return run
