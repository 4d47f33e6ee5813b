"""Dynamic MIG in the plugin core: prepare creates the instance at the allocated placement,
unprepare destroys it, recovery keeps owned instances and destroys orphans, conflicts and busy
GPUs are per-claim errors. The GPUs are the NVML stand-in's, whose MIG state lives in a file
(as on a card, it outlives the plugin), read back here to see what really exists."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import pytest
import structlog

from dra_driver import logs
from dra_driver.devices import fake, migcontrol, migprofiles, nvml
from dra_driver.devices.fake import migstate
from dra_driver.driver import checkpoint, claims, inventory, mig

from .conftest import Node, claim_obj, new_uid

PROFILE = "h100-mig"
GPU0 = fake.FakeBackend.from_name(PROFILE).discover().gpus[0]
GPU1 = fake.FakeBackend.from_name(PROFILE).discover().gpus[1]


@pytest.fixture
def mig_node(node_factory: Callable[..., Node]) -> Node:
    return node_factory(PROFILE, dynamic_mig="all")


def state(node: Node) -> dict[str, migstate.GpuMig]:
    """The stand-in's MIG state as the card would report it now."""
    return migstate.MigState({}, state_file=node.settings.fake_mig_state).read()


def layout(node: Node, gpu: str = GPU0.uuid) -> list[tuple[str, int]]:
    return sorted((i.name, i.start) for i in state(node)[gpu].instances)


def mode(node: Node, gpu: str = GPU0.uuid) -> int:
    return state(node)[gpu].mode


def prepare(node: Node, *devices: str, name: str = "c") -> tuple[Any, str]:
    ref = node.add(claim_obj(name=name, uid=new_uid(), devices=list(devices)))
    return ref, node.driver.prepare([ref])[ref.uid].error


def record(node: Node, uid: str) -> dict[str, Any]:
    return json.loads((node.claims_dir / f"{uid}.json").read_text())


def test_prepare_creates_the_instance_and_unprepare_destroys_it(mig_node: Node) -> None:
    assert mode(mig_node) == nvml.NVML_DEVICE_MIG_DISABLE
    ref, error = prepare(mig_node, "gpu-0-mig-3g-40gb-4")
    assert error == ""
    assert mode(mig_node) == nvml.NVML_DEVICE_MIG_ENABLE  # switched on for the first instance
    [inst] = state(mig_node)[GPU0.uuid].instances
    assert (inst.name, inst.start, inst.size) == ("3g.40gb", 4, 4)
    [ci] = inst.computeInstances
    spec = json.loads((mig_node.cdi_root / f"k8s.gpu.nvidia.com-claim_{ref.uid}.json").read_text())
    assert f"NVIDIA_VISIBLE_DEVICES={ci.uuid}" in spec["containerEdits"]["env"]
    nodes = [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]]
    assert nodes[0] == "/dev/nvidia0" and all(
        n.startswith("/dev/nvidia-caps/nvidia-cap") for n in nodes[1:]
    )
    assert len(nodes) == 3
    [dev] = record(mig_node, ref.uid)["devices"]
    assert dev["mig"] == {
        "parentUUID": GPU0.uuid, "profile": "3g.40gb", "profileId": 9, "placementStart": 4,
        "placementSize": 4, "gpuInstanceId": inst.id, "computeInstanceId": ci.id,
        "uuid": ci.uuid,
    }  # fmt: skip
    assert mig_node.driver.unprepare([ref]) == {ref.uid: ""}
    assert layout(mig_node) == []
    assert mig_node.spec_files() == []


def test_a_full_gpu_handed_out_as_three_claims_one_after_the_other(mig_node: Node) -> None:
    refs = []
    for device in ("gpu-0-mig-1g-10gb-0", "gpu-0-mig-2g-20gb-2", "gpu-0-mig-3g-40gb-4"):
        ref, error = prepare(mig_node, device, name=device)
        assert error == ""
        refs.append(ref)
    assert layout(mig_node) == [("1g.10gb", 0), ("2g.20gb", 2), ("3g.40gb", 4)]
    uuids = {ci.uuid for i in state(mig_node)[GPU0.uuid].instances for ci in i.computeInstances}
    assert len(uuids) == 3
    for ref in refs:
        assert mig_node.driver.unprepare([ref]) == {ref.uid: ""}
    assert layout(mig_node) == []


