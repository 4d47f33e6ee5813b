"""While a GPU is passed through, NVML's silence about it is no fault: the health tracker
ignores findings about it (no taint), and /metrics says it is on vfio-pci."""

from __future__ import annotations

from pathlib import Path

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


def test_discover_says_a_gpu_on_vfio_is_passed_through(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    from dra_driver.devices import vfiohost
    from dra_driver.testing import fakesysfs

    devices = fake.FakeBackend.from_name("pcie-l4").discover()
    kernel = fakesysfs.FakeKernel(tmp_path, fakesysfs.groups_of(devices))
    with kernel:
        host = vfiohost.VfioHost(tmp_path, wait_s=2)
        bdf = devices.gpus[1].pci_bus_id
        host.unbind(bdf)
        host.set_override(bdf, vfiohost.VFIO)
        host.bind(bdf, vfiohost.VFIO)
    out = subprocess.run(
        [sys.executable, "-m", "dra_driver", "discover", "--fake", "pcie-l4",
         "--vfio-root", str(tmp_path), "-o", "json"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    health = {g["minor"]: g["health"] for g in json.loads(out)["gpus"]}
    assert health[1]["health"] == "PassedThrough" and health[1]["source"] == "sysfs"
    assert health[0]["health"] == "Healthy"
    table = subprocess.run(
        [sys.executable, "-m", "dra_driver", "discover", "--fake", "pcie-l4",
         "--vfio-root", str(tmp_path)],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    assert "PassedThrough" in table
