"""Every benchmark script still imports and parses its flags (a moved module broke one once
unnoticed: benchmarks are not run by the test suite)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py") if p.name != "benchkit.py")


def test_the_scripts_are_found() -> None:
    assert {"prepare.py", "placement.py", "publish.py", "faults.py"} <= set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_benchmark_script_imports_and_prints_its_help(script: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage:")


def test_the_health_benchmark_runs_once_through() -> None:
    """A short real run (one repeat, ~6 s): the health benchmark reads slices as the agent
    publishes them (a counter slice without devices broke it once)."""
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / "health_latency.py"), "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "worst failure-to-isolation:" in proc.stdout.splitlines()[-1]
