"""Resources and device IDs: whole GPUs, replicas, and the three MIG strategies."""

from __future__ import annotations

import pytest

from dra_driver.deviceplugin import inventory
from dra_driver.devices import fake, model
from dra_driver.devices.fake import profiles

MigStrategy = inventory.MigStrategy

SINGLE_PROFILE = """
name: a100-single
driverVersion: "570.172.08"
cudaDriverVersion: "12.8"
defaults: {productName: A100, brand: Nvidia, architecture: Ampere,
           cudaComputeCapability: "8.0", memory: 40Gi}
gpus:
  - pciBusId: "0000:07:00.0"
    numaNode: 0
    mig:
      - {profile: 3g.20gb, placementStart: 0, placementSize: 4, memory: 19968Mi,
         multiprocessors: 42}
      - {profile: 3g.20gb, placementStart: 4, placementSize: 4, memory: 19968Mi,
         multiprocessors: 42}
  - pciBusId: "0000:0f:00.0"
    numaNode: 1
    mig:
      - {profile: 3g.20gb, placementStart: 4, placementSize: 4, memory: 19968Mi,
         multiprocessors: 42}
"""


def devices(name: str) -> model.NodeDevices:
    return fake.FakeBackend.from_name(name).discover()


def single_profile_devices() -> model.NodeDevices:
    return fake.FakeBackend(profiles.parse(SINGLE_PROFILE, source="test")).discover()


def build(devs: model.NodeDevices, **kw: object) -> dict[str, inventory.Resource]:
    args: dict[str, object] = {
        "resource_name": "nvidia.com/gpu",
        "mig_strategy": MigStrategy.NONE,
        "mig_minors": None,
    }
    args.update(kw)
    return {r.name: r for r in inventory.build(devs, **args)}  # type: ignore[arg-type]