def test_overlapping_placements_and_the_full_gpu_are_refused_per_claim(mig_node: Node) -> None:
    first, error = prepare(mig_node, "gpu-0-mig-3g-40gb-4", name="first")
    assert error == ""
    overlap = mig_node.add(
        claim_obj(name="overlap", uid=new_uid(), devices=["gpu-0-mig-1g-10gb-5"])
    )
    whole = mig_node.add(claim_obj(name="whole", uid=new_uid(), devices=["gpu-0"]))
    fine = mig_node.add(claim_obj(name="fine", uid=new_uid(), devices=["gpu-0-mig-1g-10gb-0"]))
    results = mig_node.driver.prepare([overlap, whole, fine])
    assert "gpu-0 memory slice 5 is already prepared for claim uid " + first.uid in (
        results[overlap.uid].error
    )
    # The three are prepared in parallel: the full GPU clashes with first (slices 4-7) and,
    # when fine got there before it, with fine (slice 0); either is named.
    whole_error = results[whole.uid].error
    assert "memory slice" in whole_error
    assert first.uid in whole_error or fine.uid in whole_error
    assert results[fine.uid].error == ""
    assert layout(mig_node) == [("1g.10gb", 0), ("3g.40gb", 4)]


def test_the_full_gpu_of_a_gpu_in_mig_mode_gets_mig_mode_switched_off(mig_node: Node) -> None:
    assert mode(mig_node, GPU1.uuid) == nvml.NVML_DEVICE_MIG_ENABLE
    ref, error = prepare(mig_node, "gpu-1")
    assert error == ""
    assert mode(mig_node, GPU1.uuid) == nvml.NVML_DEVICE_MIG_DISABLE
    _, error = prepare(mig_node, "gpu-1-mig-1g-10gb-0", name="other")
    assert "memory slice 0 is already prepared for claim uid " + ref.uid in error
    assert mig_node.driver.unprepare([ref]) == {ref.uid: ""}
    _, error = prepare(mig_node, "gpu-1-mig-1g-10gb-0", name="later")
    assert error == ""
    assert mode(mig_node, GPU1.uuid) == nvml.NVML_DEVICE_MIG_ENABLE


def test_a_gpu_busy_with_a_process_is_refused_per_claim(mig_node: Node) -> None:
    stand_in = migstate.MigState({}, state_file=mig_node.settings.fake_mig_state)
    mig_node.driver.close()
    mig_node.restart()  # the state file exists from now on
    stand_in.add_process(GPU0.uuid, 4242)
    busy = mig_node.add(claim_obj(name="busy", uid=new_uid(), devices=["gpu-0-mig-1g-10gb-0"]))
    other = mig_node.add(claim_obj(name="other", uid=new_uid(), devices=["gpu-1-mig-1g-10gb-0"]))
    results = mig_node.driver.prepare([busy, other])
    error = results[busy.uid].error
    assert error.startswith(f"ResourceClaim default/busy (uid {busy.uid}): device gpu-0-mig-1g")
    assert "cannot enable MIG mode: the GPU is busy with 1 process(es) (pid 4242)" in error
    assert results[other.uid].error == ""
    assert mode(mig_node) == nvml.NVML_DEVICE_MIG_DISABLE and layout(mig_node) == []
    assert not (mig_node.claims_dir / f"{busy.uid}.json").exists()
    stand_in.end_process(GPU0.uuid, 4242)
    assert mig_node.driver.prepare([busy])[busy.uid].error == ""


def test_unprepare_of_an_instance_in_use_fails_and_keeps_the_record(mig_node: Node) -> None:
    ref, error = prepare(mig_node, "gpu-0-mig-2g-20gb-2")
    assert error == ""
    [inst] = state(mig_node)[GPU0.uuid].instances
    stand_in = migstate.MigState({}, state_file=mig_node.settings.fake_mig_state)
    stand_in.add_process(GPU0.uuid, 77, gpu_instance=inst.id)
    error = mig_node.driver.unprepare([ref])[ref.uid]
    assert "cannot destroy its MIG instances" in error and "in use" in error
    assert (mig_node.claims_dir / f"{ref.uid}.json").exists()
    stand_in.end_process(GPU0.uuid, 77)
    assert mig_node.driver.unprepare([ref]) == {ref.uid: ""}
    assert layout(mig_node) == []


