"""The parts of adapting to what the API server keeps: the probe's verdicts held and re-learnt
(a failing first probe assumes all kept, a reconnect probes again), a write answered without
fields, the withdrawal passes, the publisher's reconnect hook, the refusal texts."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import structlog.testing

from dra_driver import metrics
from dra_driver.devices import health, migprofiles
from dra_driver.slices import (
    build,
    compare,
    publisher,
    republish,
    serverfeatures,
    shares,
    taints,
)
from dra_driver.testing.fakeapi import memory

from .conftest import Obj, devices_of

XID79 = health.Condition(kind="xid", value="79", effect="NoExecute", message="XID 79")


@dataclasses.dataclass
class Found:
    device_taints: bool | None = True
    shared_counters: bool | None = True
    consumable_capacity: bool | None = True


class Probe:
    def __init__(self, *answers: Found | Exception) -> None:
        self.answers = list(answers)

    def __call__(self) -> Found:
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_a_failing_first_probe_assumes_all_kept_and_a_reconnect_learns_the_truth() -> None:
    m = metrics.new()
    probe = Probe(RuntimeError("cannot reach the API server"), Found(device_taints=False))
    heard: list[serverfeatures.Kept] = []
    with structlog.testing.capture_logs() as logs:
        found = serverfeatures.ServerFeatures(probe=probe, log=structlog.get_logger(), metrics=m)
        found.subscribe(heard.append)
        assert found.start() == serverfeatures.ALL_KEPT
        assert heard == []
        found.reconnected()
    assert found.kept == serverfeatures.Kept(device_taints=False, probed=True)
    assert heard == [found.kept]
    events = [(x["event"], x.get("reason")) for x in logs]
    assert events == [
        (
            "cannot learn which ResourceSlice fields the API server keeps; "
            "publishing as if it kept them all",
            "start",
        ),
        (serverfeatures.DROPPED_EVENT, "reconnect"),
    ]
    value = m.registry.get_sample_value
    assert value("dra_driver_feature_enabled", {"feature": "deviceTaints"}) == 0
    assert value("dra_driver_feature_enabled", {"feature": "sharedCounters"}) == 1
    assert value("dra_driver_feature_enabled", {"feature": "setRanks"}) == 1


def test_one_line_per_dropped_feature_at_start_and_again_when_kept() -> None:
    probe = Probe(Found(shared_counters=False, consumable_capacity=False), Found())
    with structlog.testing.capture_logs() as logs:
        found = serverfeatures.ServerFeatures(probe=probe, log=structlog.get_logger())
        assert found.start().dropped == ("sharedCounters", "consumableCapacity")
        found.reconnected()
        found.reconnected()  # nothing changed: nothing said
    said = [(x["event"], x["feature"], x["gate"]) for x in logs]
    assert said == [
        (serverfeatures.DROPPED_EVENT, "sharedCounters", "DRAPartitionableDevices"),
        (serverfeatures.DROPPED_EVENT, "consumableCapacity", "DRAConsumableCapacity"),
        (serverfeatures.KEPT_EVENT, "sharedCounters", "DRAPartitionableDevices"),
        (serverfeatures.KEPT_EVENT, "consumableCapacity", "DRAConsumableCapacity"),
    ]
    assert found.probes == 3


def test_not_probed_counts_as_kept() -> None:
    kept = serverfeatures.Kept.of(Found(None, None, None))
    assert kept.dropped == () and kept.probed


def test_writes_answered_without_fields_re_probe_at_most_every_few_seconds() -> None:
    now = [100.0]
    found = serverfeatures.ServerFeatures(
        probe=Probe(Found(device_taints=False)), log=structlog.get_logger(), clock=lambda: now[0]
    )
    found.fields_dropped("s-0", ["devices[0].taints"])
    found.fields_dropped("s-0", ["devices[0].taints"])
    assert found.probes == 1 and found.kept.dropped == ("deviceTaints",)
    now[0] += serverfeatures.DROPPED_RECHECK_S
    found.fields_dropped("s-0", ["devices[0].taints"])
    assert found.probes == 2


def test_dropped_names_the_fields_the_server_left_out_and_ignores_spelling() -> None:
    sent: Obj = {
        "spec": {
            "devices": [
                {"name": "a", "capacity": {"memory": {"value": "1Gi"}}, "taints": [{"key": "k"}]},
                {"name": "b", "allowMultipleAllocations": True},
            ],
            "sharedCounters": [{"name": "c"}],
        }
    }
    stored: Obj = {
        "spec": {
            "devices": [
                {"name": "a", "capacity": {"memory": {"value": "1024Mi"}}},
                {"name": "b"},
            ]
        }
    }
    assert compare.dropped(sent, stored) == [
        "devices[0].taints",
        "devices[1].allowMultipleAllocations",
        "sharedCounters",
    ]
    assert compare.dropped(sent, sent) == []


def test_withdraw_removes_the_unhealthy_gpu_and_its_mig_devices_deterministically() -> None:
    devices = devices_of("a100-mig")
    board = health.HealthBoard()
    board.set_conditions(devices.gpus[0].uuid, [XID79])

    def names(withdraw: bool) -> list[str]:
        slices = build.build(
            devices,
            node_name="n1",
            decorate=taints.decorator(board.snapshot(), "gpu.nvidia.com", withdraw=withdraw),
        ).slices
        return [d["name"] for s in slices for d in s["spec"].get("devices") or ()]

    tainted, withdrawn = names(False), names(True)
    assert withdrawn == names(True)
    gone = set(tainted) - set(withdrawn)
    assert gone and all(n.startswith("gpu-0") for n in gone)
    assert [n for n in tainted if n not in gone] == withdrawn


def test_counters_or_capacity_dropped_later_withdraw_the_devices_using_them() -> None:
    devices = devices_of("h100-mig")
    rebuild = republish.rebuilder(
        devices,
        node_name="n1",
        driver_name="gpu.nvidia.com",
        dynamic_mig=migprofiles.DynamicMig.parse("all"),
        kept=lambda: serverfeatures.Kept(shared_counters=False),
    )
    entries = [d for s in rebuild(republish.Inputs()) for d in s["spec"].get("devices") or ()]
    assert not any(d.get("consumesCounters") for d in entries)
    assert serverfeatures.withdrawer(serverfeatures.ALL_KEPT) is None


class Log:
    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: None


def test_the_publisher_calls_on_reconnect_once_after_an_outage() -> None:
    mem = memory.InMemoryApi()
    mem.put_node("n1", uid="uid-n1")
    reconnects: list[int] = []
    seen = threading.Event()

    def reconnected() -> None:
        reconnects.append(1)
        seen.set()

    pub = publisher.Publisher(
        kube=mem,
        driver_name="gpu.nvidia.com",
        node_name="n1",
        backoff=publisher.Backoff(initial_s=0.01, max_s=0.02),
        log=Log(),
        on_reconnect=lambda: reconnected(),
    )
    pub.set_desired(build.build(devices_of("pcie-l4"), node_name="n1").slices)
    mem.fail_next("list_resource_slices", status=0, times=2, message="connection refused")
    pub.start()
    try:
        assert seen.wait(5.0)
        assert pub.synced.wait(5.0)
    finally:
        pub.stop()
    assert reconnects == [1]


def test_refusals_name_the_flag_and_the_gate() -> None:
    gpus = devices_of("h100-mig").gpus
    kept = serverfeatures.Kept(shared_counters=False, consumable_capacity=False, probed=True)
    said = serverfeatures.refusal(
        kept,
        gpus=gpus,
        dynamic_mig=migprofiles.DynamicMig.parse("H100"),
        shareable=shares.NONE,
        server="https://api:6443",
    )
    assert said.startswith("--dynamic-mig H100 needs shared counters, but the API server")
    assert "https://api:6443" in said and "DRAPartitionableDevices" in said
    said = serverfeatures.refusal(
        kept,
        gpus=gpus,
        dynamic_mig=migprofiles.STATIC,
        shareable=shares.Shareable.parse("all"),
    )
    assert "--shareable all" in said and "DRAConsumableCapacity" in said
    assert not serverfeatures.refusal(
        serverfeatures.ALL_KEPT,
        gpus=gpus,
        dynamic_mig=migprofiles.DynamicMig.parse("all"),
        shareable=shares.Shareable.parse("all"),
    )


@dataclasses.dataclass
class Versioned(Found):
    server_version: str = "v1.36.2"


def test_a_reconnect_reprobes_only_when_the_server_version_changed() -> None:
    """A fleet reconnecting after an API server restart must not send each two dry-run creates
    for nothing: a cheap version check decides."""
    probe = Probe(Versioned(), Versioned(device_taints=False, server_version="v1.37.0"))
    version = ["v1.36.2"]
    asked: list[str] = []

    def server_version() -> str:
        asked.append(version[0])
        return version[0]

    found = serverfeatures.ServerFeatures(
        probe=probe, log=structlog.get_logger(), version=server_version
    )
    found.start()
    found.reconnected()
    found.reconnected()
    assert found.probes == 1 and asked == ["v1.36.2", "v1.36.2"]  # same server: no probe
    version[0] = "v1.37.0"  # upgraded meanwhile
    found.reconnected()
    assert found.probes == 2
    assert found.kept.device_taints is False


def test_without_a_successful_probe_every_reconnect_probes() -> None:
    probe = Probe(RuntimeError("unreachable"), Versioned())
    found = serverfeatures.ServerFeatures(
        probe=probe, log=structlog.get_logger(), version=lambda: "v1.36.2"
    )
    found.start()
    assert found.probes == 0
    found.reconnected()  # the first probe failed: this one must run
    assert found.probes == 1 and found.kept.probed
