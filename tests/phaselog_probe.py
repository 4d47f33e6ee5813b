"""Run by tests/test_phaselog.py in a pytest of its own (never collected by the suite: the name
does not start with ``test_``): a thread logs after its test's call phase, before the teardown,
when pytest's capture is off; and the next test finds the logging set up as the suite has it,
though the first ran ``logs.configure`` as ``cli.main`` does."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest
import structlog

from dra_driver import logs

MARK = "a line from a thread between the phases"


class _InTheGap:
    """A plugin whose hook runs where pytest writes the call's report, capture off: there it
    runs a thread that logs, and waits for it."""

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" and report.nodeid.endswith("test_a_thread_logs_after_the_call"):
            # Through the stdlib bridge, as grpc's lines come.
            thread = threading.Thread(
                target=lambda: logging.getLogger("probe").warning(MARK), name="late-probe"
            )
            thread.start()
            thread.join(timeout=10)


@pytest.fixture
def in_the_gap(request: pytest.FixtureRequest) -> Iterator[None]:
    logs.configure(level="info", fmt="json")  # what an in-process cli.main leaves
    plugin = _InTheGap()
    request.config.pluginmanager.register(plugin, "phaselog-probe")
    yield
    request.config.pluginmanager.unregister(plugin)


def test_a_thread_logs_after_the_call(in_the_gap: None) -> None:
    pass


def test_the_next_test_has_the_suites_logging() -> None:
    processors = structlog.get_config()["processors"]
    assert not any(isinstance(p, structlog.processors.JSONRenderer) for p in processors)
    assert not any(isinstance(h, logs.StdlibBridge) for h in logging.getLogger().handlers)