def test_recovery_keeps_owned_instances_and_destroys_orphans(mig_node: Node) -> None:
    kept, error = prepare(mig_node, "gpu-0-mig-3g-40gb-0")
    assert error == ""
    # An instance nobody recorded (a crash between NVML's create and the checkpoint, or one an
    # operator made by hand on a GPU given to dynamic MIG).
    backend = fake.FakeBackend.from_name(PROFILE)
    backend.nvml.mig_state.use_file(mig_node.settings.fake_mig_state)
    control = migcontrol.NvmlMigControl(nvml_api=backend.nvml)
    profile = next(p for p in GPU0.mig_profiles if p.name == "1g.10gb")
    control.create(
        migcontrol.Placement(GPU0.uuid, "1g.10gb", profile.id, profile.slot, start=6, size=1)
    )
    assert layout(mig_node) == [("1g.10gb", 6), ("3g.40gb", 0)]
    with structlog.testing.capture_logs() as logged:
        mig_node.restart()
    assert layout(mig_node) == [("3g.40gb", 0)]
    [destroyed] = [e for e in logged if e["event"] == "destroyed MIG instance"]
    assert destroyed["reason"] == "no prepared claim owns it"
    assert (destroyed["gpu_uuid"], destroyed["placement_start"]) == (GPU0.uuid, 6)
    assert mig_node.driver.prepare([kept])[kept.uid].error == ""  # answered from the checkpoint
    assert mig_node.driver.unprepare([kept]) == {kept.uid: ""}
    assert layout(mig_node) == []


def test_an_interrupted_preparation_is_rolled_back_with_its_instance(mig_node: Node) -> None:
    ref, error = prepare(mig_node, "gpu-0-mig-4g-40gb-0")
    assert error == ""
    path = mig_node.claims_dir / f"{ref.uid}.json"
    data = json.loads(path.read_text())
    data["state"] = checkpoint.PREPARE_STARTED  # as if killed before the commit
    path.write_text(json.dumps(data))
    mig_node.restart()
    assert layout(mig_node) == []
    assert not path.exists() and mig_node.spec_files() == []


def test_admin_access_to_a_placement_is_a_clear_error(mig_node: Node) -> None:
    results = [
        {
            "request": "gpu",
            "driver": "gpu.nvidia.com",
            "pool": "n1",
            "device": "gpu-0-mig-1g-10gb-0",
            "adminAccess": True,
        }
    ]
    ref = mig_node.add(claim_obj(name="admin", uid=new_uid(), results=results))
    error = mig_node.driver.prepare([ref])[ref.uid].error
    assert error == (
        f"{ref}: device gpu-0-mig-1g-10gb-0 is a dynamic MIG placement; adminAccess to a MIG "
        "instance another claim creates is not supported"
    )
    assert layout(mig_node) == []


def test_without_dynamic_mig_no_gpu_is_touched(node_factory: Callable[..., Node]) -> None:
    node = node_factory(PROFILE)
    _, error = prepare(node, "gpu-0-mig-1g-10gb-0")
    assert "is not a device of this node" in error
    _, error = prepare(node, "gpu-1", name="whole")
    assert error == ""
    assert not node.settings.fake_mig_state.exists()


def test_the_health_stream_lists_every_placement_under_its_gpu() -> None:
    from dra_driver.devices import health, migprofiles

    devices = fake.FakeBackend.from_name("a100-mig").discover()  # GPU 0 has static instances
    keys = migprofiles.health_keys(
        devices, migprofiles.DynamicMig.parse("all"), health.device_keys(devices)
    )
    gpu0 = devices.gpus[0]
    assert len(keys) == 2 * (1 + 7 + 7 + 4 + 3 + 2 + 1 + 1)
    assert keys["gpu-0-mig-3g-20gb-4"] == (gpu0.uuid,)  # no longer the static instance's UUID
    assert keys["gpu-0"] == (gpu0.uuid,)


