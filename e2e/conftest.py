"""e2e suite set-up: one cluster from KUBECONFIG, or every test skipped with the reason.

Run it with e2e/run.sh (kind) or `KUBECONFIG=... pytest e2e` against any cluster where the chart
is installed. Scenarios that need a particular fake profile look for nodes labelled
``dra-driver.example/fake-profile=<profile>`` and skip, saying so, where there is none.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cluster as kube
import pytest

HERE = Path(__file__).resolve().parent
PROFILE_LABEL = kube.PROFILE_LABEL
MODE_LABEL = kube.MODE_LABEL
_state: dict[str, kube.Cluster | str] = {}


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
