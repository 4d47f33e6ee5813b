"""The Event on a claim whose device vanished: what it says, written once, failures only logged;
the start-up clean-up writes it; which devices a rediscovery took from a claim (a destroyed
static MIG device yes, dynamic MIG's own instance never)."""

from __future__ import annotations

import dataclasses
from typing import Any

import structlog

from dra_driver import logs
from dra_driver.devices import rediscovery
from dra_driver.devices.fake import FakeBackend
from dra_driver.driver import checkpoint, claimevents, claimrecords, claims, inventory, vanished
from dra_driver.testing.fakeapi import memory

from .test_vanished import record

REF = claims.ClaimRef(uid="uid-1", namespace="team", name="on-gpu-3")
LOSS = claimevents.Loss(device="gpu-3", uuids=("GPU-33333333-0000-4000-8000-000000000003",))


def emit(api: Any, losses: list[claimevents.Loss] | None = None) -> bool:
    return claimevents.emit(
        api,
        REF,
        losses or [LOSS],
        driver_name="gpu.nvidia.com",
        node_name="n1",
        action=claimevents.ACTION_RUNTIME,
        log=logs.get("test"),
    )


def test_one_warning_event_regarding_the_claim_naming_device_and_uuid() -> None:
    api = memory.InMemoryApi()  # the server's Event rules: what it stores is valid
    assert emit(api)
    (event,) = api.list_events("team", field_selector="regarding.uid=uid-1")
    assert (event["type"], event["reason"], event["action"]) == (
        "Warning",
        "GpuVanished",
        "Rediscover",
    )
    assert event["regarding"] == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "namespace": "team",
        "name": "on-gpu-3",
        "uid": "uid-1",
    }
    assert (event["reportingController"], event["reportingInstance"]) == ("gpu.nvidia.com", "n1")
    assert "gpu-3" in event["note"] and LOSS.uuids[0] in event["note"]
    assert "not re-prepared" in event["note"]


def test_the_same_loss_is_written_once_another_loss_again() -> None:
    api = memory.InMemoryApi()
    with structlog.testing.capture_logs() as captured:
        assert emit(api) and emit(api)  # the second: 409 AlreadyExists, taken as done
    assert len(api.list_events("team")) == 1
    assert [c["log_level"] for c in captured] == ["debug"]
    other = claimevents.Loss(device="gpu-4", uuids=("GPU-4",))
    assert emit(api, [other])
    assert len(api.list_events("team")) == 2


def test_a_failed_write_is_logged_with_the_claim_and_raises_nothing() -> None:
    api = memory.InMemoryApi()
    api.fail_next("create_events", 403, message="events.events.k8s.io is forbidden")
    with structlog.testing.capture_logs() as captured:
        assert emit(api) is False
        assert emit(object()) is False  # not even a port without create_event breaks it
    assert api.list_events("team") == []
    assert [(c["claim_uid"], c["claim_namespace"], c["claim_name"]) for c in captured] == [
        ("uid-1", "team", "on-gpu-3")
    ] * 2
    assert "forbidden" in captured[0]["error"]
    assert emit(api)  # and the next one is written


def test_a_long_note_is_cut_to_what_the_server_takes() -> None:
    api = memory.InMemoryApi()
    many = [claimevents.Loss(device=f"gpu-{i}", uuids=(f"GPU-{i:036d}",)) for i in range(40)]
    assert emit(api, many)
    (event,) = api.list_events("team")
    assert len(event["note"]) == claimevents.NOTE_LIMIT and event["note"].endswith("...")


def test_a_long_claim_name_still_gives_a_valid_event_name() -> None:
    ref = dataclasses.replace(REF, name="a" * 199 + "-" + "b" * 50)
    name = claimevents.event_name(ref, [LOSS])
    assert len(name) <= 253 and "-." not in name
    assert name == claimevents.event_name(ref, [LOSS])
    assert name != claimevents.event_name(dataclasses.replace(ref, uid="uid-2"), [LOSS])


def test_emit_soon_writes_in_its_own_thread() -> None:
    api = memory.InMemoryApi()
    assert (
        claimevents.emit_soon(
            api, [], driver_name="d", node_name="n", action="a", log=logs.get("t")
        )
        is None
    )
    thread = claimevents.emit_soon(
        api,
        [(REF, [LOSS])],
        driver_name="gpu.nvidia.com",
        node_name="n1",
        action=claimevents.ACTION_RUNTIME,
        log=logs.get("test"),
    )
    assert thread is not None
    thread.join(10)
    assert len(api.list_events("team", field_selector="regarding.uid=uid-1")) == 1


# ---- at start-up ------------------------------------------------------------------------------


@dataclasses.dataclass
class Store:
    kept: list[checkpoint.ClaimRecord]

    def records(self) -> list[checkpoint.ClaimRecord]:
        return list(self.kept)


@dataclasses.dataclass
class State:
    store: Store
    devices: inventory.Inventory
    log: Any = dataclasses.field(default_factory=lambda: logs.get("test"))
    rolled_back: list[str] = dataclasses.field(default_factory=list)

    def rollback(self, ref: claims.ClaimRef) -> list[str]:
        self.rolled_back.append(ref.uid)
        return []