def test_a_gpu_set_with_a_dynamic_gpu_excludes_its_mig_devices(
    node_factory: Callable[..., Node],
) -> None:
    node = node_factory("dgx-h100", dynamic_mig="all")  # eight MIG-capable H100s, MIG off
    mig, error = prepare(node, "gpu-0-mig-1g-10gb-0", name="mig")
    assert error == ""
    _, error = prepare(node, "gpus-0-1", name="pair")
    assert "gpu-0 memory slice 0 is already prepared for claim uid " + mig.uid in error
    assert node.driver.unprepare([mig]) == {mig.uid: ""}
    pair, error = prepare(node, "gpus-0-1", name="pair-again")
    assert error == ""
    gpu0 = fake.FakeBackend.from_name("dgx-h100").discover().gpus[0]
    assert state(node)[gpu0.uuid].mode == nvml.NVML_DEVICE_MIG_DISABLE  # the set took it whole
    _, error = prepare(node, "gpu-1-mig-3g-40gb-4", name="late")
    assert "gpu-1 memory slice 4 is already prepared for claim uid " + pair.uid in error


def test_a_whole_dynamic_gpu_covers_its_own_memory_slices_only() -> None:
    # One GPU only: no other GPU's placements could stand in for its own.
    one = dataclasses.replace(fake.FakeBackend.from_name(PROFILE).discover(), gpus=[GPU0])
    inv = inventory.build(one, mig_minors=None, dynamic=migprofiles.DynamicMig.parse("all"))
    instances = mig.MigInstances(control=None, devices=inv, log=logs.get("test"))
    whole = claims.AllocatedDevice(
        request="gpu", pool="n1", device="gpu-0", admin_access=False, share_id=None, configs=()
    )
    keys = [k.device for k in instances.ownership_keys([whole])]
    assert keys == [f"gpu-0 memory slice {i}" for i in range(8)]


def test_instances_are_made_and_destroyed_under_their_gpus_lock(
    mig_node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    instances = mig_node.driver.state.mig
    control = instances._control
    assert control is not None
    held: list[tuple[str, bool]] = []
    real_create, real_destroy = control.create, control.destroy

    def locked(uuid: str) -> bool:
        lock = instances._gpu_locks.get(uuid)
        return lock is not None and lock.locked()

    def create(place: migcontrol.Placement) -> migcontrol.Instance:
        held.append(("create", locked(place.parent_uuid)))
        return real_create(place)

    def destroy(uuid: str, **kw: Any) -> bool:
        held.append(("destroy", locked(uuid)))
        return real_destroy(uuid, **kw)

    monkeypatch.setattr(control, "create", create)
    monkeypatch.setattr(control, "destroy", destroy)
    ref, error = prepare(mig_node, "gpu-0-mig-1g-10gb-0")
    assert error == ""
    assert mig_node.driver.unprepare([ref]) == {ref.uid: ""}
    assert held == [("create", True), ("destroy", True)]


def test_a_failing_mig_mode_switch_of_a_whole_gpu_names_the_device(
    mig_node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    control = mig_node.driver.state.mig._control
    assert control is not None

    def lost(uuid: str) -> bool:
        raise migcontrol.MigControlError(f"GPU {uuid}: GPU is lost")

    monkeypatch.setattr(control, "mig_enabled", lost)
    ref, error = prepare(mig_node, "gpu-1", name="whole")
    assert error == f"{ref}: device gpu-1: GPU {GPU1.uuid}: GPU is lost"


def test_unprepare_destroys_the_instances_after_a_whole_gpu_and_logs_the_claim(
    mig_node: Node,
) -> None:
    ref, error = prepare(mig_node, "gpu-1", "gpu-0-mig-3g-40gb-4")
    assert error == ""
    assert layout(mig_node) == [("3g.40gb", 4)]
    with structlog.testing.capture_logs() as logged:
        assert mig_node.driver.unprepare([ref]) == {ref.uid: ""}
    assert layout(mig_node) == []
    [destroyed] = [e for e in logged if e["event"] == "destroyed MIG instance"]
    assert destroyed["claim_uid"] == ref.uid and destroyed["device"] == "gpu-0-mig-3g-40gb-4"
    assert destroyed["gpu_uuid"] == GPU0.uuid and destroyed["placement_start"] == 4
