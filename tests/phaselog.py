"""Log lines of background threads never reach the terminal between a test's phases, and no test
leaves its logging set-up to the next.

Why it exists: pytest captures a test's output only inside its setup, call and teardown phases;
between them (while it writes the phase's report) the real stdout and stderr are back. A thread
a fixture runs (a claim-status writer, a device plugin's registrar or stream) that logs in that
gap wrote straight to the terminal: in ``make test`` that was stray lines among the progress
dots, JSON ones when an earlier test of the same worker had run ``cli.main`` in-process (its
``logs.configure`` set the JSON renderer for the rest of the process). tests/conftest.py
therefore

* marks the phases (:func:`enter` and :func:`leave`, from :class:`Phases`' hook wrappers,
  which run inside pytest's capture):
  outside them :func:`hold` keeps each event instead of rendering it, and the next phase
  writes the held lines into its captured stderr (so a failing test still shows them), with the
  thread that logged them;
* restores structlog's configuration and the root logger's handlers after every test
  (:func:`snapshot`, :func:`restore`), so a test running ``cli.main`` leaves no JSON renderer
  and no stdlib bridge to the tests after it.

tests/test_phaselog.py runs a test whose thread logs in the gap, in a pytest of its own, and
checks that nothing of it reaches that pytest's terminal.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterator, MutableMapping
from typing import Any

import pytest
import structlog

_held: list[str] = []
_lock = threading.Lock()
_state = {"in_phase": False}


def in_phase() -> bool:
    """Whether a test phase runs now (pytest is capturing its output)."""
    return _state["in_phase"]


def hold(
    _logger: object, method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """A structlog processor: outside a phase, the event is kept for the next one."""
    if _state["in_phase"]:
        return event_dict
    line = f"[{method}, logged between test phases by thread {threading.current_thread().name}] "
    with _lock:
        _held.append(line + repr(dict(event_dict)))
    raise structlog.DropEvent


def enter() -> None:
    """A phase starts (capture is on): the lines held since the last one go to its stderr."""
    _state["in_phase"] = True
    with _lock:
        lines, _held[:] = list(_held), []
    for line in lines:
        sys.stderr.write(line + "\n")


def leave() -> None:
    """A phase ends (capture goes off next): events are held from now on, whatever list of
    processors the phase left configured (``logs.configure`` replaces it)."""
    processors = structlog.get_config()["processors"]
    if hold not in processors:
        processors.insert(0, hold)
    _state["in_phase"] = False


def held() -> list[str]:
    with _lock:
        return list(_held)


def snapshot() -> tuple[dict[str, Any], list[logging.Handler], int]:
    """structlog's configuration and the root logger's handlers and level, as they are now."""
    root = logging.getLogger()
    return structlog.get_config(), list(root.handlers), root.level


def restore(saved: tuple[dict[str, Any], list[logging.Handler], int]) -> None:
    config, handlers, level = saved
    structlog.configure(**config)
    root = logging.getLogger()
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    for handler in handlers:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)


def _captured() -> Iterator[None]:
    """One phase's hook wrapper body: capture on from :func:`enter` to :func:`leave`."""
    enter()
    try:
        return (yield)
    finally:
        leave()


class Phases:
    """The plugin marking each phase; its wrappers are the innermost (``trylast``), so capture
    is on from :func:`enter` to :func:`leave`."""

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_setup(self) -> Iterator[None]:
        return (yield from _captured())

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_call(self) -> Iterator[None]:
        return (yield from _captured())

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_teardown(self) -> Iterator[None]:
        return (yield from _captured())
