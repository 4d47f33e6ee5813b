"""The end-of-run skip summary (``tests/skipsummary.py``, printed by ``tests/conftest.py``): one
line per reason with its count, most first, and with ``-v`` the tests behind each reason, per
file with parameters folded."""

from __future__ import annotations

from types import SimpleNamespace

import skipsummary


def report(nodeid: str, reason: str) -> SimpleNamespace:
    return SimpleNamespace(nodeid=nodeid, longrepr=("conftest.py", 71, f"Skipped: {reason}"))


SKIPPED = [
    report("tests/a/test_x.py::test_one[p1]", "fixture tests: ../shared/reference not found"),
    report("tests/a/test_x.py::test_one[p2]", "fixture tests: ../shared/reference not found"),
    report("tests/b/test_y.py::test_two", "fixture tests: ../shared/reference not found"),
    report("tests/driver/test_podman.py::test_run", "podman not installed"),
]


def test_one_line_per_reason_with_its_count_most_first() -> None:
    assert skipsummary.lines(SKIPPED, verbose=False) == [
        "3 skipped: fixture tests: ../shared/reference not found",
        "1 skipped: podman not installed",
    ]


def test_verbose_names_the_tests_per_file_with_parameters_folded() -> None:
    lines = skipsummary.lines(SKIPPED, verbose=True)
    assert lines[1] == "    tests/a/test_x.py::{test_one}; tests/b/test_y.py::{test_two}"
    assert lines[3] == "    tests/driver/test_podman.py::{test_run}"
