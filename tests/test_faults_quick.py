"""The fault suite's quick run (``benchmarks/faults.py --quick``) as CI runs it: every scenario
of issue 16 in small, and a table whose last line counts the failures, which must be none."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from dra_driver.testing import faultsuite

REPO = Path(__file__).resolve().parents[1]


def test_quick_fault_suite_finds_nothing() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "faults.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    assert lines, done.stderr[-3000:]
    last = re.fullmatch(r"faults: (\d+) trials, (\d+) failures", lines[-1])
    assert last is not None, done.stdout[-3000:]
    assert int(last.group(2)) == 0, done.stdout[-3000:]
    assert done.returncode == 0, done.stdout[-3000:]
    rows = {line.split("  ")[0].strip() for line in lines[2:-1] if not line.startswith("  ")}
    assert len(rows) == 10 and int(last.group(1)) >= 500, done.stdout
    assert lines[0].split()[:3] == ["scenario", "trials", "failures"]


def test_the_table_counts_failures_and_names_them() -> None:
    good = faultsuite.Row("fine", trials=3)
    bad = faultsuite.Row("broken", trials=2)
    bad.fail("trial 1: leaked specs ['x']", leaked=1)
    bad.fail("trial 2: recovery did not finish", hang=1)
    table = faultsuite.render([good, bad]).splitlines()
    assert table[0].split()[:2] == ["scenario", "trials"]
    assert table[3].split()[:7] == ["broken", "2", "2", "1", "0", "0", "1"]
    assert "  broken: trial 2: recovery did not finish" in table
    assert table[-1] == "faults: 5 trials, 2 failures"
