"""Every event a test makes the code log must be in ``docs/log-events.md`` with its level and
fields (see ``scripts/log_events.py``): ``tests/conftest.py`` wraps each test in
:func:`checked`. Lines that other libraries log through the stdlib bridge are theirs, not ours,
and are not checked."""

from __future__ import annotations

import logging
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any

import structlog
from scriptload import load_script

log_events = load_script("log_events")
CATALOGUE = log_events.Catalogue(log_events.parse(log_events.PAGE.read_text()))
_active: list[object] = []  # the checks in force, innermost last


def _ours(event_dict: MutableMapping[str, Any]) -> bool:
    """False for records the stdlib bridge re-logs (their logger is a stdlib logger's name)."""
    return event_dict.get("logger") not in logging.root.manager.loggerDict


@contextmanager
def checked() -> Iterator[list[str]]:
    """Collect what breaks the catalogue among the events logged inside (any thread)."""
    problems: list[str] = []

    def capture(
        _logger: object, method: str, event_dict: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        if _active[-1] is capture and _ours(event_dict):  # the innermost check only
            problem = CATALOGUE.problem(method, dict(event_dict))
            if problem is not None and problem not in problems:
                problems.append(problem)
        return event_dict

    processors = structlog.get_config()["processors"]  # the live list every logger reads
    processors.insert(0, capture)
    _active.append(capture)
    try:
        yield problems
    finally:
        _active.remove(capture)
        if capture in processors:
            processors.remove(capture)