def test_one_device_per_gpu_with_uuid_ids_and_numa() -> None:
    devs = devices("dgx-1-v100")
    [res] = build(devs).values()
    assert [d.id for d in res.devices] == [g.uuid for g in devs.gpus]
    assert [d.unit.numa_node for d in res.devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert all(d.replica is None for d in res.devices)


def test_replicas_make_uuid_n_ids_per_gpu() -> None:
    devs = devices("h100-nvl-pairs")
    [res] = build(devs, replicas=3).values()
    assert [d.id for d in res.devices][:3] == [f"{devs.gpus[0].uuid}::{n}" for n in range(3)]
    assert len(res.devices) == 12
    assert all(len(d.id) <= inventory.MAX_DEVICE_ID for d in res.devices)


@pytest.mark.parametrize("replicas", [0, -1, inventory.MAX_REPLICAS + 1])
def test_bad_replica_counts_are_refused(replicas: int) -> None:
    with pytest.raises(inventory.InventoryError, match="--replicas must be between"):
        build(devices("pcie-l4"), replicas=replicas)


@pytest.mark.parametrize("name", ["gpu", "kubernetes.io/gpu", "nvidia.com/", "nvidia.com/g p u"])
def test_bad_resource_names_are_refused(name: str) -> None:
    with pytest.raises(inventory.InventoryError, match="not a valid extended resource name"):
        build(devices("pcie-l4"), resource_name=name)


def test_mig_strategy_none_offers_whole_gpus_even_in_mig_mode() -> None:
    devs = devices("a100-mig")
    res = build(devs)
    assert list(res) == ["nvidia.com/gpu"]
    assert [d.id for d in res["nvidia.com/gpu"].devices] == [g.uuid for g in devs.gpus]


def test_mig_strategy_mixed_makes_one_resource_per_profile() -> None:
    devs = devices("a100-mig")
    res = build(devs, mig_strategy=MigStrategy.MIXED)
    assert sorted(res) == sorted(
        [
            "nvidia.com/gpu",
            "nvidia.com/mig-1g.5gb",
            "nvidia.com/mig-2g.10gb",
            "nvidia.com/mig-3g.20gb",
            "nvidia.com/mig-7g.40gb",
        ]
    )
    assert res["nvidia.com/gpu"].devices == ()  # both GPUs are in MIG mode
    small = res["nvidia.com/mig-1g.5gb"].devices
    assert len(small) == 2 and all(d.unit.gpu_index == 0 for d in small)
    parent = devs.gpus[0].uuid
    assert all(d.unit.health_keys == (d.unit.uuid, parent) for d in small)
    assert inventory.mig_resource_name("nvidia.com", "1g.10gb+me") == "nvidia.com/mig-1g.10gb-me"


def test_mig_strategy_single_needs_one_profile_everywhere() -> None:
    with pytest.raises(inventory.InventoryError, match=r"several profiles \(1g.5gb, 2g.10gb"):
        build(devices("a100-mig"), mig_strategy=MigStrategy.SINGLE)
    devs = single_profile_devices()
    [res] = build(devs, mig_strategy=MigStrategy.SINGLE).values()
    assert res.name == "nvidia.com/gpu"
    assert [d.id for d in res.devices] == [m.uuid for g in devs.gpus for m in g.mig_devices]
    # No GPU in MIG mode: single behaves like none.
    assert (
        len(build(devices("pcie-l4"), mig_strategy=MigStrategy.SINGLE)["nvidia.com/gpu"].devices)
        == 4
    )


def test_lookup_names_every_unknown_id() -> None:
    [res] = build(devices("pcie-l4")).values()
    with pytest.raises(inventory.RequestError) as err:
        res.lookup([res.devices[0].id, "x", "y", "x"], field="devices_ids")
    assert "devices_ids: unknown device IDs 'x', 'y' for resource nvidia.com/gpu" in str(err.value)


# One GPU in MIG mode with two profiles, one whole GPU.
TWO_PROFILES = """
name: a100-two-profiles
driverVersion: "570.172.08"
cudaDriverVersion: "12.8"
defaults: {productName: A100, brand: Nvidia, architecture: Ampere,
           cudaComputeCapability: "8.0", memory: 40Gi}
gpus:
  - pciBusId: "0000:07:00.0"
    numaNode: 1
    mig:
      - {profile: 3g.20gb, placementStart: 0, placementSize: 4, memory: 19968Mi,
         multiprocessors: 42}
      - {profile: 1g.5gb, placementStart: 4, placementSize: 1, memory: 4864Mi,
         multiprocessors: 14}
  - pciBusId: "0000:0f:00.0"
    numaNode: 0
"""


def two_profile_devices() -> model.NodeDevices:
    return fake.FakeBackend(profiles.parse(TWO_PROFILES, source="test")).discover()


def test_mixed_offers_whole_gpus_beside_the_mig_devices_of_another() -> None:
    devs = two_profile_devices()
    mig_gpu, plain = devs.gpus
    res = build(devs, mig_strategy=MigStrategy.MIXED)
    assert list(res) == ["nvidia.com/gpu", "nvidia.com/mig-3g.20gb", "nvidia.com/mig-1g.5gb"]
    [whole] = res["nvidia.com/gpu"].devices
    assert whole.id == plain.uuid and whole.unit.device_nodes == (f"/dev/nvidia{plain.minor}",)
    assert whole.unit.memory_bytes == plain.memory_bytes and whole.unit.mig is None
    [small] = res["nvidia.com/mig-1g.5gb"].devices
    mig = next(m for m in mig_gpu.mig_devices if m.profile == "1g.5gb")
    assert small.unit.mig == mig
    assert (small.unit.minor, small.unit.numa_node, small.unit.gpu_index) == (
        mig_gpu.minor,
        1,
        mig_gpu.index,
    )
    assert small.unit.memory_bytes == mig.memory_bytes == 4864 << 20


def test_mig_strategy_single_names_every_reason_it_cannot_be_used() -> None:
    devs = two_profile_devices()
    with pytest.raises(inventory.InventoryError) as err:
        build(devs, mig_strategy=MigStrategy.SINGLE)
    assert str(err.value) == (
        "--mig-strategy single needs every GPU in MIG mode with one MIG profile: "
        f"GPUs [{devs.gpus[1].index}] are not in MIG mode; "
        "MIG devices use several profiles (1g.5gb, 3g.20gb) "
        "(use --mig-strategy mixed for this layout)"
    )


def test_bad_resource_name_and_replica_errors_are_exact() -> None:
    with pytest.raises(inventory.InventoryError) as err:
        build(devices("pcie-l4"), resource_name="gpu")
    assert str(err.value) == (
        "resource name 'gpu' is not a valid extended resource name "
        "(want <domain>/<name> outside kubernetes.io, e.g. nvidia.com/gpu)"
    )
    [res] = build(devices("pcie-l4"), replicas=inventory.MAX_REPLICAS).values()
    assert len(res.devices) == 4 * inventory.MAX_REPLICAS


def _one_gpu_with_uuid(uuid: str) -> model.NodeDevices:
    text = (
        SINGLE_PROFILE.split("gpus:")[0]
        + f'gpus:\n  - {{pciBusId: "0000:07:00.0", uuid: "{uuid}"}}\n'
    )
    return fake.FakeBackend(profiles.parse(text, source="test")).discover()


def test_device_ids_up_to_63_characters_are_allowed() -> None:
    longest = "GPU-" + "a" * 59
    [res] = build(_one_gpu_with_uuid(longest)).values()
    assert [d.id for d in res.devices] == [longest]
    with pytest.raises(inventory.InventoryError) as err:
        build(_one_gpu_with_uuid(longest + "b"))
    assert str(err.value) == (
        f"device ID '{longest}b' is 64 characters; the device plugin API allows at most 63"
    )


def test_unknown_ids_are_shown_whole_up_to_80_characters_and_8_of_them() -> None:
    [res] = build(devices("pcie-l4")).values()
    edge = "x" * inventory.SHOWN_ID_CHARS
    with pytest.raises(inventory.RequestError) as err:
        res.lookup([edge], field="devices_ids")
    assert str(err.value) == (
        f"devices_ids: unknown device ID '{edge}' for resource nvidia.com/gpu "
        "(this node lists 4 devices)"
    )
    eight = [f"bad-{i}" for i in range(inventory.SHOWN_IDS)]
    with pytest.raises(inventory.RequestError) as err:
        res.lookup(eight, field="available_deviceIDs")
    assert str(err.value).endswith(
        "'bad-7' for resource nvidia.com/gpu (this node lists 4 devices)"
    )
    with pytest.raises(inventory.RequestError) as err:
        res.device("nope")
    assert str(err.value) == "unknown device ID 'nope' for resource nvidia.com/gpu"
