"""The end-of-run skip summary ``tests/conftest.py`` prints: one line per reason with its count.

Why it exists: pytest's ``-rs`` writes a line per skip location, and the reasons of the fixture
tests once named every skipped test in one line thousands of characters long; a reader wants to
know how many were skipped and why, and ``-v`` for which.
"""

from __future__ import annotations

from typing import Any


def names(nodeids: list[str]) -> str:
    """``file::{test_a,test_b}`` per file, parameters folded: the skipped tests, named."""
    by_file: dict[str, dict[str, None]] = {}
    for nodeid in nodeids:
        file, _, name = nodeid.partition("::")
        by_file.setdefault(file, {})[name.split("[", 1)[0]] = None
    return "; ".join(f"{file}::{{{','.join(tests)}}}" for file, tests in by_file.items())


def lines(skipped: list[Any], *, verbose: bool) -> list[str]:
    """``N skipped: reason`` per distinct reason, most first; with ``verbose`` each reason is
    followed by its tests, per file with parameters folded."""
    by_reason: dict[str, list[str]] = {}
    for report in skipped:
        longrepr = report.longrepr
        text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        by_reason.setdefault(text.removeprefix("Skipped: "), []).append(report.nodeid)
    out = []
    for reason, ids in sorted(by_reason.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        out.append(f"{len(ids)} skipped: {reason}")
        if verbose:
            out.append(f"    {names(ids)}")
    return out
