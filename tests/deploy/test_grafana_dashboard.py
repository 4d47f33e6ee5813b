"""The Grafana dashboard in deployments/grafana/ graphs only series the node agent serves (a
renamed metric would leave its panel empty without a word), and is a dashboard Grafana can
import: unique panel ids, a Prometheus data source variable, every query on it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import prometheus_client

from dra_driver import metrics
from dra_driver.devices import fake, setcapacity

DASHBOARD = Path(__file__).resolve().parents[2] / "deployments/grafana/dra-driver-capacity.json"


def served() -> set[str]:
    """Names on the agent's /metrics once its capacity gauges are set."""
    m = metrics.new()
    devices = fake.FakeBackend.from_name("dgx-h100").discover()
    m.set_capacity(setcapacity.of(devices, held={"gpu-0"}))
    text = prometheus_client.generate_latest(m.registry).decode()
    return set(re.findall(r"^(dra_driver_\w+)", text, re.MULTILINE))


def queries(dash: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in dash["panels"] for t in p["targets"]]


def test_every_query_names_only_series_the_agent_serves() -> None:
    dash = json.loads(DASHBOARD.read_text())
    names = {n for q in queries(dash) for n in re.findall(r"dra_driver_\w+", q)}
    assert names >= {"dra_driver_placeable_sets", "dra_driver_best_set_links"}
    assert names <= served(), names - served()


def test_the_dashboard_is_importable() -> None:
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) and dash["uid"] == "dra-driver-capacity"
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    sizes = variables["size"]["query"].split(",")
    assert variables["size"]["allValue"] == "|".join(sizes)
    for panel in dash["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}"
        assert all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"])
    assert all(q.count("(") == q.count(")") for q in queries(dash))