def test_clean_at_start_writes_one_event_per_claim_whose_gpu_is_gone() -> None:
    backend = FakeBackend.from_name("pcie-l4")
    before = backend.discover()
    gone = backend.nvml.remove_gpu(1)
    devices = inventory.build(backend.discover(), mig_minors=None)
    state = State(
        Store([record("kept", "gpu-0", before.gpus[0].uuid), record("removed", "gpu-1", gone)]),
        devices,
    )
    api = memory.InMemoryApi()
    done = vanished.clean_at_start(state, api=api, driver_name="gpu.nvidia.com", node_name="n1")
    assert [r.uid for r in done] == state.rolled_back == ["removed"]
    (event,) = api.list_events("team")
    assert event["regarding"]["uid"] == "removed" and event["action"] == claimevents.ACTION_START
    assert event["reason"] == "GpuVanished" and event["type"] == "Warning"
    assert "gpu-1" in event["note"] and gone in event["note"]
    # Again (the same records: a rollback that could not finish): still one Event.
    vanished.clean_at_start(state, api=api, driver_name="gpu.nvidia.com", node_name="n1")
    assert len(api.list_events("team")) == 1


def test_clean_at_start_goes_on_when_the_event_cannot_be_written() -> None:
    backend = FakeBackend.from_name("pcie-l4")
    gone = [backend.nvml.remove_gpu(1), backend.nvml.remove_gpu(1)]
    devices = inventory.build(backend.discover(), mig_minors=None)
    state = State(Store([record("a", "gpu-1", gone[0]), record("b", "gpu-2", gone[1])]), devices)
    api = memory.InMemoryApi()
    api.fail_next("create_events", 500)
    with structlog.testing.capture_logs() as captured:
        done = vanished.clean_at_start(state, api=api, driver_name="gpu.nvidia.com", node_name="n1")
    assert [r.uid for r in done] == ["a", "b"]  # both cleaned up
    assert [e["regarding"]["uid"] for e in api.list_events("team")] == ["b"]
    failed = [c for c in captured if c["event"].startswith("cannot write the Event")]
    assert [c["claim_uid"] for c in failed] == ["a"]


# ---- at run time: what a rediscovery took from a claim ----------------------------------------


def mig_record(device: str, uuid: str, *, dynamic: bool = False) -> checkpoint.ClaimRecord:
    base = record("mig", device, uuid)
    mig = claimrecords.MigRecord(
        parentUUID="GPU-x", profile="3g.20gb", profileId=9, placementStart=4, placementSize=4
    )
    dev = dataclasses.replace(base.devices[0], mig=mig if dynamic else None)
    return dataclasses.replace(base, devices=(dev,))


def test_a_destroyed_static_mig_device_is_a_loss_dynamic_migs_own_never() -> None:
    backend = FakeBackend.from_name("a100-mig")
    found = backend.discover()
    before = inventory.build(found, mig_minors=None)
    held = before.devices["gpu-0-mig-3g-20gb-4"]
    destroyed = backend.nvml.destroy_mig(0, 4)
    assert destroyed == [held.uuid]
    changes = rediscovery.compare(found, backend.discover())
    assert [m.uuid for m in changes.mig_destroyed] == [held.uuid]
    assert changes.vanished == () and changes.any
    (loss,) = vanished.losses(mig_record(held.name, held.uuid), before, changes)
    assert loss == claimevents.Loss(device=held.name, uuids=(held.uuid,), mig=True)
    assert vanished.losses(mig_record(held.name, held.uuid, dynamic=True), before, changes) == []
    other = before.devices["gpu-0-mig-2g-10gb-0"]
    assert vanished.losses(mig_record(other.name, other.uuid), before, changes) == []


def test_a_vanished_gpu_is_the_loss_of_its_mig_devices_too() -> None:
    backend = FakeBackend.from_name("a100-mig")
    found = backend.discover()
    before = inventory.build(found, mig_minors=None)
    held = before.devices["gpu-1-mig-7g-40gb-0"]
    parent = backend.nvml.remove_gpu(1)
    changes = rediscovery.compare(found, backend.discover())
    assert changes.mig_destroyed == ()  # the GPU is gone, not its MIG devices alone
    (loss,) = vanished.losses(mig_record(held.name, held.uuid), before, changes)
    assert loss == claimevents.Loss(device=held.name, uuids=(parent,), mig=False)


def test_clean_at_start_names_a_static_mig_device_destroyed_while_the_agent_was_down() -> None:
    backend = FakeBackend.from_name("a100-mig")
    held = inventory.build(backend.discover(), mig_minors=None).devices["gpu-0-mig-3g-20gb-4"]
    backend.nvml.destroy_mig(0, 4)
    devices = inventory.build(backend.discover(), mig_minors=None)
    state = State(Store([mig_record(held.name, held.uuid)]), devices)
    api = memory.InMemoryApi()
    vanished.clean_at_start(state, api=api, driver_name="gpu.nvidia.com", node_name="n1")
    (event,) = api.list_events("team")
    assert f"MIG device {held.name} ({held.uuid}) was destroyed" in event["note"]
