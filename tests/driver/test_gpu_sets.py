"""GPU-set devices on the prepare side: a set is exactly its GPUs; overlapping claims refused."""

from __future__ import annotations

import json

import pytest

from dra_driver.devices import fake
from dra_driver.driver import inventory

from .conftest import Node, claim_obj, gpu_config, new_uid, opaque


@pytest.fixture
def inv() -> inventory.Inventory:
    devices = fake.FakeBackend.from_name("a100-mig").discover()
    full = fake.FakeBackend.from_name("dgx-h100").discover()
    assert devices and full
    return inventory.build(full, mig_minors=None)


def test_a_set_name_maps_to_its_member_gpus(inv: inventory.Inventory) -> None:
    gpu0, gpu5 = inv.get("gpu-0"), inv.get("gpu-5")
    assert gpu0 is not None and gpu5 is not None
    found = inv.get("gpus-0-5")
    assert found is not None and found.kind == "gpu-set"
    assert found.members == (gpu0, gpu5)
    assert found.uuid == f"{gpu0.uuid},{gpu5.uuid}"
    assert found.device_nodes == ("/dev/nvidia0", "/dev/nvidia5")
    assert found.gpu_minors == (0, 5)


@pytest.mark.parametrize(
    "name", ["gpus-0-8", "gpus-5-0", "gpus-0-0", "gpus-00-1", "gpus-3", "gpus-"]
)
def test_names_that_are_not_sets_of_this_node(inv: inventory.Inventory, name: str) -> None:
    assert inv.get(name) is None


def test_a_set_never_holds_a_gpu_in_mig_mode() -> None:
    inv = inventory.build(fake.FakeBackend.from_name("a100-mig").discover(), mig_minors=None)
    assert inv.get("gpus-0-1") is None


def test_overlaps_name_both_devices_and_the_gpu(inv: inventory.Inventory) -> None:
    def dev(name: str) -> tuple[str, inventory.PreparableDevice]:
        found = inv.get(name)
        assert found is not None
        return name, found

    assert inventory.overlaps([dev("gpus-0-1"), dev("gpu-2"), dev("gpus-3-4")]) == []
    assert inventory.overlaps([dev("gpus-0-1"), dev("gpu-1")]) == [
        "gpus-0-1 and gpu-1 both use GPU gpu-1"
    ]
    assert inventory.overlaps([dev("gpus-0-1-2"), dev("gpus-2-3")]) == [
        "gpus-0-1-2 and gpus-2-3 both use GPU gpu-2"
    ]
    # Two shares of one GPU count once; a share next to a set holding its GPU is a clash.
    assert inventory.overlaps([dev("gpu-1"), dev("gpu-1")], shares=[True, True]) == []
    assert inventory.overlaps([dev("gpu-1"), dev("gpu-1")], shares=[True, False]) == [
        "gpu-1 and gpu-1 both use GPU gpu-1"
    ]
    assert inventory.overlaps(
        [dev("gpu-1"), dev("gpu-1"), dev("gpus-0-1")], shares=[True, True, False]
    ) == ["gpu-1 and gpus-0-1 both use GPU gpu-1"]


def test_mig_devices_of_one_gpu_may_share_it_but_not_with_the_whole_gpu() -> None:
    devices = fake.FakeBackend.from_name("a100-mig").discover()
    inv = inventory.build(devices, mig_minors=None)
    migs = [(n, d) for n, d in inv.devices.items() if d.kind == "mig" and d.parent_minor == 0]
    assert len(migs) >= 2
    assert inventory.overlaps(migs) == []
    whole = inventory.PreparableDevice(
        name="gpu-0", kind="gpu", uuid="GPU-x", parent_minor=0, device_nodes=("/dev/nvidia0",)
    )
    assert inventory.overlaps([migs[0], ("gpu-0", whole)]) == [
        f"{migs[0][0]} and gpu-0 both use GPU gpu-0"
    ]


def test_prepare_gives_the_container_exactly_the_set_gpus(node: Node) -> None:
    ref = node.add(
        claim_obj(name="set", uid=new_uid(), devices=["gpus-2-3"], request="gpus/nvlinked")
    )
    result = node.driver.prepare([ref])[ref.uid]
    assert result.error == ""
    assert [d.device_name for d in result.devices] == ["gpus-2-3"]
    spec = json.loads(next(node.cdi_root.glob("*.json")).read_text())
    (device,) = spec["devices"]
    assert device["name"] == f"{ref.uid}-gpus-2-3"
    assert [n["path"] for n in device["containerEdits"]["deviceNodes"]] == [
        "/dev/nvidia2",
        "/dev/nvidia3",
    ]
    inv = inventory.build(fake.FakeBackend.from_name("dgx-h100").discover(), mig_minors=None)
    uuids = [inv.devices[f"gpu-{m}"].uuid for m in (2, 3)]
    assert f"NVIDIA_VISIBLE_DEVICES={','.join(uuids)}" in spec["containerEdits"]["env"]


def test_claim_with_overlapping_devices_is_refused_alone(node: Node) -> None:
    bad = node.add(claim_obj(name="bad", uid=new_uid(), devices=["gpus-0-1", "gpu-1"]))
    good = node.add(claim_obj(name="good", uid=new_uid(), devices=["gpus-4-5"]))
    answers = node.driver.prepare([bad, good])
    assert answers[good.uid].error == ""
    err = answers[bad.uid].error
    assert "default/bad" in err
    assert "overlap in physical GPUs: gpus-0-1 and gpu-1 both use GPU gpu-1" in err
    assert node.spec_files() == [f"k8s.gpu.nvidia.com-claim_{good.uid}.json"]


def test_time_slicing_on_a_set_applies_to_each_member(node: Node) -> None:
    sharing = {"sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}}
    ref = node.add(
        claim_obj(
            name="shared",
            uid=new_uid(),
            devices=["gpus-6-7"],
            config=[opaque(gpu_config(**sharing))],
        )
    )
    assert node.driver.prepare([ref])[ref.uid].error == ""
    inv = inventory.build(fake.FakeBackend.from_name("dgx-h100").discover(), mig_minors=None)
    members = [inv.devices[f"gpu-{m}"].uuid for m in (6, 7)]
    assert node.driver.state.sharing.applied() == {u: "TimeSlicing:Long" for u in members}
    assert node.driver.unprepare([ref]) == {ref.uid: ""}
    assert node.driver.state.sharing.applied() == {}
