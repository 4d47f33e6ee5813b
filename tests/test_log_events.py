"""``docs/log-events.md`` matches the source, and the catalogue check that wraps every test
(``tests/conftest.py``) rejects what it must: unknown events, wrong levels, missing or empty
fields, events that are not text."""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path

import logcheck
import pytest
import structlog

from dra_driver import logs

log_events = logcheck.log_events


def test_the_page_matches_the_source() -> None:
    written = log_events.PAGE.read_text()
    scanned = log_events.scan()  # once: it parses every source file
    assert written == log_events.render(scanned), (
        "docs/log-events.md is stale: run python scripts/log_events.py --write"
    )
    assert len(log_events.parse(written)) == len(scanned) > 100


def test_the_scan_reads_literals_choices_f_strings_and_periodic_failures(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "mod.py").write_text(
        textwrap.dedent(
            """
            def f(log, self, what, known):
                log.info("claim prepared", devices=[1], duration_ms=2)
                self._log.exception(f"{what!r} failed unexpectedly")
                self._claim_log(1).warning("a" if known else "b", error="e", **{"x": 1})
                Loop(failed="round failed; will retry")
                print.info("not a logger")
            """
        )
    )
    events = log_events.scan(pkg)
    assert [(e.level, e.text, e.fields) for e in events] == [
        ("error", "round failed; will retry", ()),
        ("error", "{what} failed unexpectedly", ()),
        ("info", "claim prepared", ("devices", "duration_ms")),
        ("warning", "a", ("error",)),
        ("warning", "b", ("error",)),
    ]
    assert log_events.parse(log_events.render(events)) == events


def test_a_log_event_that_is_not_a_literal_stops_the_scan(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text("def f(log, text):\n    log.info(text)\n")
    with pytest.raises(SystemExit, match=r"bad\.py:2: a log event that is not a literal"):
        log_events.scan(tmp_path)


def test_the_catalogue_rejects_what_the_page_does_not_say() -> None:
    catalogue = log_events.Catalogue(
        [
            log_events.Event("info", "claim {operation}d", ("devices",), "x.py"),
            log_events.Event("warning", "gone | away", (), "x.py"),
        ]
    )
    ok = {"event": "claim prepared", "devices": []}
    assert catalogue.problem("info", ok) is None
    assert catalogue.problem("warning", {"event": "gone | away"}) is None
    assert catalogue.problem("info", {"event": "claim prepared"}) == (
        "info event 'claim prepared' lacks its fields (devices): has ['event']"
    )
    assert catalogue.problem("info", {"event": "claim prepared", "devices": None}) == (
        "info event 'claim prepared': fields without a value: devices"
    )
    assert catalogue.problem("error", ok) == (
        "error event 'claim prepared' is not in docs/log-events.md"
    )
    assert catalogue.problem("exception", {"event": "gone | away"}) is not None
    assert catalogue.problem("info", {"event": "CLAIM PREPARED", "devices": []}) is not None
    assert catalogue.problem("info", {"event": "claim preparedXX", "devices": []}) is not None
    assert catalogue.problem("info", {"event": None}) == "a info event that is not text: None"


def test_a_field_marked_nullable_may_be_null_and_the_others_may_not() -> None:
    catalogue = log_events.Catalogue(
        [log_events.Event("info", "stopped", ("daemon", "pid?"), "x.py")]
    )
    assert catalogue.problem("info", {"event": "stopped", "daemon": "d", "pid": None}) is None
    assert catalogue.problem("info", {"event": "stopped", "daemon": None, "pid": 3}) == (
        "info event 'stopped': fields without a value: daemon"
    )
    assert catalogue.problem("info", {"event": "stopped", "daemon": "d"}) is not None  # no pid


def test_the_check_sees_events_of_any_logger_but_not_stdlib_records() -> None:
    logging.getLogger("some.library")  # a stdlib logger: its records are not ours
    before = list(structlog.get_config()["processors"])
    with logcheck.checked() as problems:
        logs.get("anything").info("an event nobody listed")
        logs.get("some.library").info("whatever a library says")
    assert problems == ["info event 'an event nobody listed' is not in docs/log-events.md"]
    assert structlog.get_config()["processors"] == before  # the capture is gone again
