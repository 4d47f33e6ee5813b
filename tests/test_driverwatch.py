"""The driver watch, turn by turn (``step``) over the fake NVML: outage, return, rescans."""

from __future__ import annotations

from typing import Any

import prometheus_client as prom
import pytest

from dra_driver import driverwatch, logs
from dra_driver.devices import health, model, rediscovery
from dra_driver.devices.fake import FakeBackend


class Rig:
    def __init__(self, profile: str = "dgx-h100") -> None:
        self.backend = FakeBackend.from_name(profile)
        self.board = health.HealthBoard()
        self.calls: list[tuple[str, Any]] = []
        self.registry = prom.CollectorRegistry()
        self.watch = driverwatch.DriverWatch(
            api=self.backend.nvml,
            discover=self.backend.discover,
            devices=self.backend.discover(),
            board=self.board,
            log=logs.get("test"),
            on_devices=self.devices_changed,
            on_outage=lambda outage: self.calls.append(("outage", outage.gone)),
            metrics=driverwatch.Metrics(self.registry),
            rescan_s=3600,
        )
        self.watch.start()

    def devices_changed(
        self, devices: model.NodeDevices, changes: rediscovery.Changes, now: bool
    ) -> None:
        # What a republish would see at this moment: the outage's taint still on.
        marked = driverwatch.marked(self.board, [g.uuid for g in devices.gpus])
        self.calls.append(("devices", (changes, now, len(marked))))

    def value(self, name: str, **labels: str) -> float:
        got = self.registry.get_sample_value(name, labels)
        assert got is not None
        return got


@pytest.fixture
def rig() -> Any:
    r = Rig()
    yield r
    r.watch.stop()


def test_outage_marks_every_gpu_in_one_board_change_and_never_noexecute(rig: Rig) -> None:
    version = rig.board.snapshot().version
    rig.backend.nvml.unload("mismatch")
    rig.watch.step()
    snap = rig.board.snapshot()
    assert snap.version == version + 1
    assert len(snap.conditions) == 8
    for conditions in snap.conditions.values():
        (condition,) = conditions
        assert (condition.kind, condition.value, condition.effect) == (
            "driver-unavailable",
            "version-mismatch",
            "NoSchedule",
        )
        assert driverwatch.DRIVER_GONE_MESSAGE in condition.message
    assert rig.watch.outage.gone and not rig.watch.available()
    assert rig.calls == [("outage", True)]
    assert rig.value("dra_driver_nvidia_driver_available") == 0
    assert rig.value("dra_driver_nvidia_driver_outages_total", reason="version-mismatch") == 1


def test_health_conditions_survive_the_outage_marks(rig: Rig) -> None:
    uuid = rig.watch.devices.gpus[0].uuid
    xid = health.Condition(kind="xid", value="79", effect="NoExecute", message="XID 79")
    rig.board.set_conditions(uuid, [xid])
    rig.backend.nvml.unload()
    rig.watch.step()
    assert [c.kind for c in rig.board.snapshot().conditions[uuid]] == ["xid", "driver-unavailable"]
    rig.backend.nvml.load()
    rig.watch.step()
    assert rig.board.snapshot().conditions[uuid] == (xid,)


def test_return_with_a_new_version_hands_devices_over_before_unmarking(rig: Rig) -> None:
    rig.backend.nvml.unload()
    rig.watch.step()
    rig.watch.step()  # still away: nvmlInit refused, backoff grows
    assert rig.watch._delay > 0.2
    rig.backend.nvml.load(driver_version="590.10.01")
    rig.watch.step()
    (_, (changes, now, marked_then)) = rig.calls[-2]
    assert changes.driver_version == ("580.95.05", "590.10.01")
    assert not now and marked_then == 8  # the taints go in the same republish
    assert rig.calls[-1] == ("outage", False)
    assert rig.board.snapshot().conditions == {}
    assert {g.driver_version for g in rig.watch.devices.gpus} == {"590.10.01"}
    assert rig.value("dra_driver_nvidia_driver_available") == 1


def test_return_with_nothing_changed_hands_nothing_over(rig: Rig) -> None:
    rig.backend.nvml.unload("uninitialized")
    rig.watch.step()
    rig.backend.nvml.load()
    rig.watch.step()
    assert rig.calls == [("outage", True), ("outage", False)]
    assert rig.value("dra_driver_rediscoveries_total", result="unchanged") == 1


def test_a_changed_gpu_count_rediscovers_and_republishes_at_once(rig: Rig) -> None:
    gone = rig.backend.nvml.remove_gpu(5)
    rig.watch.step()
    (_, (changes, now, _)) = rig.calls[-1]
    assert [g.uuid for g in changes.vanished] == [gone] and now
    assert len(rig.watch.devices.gpus) == 7
    rig.watch.step()  # nothing new: nothing handed over
    assert len(rig.calls) == 1


def test_a_failing_handler_is_retried_at_the_next_turn(rig: Rig) -> None:
    failures = [RuntimeError("boom")]

    def flaky(devices: model.NodeDevices, changes: rediscovery.Changes, now: bool) -> None:
        if failures:
            raise failures.pop()
        rig.calls.append(("devices", changes))

    rig.watch._on_devices = flaky
    rig.backend.nvml.add_gpu()
    rig.watch.step()
    assert rig.calls == [] and len(rig.watch.devices.gpus) == 8
    rig.watch.step()
    assert len(rig.calls) == 1 and len(rig.watch.devices.gpus) == 9


def test_errors_that_are_not_the_driver_do_not_start_an_outage() -> None:
    assert driverwatch.driver_gone(ValueError()) is None
    from dra_driver.devices import nvml

    assert driverwatch.driver_gone(nvml.NVMLError_NotSupported()) is None
    assert driverwatch.driver_gone(nvml.NVMLError_GpuIsLost()) == "gpu-lost"
