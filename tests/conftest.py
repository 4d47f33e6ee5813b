"""Fixtures every test package may use (the shared reference data, an in-memory API), the rule
for tests that need ``../shared/reference`` (skipped with one short reason when it is absent, an
error when it is absent under ``CI=true``; see ``tests/refdata.py``), and the end-of-run summary
of skips: one line per reason with its count (``-v`` adds which tests)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import logcheck
import phaselog
import pytest
import refdata
import skipsummary

from dra_driver.testing.fakeapi import memory

REPO_ROOT = refdata.REPO_ROOT
REFERENCE = refdata.REFERENCE
# Fixtures that read the reference folder: a test using one is a fixture test.
REFERENCE_FIXTURES = frozenset({"reference_dir", "cdi_validator"})
_MISSING = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    # Log lines between a test's phases are held for the next phase (tests/phaselog.py).
    config.pluginmanager.register(phaselog.Phases(), "phaselog")
    config.addinivalue_line(
        "markers", "reference: reads ../shared/reference (skipped without it; CI=true requires it)"
    )


def _fixture_tests(items: list[pytest.Item]) -> list[pytest.Item]:
    return [
        item
        for item in items
        if item.get_closest_marker("reference")
        or REFERENCE_FIXTURES & set(getattr(item, "fixturenames", ()))
    ]


# The tests that take tens of seconds each (the demo's scenes, the quick fault suite, the
# SIGKILL loops): run first, so that in parallel workers (`make test`: pytest-xdist) none of them
# starts last and leaves one worker running it alone at the end of the suite.
SLOW_FIRST = (
    "tests/cli/test_demo.py",
    "tests/test_faults_quick.py",
    "tests/driver/test_crash",
    "tests/kubelet/test_crash",
    "tests/kubelet/test_mig_crash",
    "tests/kubelet/test_mps",
    "tests/allocation/test_setfit",
    "tests/allocation/test_single_gpus.py",
)


def _slow_first(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        return next((i for i, p in enumerate(SLOW_FIRST) if item.nodeid.startswith(p)), 99)

    items.sort(key=rank)  # stable: the order within each group is kept


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _slow_first(items)
    if refdata.available():
        return
    needing = _fixture_tests(items)
    if not needing:
        return
    reason = (
        f"fixture tests: ../shared/reference not found at {REFERENCE}"
        f"{' (CI=true requires it)' if refdata.required() else ''}"
    )
    for item in needing:
        item.stash[_MISSING] = reason


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    reason = item.stash.get(_MISSING, None)
    if reason is None:
        return
    if refdata.required():
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)  # one reason for all: the summary below counts them on one line


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    skipped = terminalreporter.stats.get("skipped", [])
    if skipped:
        terminalreporter.write_sep("=", "skipped, by reason")
        for line in skipsummary.lines(skipped, verbose=config.get_verbosity() > 0):
            terminalreporter.write_line(line)


@pytest.fixture(autouse=True)
def _logging_set_up_restored() -> Iterator[None]:
    """A test that runs ``cli.main`` in-process (``logs.configure``: JSON renderer, stdlib
    bridge) leaves structlog and the root logger as it found them (tests/phaselog.py)."""
    saved = phaselog.snapshot()
    yield
    phaselog.restore(saved)


@pytest.fixture(autouse=True)
def _logged_events_are_catalogued() -> Iterator[None]:
    """Every event the code logs during a test is in docs/log-events.md with its level and
    fields (an event's text, level and fields are what operators alert on)."""
    with logcheck.checked() as problems:
        yield
    assert not problems, "log events off the catalogue:\n" + "\n".join(problems)


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    """``../shared/reference``: wire contracts, OpenAPI, CDI schema, recorded API verdicts."""
    return REFERENCE


Obj = dict[str, Any]
SliceFactory = Callable[..., Obj]


@pytest.fixture
def mem() -> memory.InMemoryApi:
    return memory.InMemoryApi()


@pytest.fixture
def make_slice() -> SliceFactory:
    """``make_slice(name, node=, driver=, devices=)``: a valid ResourceSlice dict."""

    def make(
        name: str = "n1-gpu.nvidia.com-0",
        *,
        node: str = "n1",
        driver: str = "gpu.nvidia.com",
        devices: list[str] | None = None,
        generation: int = 1,
    ) -> Obj:
        names = ["gpu-0"] if devices is None else devices
        return copy.deepcopy(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": name},
                "spec": {
                    "driver": driver,
                    "nodeName": node,
                    "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
                    "devices": [
                        {"name": n, "attributes": {"type": {"string": "gpu"}}} for n in names
                    ],
                },
            }
        )

    return make
