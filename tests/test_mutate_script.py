"""``scripts/mutate.py`` (``make mutate``) is not run by the suite, but the parts that turn
mutmut's results into the documented score are: a wrong interval or a stale file's results
counted would misreport the score."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from scriptload import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "mutate.py"


@pytest.fixture(scope="module")
def mutate() -> ModuleType:
    return load_script("mutate")


def test_the_wilson_interval_matches_hand_computed_values(mutate: ModuleType) -> None:
    low, high = mutate.wilson(90, 100)
    assert (round(low, 4), round(high, 4)) == (0.8256, 0.9448)
    assert mutate.wilson(0, 0) == (0.0, 1.0)
    assert mutate.wilson(10, 10)[1] == 1.0
    assert round(mutate.wilson(10, 10)[0], 4) == 0.7225


def test_the_score_line_counts_killed_over_judged(mutate: ModuleType) -> None:
    line = mutate.score_line("slices", {"killed": 9, "survived": 1, "total": 12, "timeout": 2})
    assert "killed     9" in line and "survived    1" in line
    assert "score  90.0%" in line
    assert "(95% 59.6-98.2%)" in line
    assert "other {'timeout': 2}" in line
    # a mutant no test reaches counts against the score, like a survivor
    unreached = mutate.score_line("driver", {"killed": 9, "survived": 0, "no_tests": 1})
    assert "survived    1" in unreached and "score  90.0%" in unreached


def test_results_count_only_the_groups_files_and_drop_stale_ones(
    mutate: ModuleType, tmp_path: Path
) -> None:
    pkg = tmp_path / "mutants" / "dra_driver" / "deviceplugin"
    pkg.mkdir(parents=True)
    (pkg / "service.py.meta").write_text(
        json.dumps({"exit_code_by_key": {"svc_1": 0, "svc_2": 1, "svc_3": None}})
    )
    stale = pkg / "kubeletsim.py.meta"
    stale.write_text(json.dumps({"exit_code_by_key": {"sim_1": 0}}))
    assert mutate.results(tmp_path, "deviceplugin") == {"svc_1": 0, "svc_2": 1, "svc_3": None}
    assert not stale.exists()


def test_every_group_names_files_and_tests_that_exist(mutate: ModuleType) -> None:
    repo = SCRIPT.parents[1]
    for name, (files, tests) in mutate.GROUPS.items():
        for pattern in files:
            assert list(repo.glob(pattern)), f"{name}: {pattern} matches nothing"
        for test in tests:
            assert (repo / test).exists(), f"{name}: {test} does not exist"
    for extra in mutate.SUPPORT:  # copied into each workspace: the tests read them
        assert (repo / extra).exists(), extra
    logcheck = (repo / "tests" / "logcheck.py").read_text()
    assert "log_events.py" in logcheck and "log_events.PAGE" in logcheck


def test_the_workspace_plugin_ends_and_reaps_what_a_test_session_leaves_behind(
    mutate: ModuleType, tmp_path: Path
) -> None:
    """mutmut waits for any child: a leftover one crashed a driver run (KeyError in its runner)."""
    (tmp_path / "mutate_reaper.py").write_text(mutate.REAPER)
    pidfile = tmp_path / "pid"
    (tmp_path / "test_leaves.py").write_text(
        "import subprocess, pathlib\n"
        "def test_leaves_a_child():\n"
        "    p = subprocess.Popen(['sleep', '60'])\n"
        f"    pathlib.Path({str(pidfile)!r}).write_text(str(p.pid))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "mutate_reaper", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not Path(f"/proc/{pidfile.read_text()}").exists()  # killed and reaped, not orphaned
