"""While a GPU is passed through, NVML's silence about it is no fault: the health tracker
ignores findings about it (no taint), and /metrics says it is on vfio-pci."""

from __future__ import annotations

import prometheus_client
import structlog

from dra_driver.devices import fake, health, healthpolicy, healthtracker, passedthrough, passthrough

LOST = healthpolicy.Finding(
    condition=health.Condition(kind="gpu-lost", value="lost", effect="NoExecute", message="gone")
)


def test_findings_about_a_passed_through_gpu_are_ignored_and_others_are_not() -> None:
    now: set[str] = {"GPU-a"}
    passed = passedthrough.PassedThrough(lambda: now)
    board = health.HealthBoard()
    tracker = healthtracker.Tracker(
        board=board,
        policy=healthpolicy.HealthPolicy(),
        names={"GPU-a": "gpu-0", "GPU-b": "gpu-1"},
        log=structlog.get_logger(),
        paused=passed.contains,
    )
    tracker.update("GPU-a", found=[LOST])
    assert board.snapshot().conditions.get("GPU-a") in (None, ())
    tracker.update("GPU-b", found=[LOST])
    assert board.snapshot().conditions["GPU-b"]
    now.clear()  # back on nvidia: watched again
    tracker.update("GPU-a", found=[LOST])
    assert board.snapshot().conditions["GPU-a"]


def test_metrics_say_which_gpus_are_passed_through() -> None:
    devices = passthrough.mark(
        fake.FakeBackend.from_name("pcie-l4").discover(), passthrough.Passthrough.parse("all")
    )
    now = {devices.gpus[1].uuid}
    registry = prometheus_client.CollectorRegistry()
    passedthrough.export(registry, passedthrough.PassedThrough(lambda: now), devices)
    value = registry.get_sample_value
    assert value(passedthrough.METRIC, {"device": "gpu-1", "uuid": devices.gpus[1].uuid}) == 1
    assert value(passedthrough.METRIC, {"device": "gpu-0", "uuid": devices.gpus[0].uuid}) == 0
    now.clear()
    assert value(passedthrough.METRIC, {"device": "gpu-1", "uuid": devices.gpus[1].uuid}) == 0
    empty = prometheus_client.CollectorRegistry()
    plain = fake.FakeBackend.from_name("pcie-l4").discover()
    passedthrough.export(empty, passedthrough.NOBODY, plain)
    assert value.__self__ is registry and list(empty.collect()) == []
