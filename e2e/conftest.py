"""e2e suite set-up: one cluster from KUBECONFIG, or every test skipped with the reason.

Run it with e2e/run.sh (kind) or `KUBECONFIG=... pytest e2e` against any cluster where the chart
is installed (docs/e2e.md). Scenarios that need a particular fake profile look for nodes labelled
``dra-driver.example/fake-profile=<profile>`` and skip, saying so, where there is none. The
terminal summary says how long the tests that ran took against the suite's budget.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cluster as kube
import pytest

HERE = Path(__file__).resolve().parent
PROFILE_LABEL = kube.PROFILE_LABEL
MODE_LABEL = kube.MODE_LABEL
BUDGET_S = 600  # the whole suite on a 2-core kind node (docs/e2e.md)
_state: dict[str, kube.Cluster | str] = {}
_started: list[float] = []


def pytest_sessionstart(session: pytest.Session) -> None:
    _started.append(time.monotonic())


def _cluster_or_reason() -> kube.Cluster | str:
    if "cluster" not in _state:
        try:
            _state["cluster"] = kube.connect()
        except kube.Unreachable as exc:
            _state["cluster"] = str(exc)
    return _state["cluster"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    got = _cluster_or_reason()
    if isinstance(got, str):
        skip = pytest.mark.skip(reason=f"e2e needs a cluster: {got}")
        for item in items:
            if HERE in Path(item.fspath).parents:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def cluster() -> kube.Cluster:
    got = _cluster_or_reason()
    assert isinstance(got, kube.Cluster), got
    if not got.slices():
        pytest.fail(
            f"cluster {got.server_version} is reachable but has no ResourceSlices of driver "
            f"{kube.DRIVER}: install the chart first (e2e/kind-up.sh does)"
        )
    return got


@pytest.fixture
def ns(cluster: kube.Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards (with its pods and claims)."""
    short = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower().removeprefix("test_"))[:30]
    yield from cluster.temp_namespace(f"e2e-{short.strip('-')}")


@pytest.fixture(scope="session")
def nodes(cluster: kube.Cluster) -> dict[str, Any]:
    """``{"dra": [names], "device-plugin": [names], "<profile>": name}`` from node labels."""
    found: dict[str, Any] = {"dra": [], "device-plugin": []}
    for node in cluster.core.list_node().items:
        labels = node.metadata.labels or {}
        name = node.metadata.name
        if labels.get(MODE_LABEL) == "device-plugin":
            found["device-plugin"].append(name)
        elif cluster.slices(name):
            found["dra"].append(name)
            if PROFILE_LABEL in labels:
                found[labels[PROFILE_LABEL]] = name
    return found


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """One line with the time taken, when tests ran against a cluster (not all skipped)."""
    ran = [
        r
        for key in ("passed", "failed", "error")
        for r in terminalreporter.stats.get(key, [])
        if getattr(r, "when", "call") == "call"
    ]
    if not ran or not _started:
        return
    took = time.monotonic() - _started[0]
    verdict = "within" if took <= BUDGET_S else "OVER"
    terminalreporter.write_line(
        f"e2e: {len(ran)} tests ran in {took:.0f} s, {verdict} the suite's {BUDGET_S} s budget"
    )
