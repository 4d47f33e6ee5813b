"""No log line reaches the terminal between a test's phases, and no test leaves its logging
set-up to the next (tests/phaselog.py): tests/phaselog_probe.py run by a pytest of its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import phaselog_probe

REPO = Path(__file__).resolve().parents[1]


def test_a_line_between_phases_goes_to_the_next_phase_not_the_terminal() -> None:
    plugins_off = ["-p", "no:randomly", "-p", "no:xdist", "-p", "no:cacheprovider"]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", *plugins_off, "tests/phaselog_probe.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "2 passed" in out
    # Once, in the teardown's captured stderr (-rA prints it), with the thread that logged it;
    # a stray line would stand among the progress dots, before the summary.
    assert out.count(phaselog_probe.MARK) == 1, out
    teardown = out.index("Captured stderr teardown")
    assert out.index(phaselog_probe.MARK) > teardown, out
    assert "logged between test phases by thread late-probe" in out[teardown:]
