"""The byte-code check of ``dra_driver.bytecode`` and the agent's warning (issue 46).

With ``PYTHONDONTWRITEBYTECODE`` and no byte-code at the running optimization level, every
import compiles its source in memory at every start (docs/fleet.md: +8.9 MiB per agent at level
2). The check must name exactly the modules without their cached file, and say nothing where
byte-code may still be written; the agent logs its warning only when something is missing.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from dra_driver import bytecode, logs
from dra_driver.cli import kubelet_plugin


def _module(tmp_path: Path, name: str, *, compiled: bool) -> types.ModuleType:
    source = tmp_path / f"{name}.py"
    source.write_text("X = 1\n")
    spec = importlib.util.spec_from_file_location(name, source)
    assert spec is not None and spec.cached is not None
    if compiled:
        Path(spec.cached).parent.mkdir(parents=True, exist_ok=True)
        Path(spec.cached).write_bytes(b"")  # only its existence is checked
    module = importlib.util.module_from_spec(spec)
    return module


def test_the_check_names_the_modules_without_byte_code_at_this_level(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    found = _module(tmp_path, "with_pyc", compiled=True)
    missing = _module(tmp_path, "without_pyc", compiled=False)
    report = bytecode.check([found, missing, sys])  # sys: built in, not checked
    assert report is not None
    assert report.missing == ("without_pyc",) and report.checked == 2
    assert report.level == sys.flags.optimize
    assert "1 of 2 modules" in bytecode.advice(report)


def test_nothing_is_reported_where_byte_code_may_be_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    assert bytecode.check([_module(tmp_path, "fresh", compiled=False)]) is None


def test_the_agent_warns_only_when_byte_code_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    log = logs.get("test")
    for compiled, warned in ((True, False), (False, True)):
        module = _module(tmp_path, f"m_{compiled}", compiled=compiled)
        monkeypatch.setattr(bytecode, "check", lambda m=module: _real_check([m]))
        with capture_logs() as events:
            kubelet_plugin.warn_missing_bytecode(log)
        hits = [e for e in events if "no byte-code" in e["event"]]
        assert bool(hits) is warned
        if warned:
            assert hits[0]["log_level"] == "warning" and hits[0]["missing"] == 1
            assert hits[0]["examples"] == [f"m_{compiled}"]


_real_check = bytecode.check
