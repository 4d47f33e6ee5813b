"""The slices the driver publishes: schema-valid, topology attributes right, deterministic,
split within the API limits."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable

import kubernetes_validate
import pytest
import refdata

from dra_driver.devices import fake, gpusets, model, profiles, topology
from dra_driver.slices import build, validate
from dra_driver.slices import gpusets as slices_gpusets

from . import openapi
from .conftest import Obj, devices_of, generated_profile

GPU_ATTRIBUTES = {
    "type",
    "uuid",
    "productName",
    "brand",
    "architecture",
    "cudaComputeCapability",
    "driverVersion",
    "cudaDriverVersion",
    "nvlinkLinks",
    "resource.kubernetes.io/pciBusID",
    "resource.kubernetes.io/pcieRoot",
    "resource.kubernetes.io/numaNode",
}
PROFILES = ["dgx-h100", "h100-nvl-pairs", "a100-mig", "gb200-nvl", "pcie-l4", "dgx-1-v100"]
# hgx-16-mesh (18 slices, 1040 devices) is validated in its own test below.


def gpus(slices: list[Obj]) -> list[Obj]:
    """The per-GPU and MIG devices (not the GPU sets, not the counter slice)."""
    return [
        d
        for s in slices
        for d in s["spec"].get("devices", [])
        if d["attributes"]["type"]["string"] != "gpu-set"
    ]


@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_passes_strict_136_and_137_schemas_and_local_rules(profile: str) -> None:
    slices = build.build(devices_of(profile), node_name="n1", node_uid="uid-n1").slices
    for obj in slices:
        assert kubernetes_validate.validate(obj, "1.36.0", strict=True)
        assert kubernetes_validate.validate(obj, "1.37.0", strict=True)
        assert validate.validate(obj) == []


@refdata.MARK
@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_passes_the_reference_openapi_document(profile: str) -> None:
    for obj in build.build(devices_of(profile), node_name="n1", node_uid="uid-n1").slices:
        assert openapi.errors(obj) == []


def test_dgx_h100_gpus_have_every_attribute_and_share_one_island(dgx_slices: list[Obj]) -> None:
    counters, first, _ = dgx_slices
    assert [s["metadata"]["name"] for s in dgx_slices] == [
        f"n1-gpu.nvidia.com-{i}" for i in range(3)
    ]
    for obj in dgx_slices:
        assert obj["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "uid-n1", "controller": True}
        ]
        assert obj["spec"]["pool"] == {"name": "n1", "generation": 1, "resourceSliceCount": 3}
        assert obj["spec"]["nodeName"] == "n1" and obj["spec"]["driver"] == "gpu.nvidia.com"
    assert "devices" not in counters["spec"]
    (gpu_counters,) = counters["spec"]["sharedCounters"]
    assert gpu_counters == {
        "name": "gpus",
        "counters": {f"gpu-{i}": {"value": "80Gi"} for i in range(8)},
    }
    assert len(first["spec"]["devices"]) == 64  # the limit once devices consume counters
    devices = gpus(dgx_slices)
    assert devices == first["spec"]["devices"][:8]
    assert [d["name"] for d in devices] == [f"gpu-{i}" for i in range(8)]
    for i, d in enumerate(devices):
        attrs = d["attributes"]
        assert GPU_ATTRIBUTES | {"nvlinkIsland"} == set(attrs)
        assert attrs["type"] == {"string": "gpu"}
        assert attrs["driverVersion"] == {"version": "580.95.5"}
        assert attrs["cudaComputeCapability"] == {"version": "9.0.0"}
        assert attrs["cudaDriverVersion"] == {"version": "13.0.0"}
        assert attrs["nvlinkLinks"] == {"int": 18}
        assert d["capacity"] == {"memory": {"value": "80Gi"}}
        assert d["consumesCounters"] == [
            {"counterSet": "gpus", "counters": {f"gpu-{i}": {"value": "80Gi"}}}
        ]
    assert {d["attributes"]["nvlinkIsland"]["string"] for d in devices} == {"island-0"}
    numa = [d["attributes"]["resource.kubernetes.io/numaNode"]["int"] for d in devices]
    assert numa == [0, 0, 0, 0, 1, 1, 1, 1]


def test_nvl_pairs_give_two_islands_and_pcie_cards_none() -> None:
    pairs = gpus(build.build(devices_of("h100-nvl-pairs"), node_name="n1").slices)
    assert [d["attributes"]["nvlinkIsland"]["string"] for d in pairs] == [
        "island-0",
        "island-0",
        "island-2",
        "island-2",
    ]
    assert all(d["attributes"]["nvlinkLinks"] == {"int": 12} for d in pairs)
    l4 = gpus(build.build(devices_of("pcie-l4"), node_name="n1").slices)
    assert all("nvlinkIsland" not in d["attributes"] for d in l4)
    assert all(d["attributes"]["nvlinkLinks"] == {"int": 0} for d in l4)


def test_fabric_clique_only_where_nvml_reports_one() -> None:
    gb200 = gpus(build.build(devices_of("gb200-nvl"), node_name="n1").slices)
    assert {d["attributes"]["nvlinkClique"]["string"] for d in gb200} == {
        "3f2a8c1e-5b7d-4e90-a1c2-6d8e9f0a1b2c.32766"
    }
    assert all(
        "nvlinkClique" not in d["attributes"]
        for d in gpus(build.build(devices_of("dgx-h100"), node_name="n1").slices)
    )
    devices = devices_of("gb200-nvl")
    pending = dataclasses.replace(
        devices,
        gpus=tuple(
            dataclasses.replace(g, fabric=dataclasses.replace(g.fabric, state="in-progress"))
            for g in devices.gpus
            if g.fabric is not None
        ),
    )
    assert all(
        "nvlinkClique" not in d["attributes"]
        for d in gpus(build.build(pending, node_name="n1").slices)
    )


def test_mig_gpus_publish_their_mig_devices_not_themselves() -> None:
    devices = gpus(build.build(devices_of("a100-mig"), node_name="n1").slices)
    assert [d["name"] for d in devices] == [
        "gpu-0-mig-2g-10gb-0",
        "gpu-0-mig-1g-5gb-2",
        "gpu-0-mig-1g-5gb-3",
        "gpu-0-mig-3g-20gb-4",
        "gpu-1-mig-7g-40gb-0",
    ]
    first = devices[0]
    parent = devices_of("a100-mig").gpus[0]
    assert first["attributes"]["type"] == {"string": "mig"}
    assert first["attributes"]["parentUUID"] == {"string": parent.uuid}
    assert first["attributes"]["profile"] == {"string": "2g.10gb"}
    assert first["attributes"]["driverVersion"] == {"version": "570.172.8"}
    assert first["attributes"]["resource.kubernetes.io/pciBusID"] == {"string": "0000:07:00.0"}
    assert first["capacity"] == {
        "copyEngines": {"value": "2"},
        "decoders": {"value": "1"},
        "encoders": {"value": "0"},
        "jpegEngines": {"value": "0"},
        "memory": {"value": "9856Mi"},
        "multiprocessors": {"value": "28"},
        "ofaEngines": {"value": "0"},
    }
    assert "nvlinkIsland" not in first["attributes"]


def test_output_is_byte_identical_across_builds() -> None:
    def render() -> str:
        slices = build.build(devices_of("a100-mig"), node_name="n1", node_uid="u").slices
        return json.dumps(slices)

    assert render() == render()
    shuffled = devices_of("dgx-h100")
    reordered = dataclasses.replace(shuffled, gpus=tuple(reversed(shuffled.gpus)))
    assert json.dumps(build.build(reordered, node_name="n1").slices) == json.dumps(
        build.build(shuffled, node_name="n1").slices
    )


@pytest.mark.parametrize(
    ("gpu_count", "migs", "sizes"),
    [(130, 0, [128, 2]), (128, 0, [128]), (20, 7, [128, 12]), (0, 0, [])],
)
def test_large_pools_split_with_one_generation_and_the_right_count(
    make_devices: Callable[..., model.NodeDevices],
    gpu_count: int,
    migs: int,
    sizes: list[int],
) -> None:
    devices = (
        make_devices(gpu_count, migs_per_gpu=migs) if gpu_count else model.NodeDevices(gpus=())
    )
    slices = build.build(devices, node_name="big", generation=7, gpu_sets=False).slices
    assert [len(s["spec"]["devices"]) for s in slices] == (sizes or [0])
    assert [s["metadata"]["name"] for s in slices] == [
        f"big-gpu.nvidia.com-{i}" for i in range(len(slices))
    ]
    for s in slices:
        assert s["spec"]["pool"] == {
            "name": "big",
            "generation": 7,
            "resourceSliceCount": len(slices),
        }
        assert validate.validate(s) == []
        assert kubernetes_validate.validate(s, "1.36.0", strict=True)
    names = [d["name"] for s in slices for d in s["spec"]["devices"]]
    assert len(names) == len(set(names)) == sum(sizes)


def test_split_honours_the_lower_limit_for_tainted_devices() -> None:
    devices = [
        {"name": f"d{i}", "taints": [{"key": "k", "effect": "NoSchedule"}] if i == 70 else []}
        for i in range(100)
    ]
    # 70 untainted devices fit one slice (limit 128); adding the tainted one would make that
    # slice subject to the 64 limit, so it starts the next slice instead.
    assert [len(c) for c in build.split(devices)] == [70, 30]
    assert all(
        len(c) <= (64 if any(validate.uses_special_limit(d) for d in c) else 128)
        for c in build.split(devices)
    )


def test_a_device_breaking_a_rule_is_left_out_and_named() -> None:
    text = generated_profile(3).replace(
        '  - {pciBusId: "0000:01:00.0"',
        '  - {productName: "' + "X" * 70 + '", pciBusId: "0000:01:00.0"',
    )
    devices = fake.FakeBackend(profiles.parse(text, source="t")).discover()
    result = build.build(devices, node_name="n1")
    assert [d["name"] for d in gpus(result.slices)] == ["gpu-0", "gpu-2"]
    (problem,) = result.problems
    assert "'gpu-1'" in problem and "attributes[productName].string" in problem
    assert "may not be more than 64 bytes" in problem


@pytest.mark.parametrize(
    ("raw", "semver"),
    [
        ("580.95.05", "580.95.5"),
        ("9.0", "9.0.0"),
        ("13.0", "13.0.0"),
        ("535.104.05", "535.104.5"),
        ("v12", "12.0.0"),
        ("570.172.08", "570.172.8"),
    ],
)
def test_versions_are_normalised_to_semver(raw: str, semver: str) -> None:
    assert build.normalize_version(raw) == semver


def test_quantities_use_the_canonical_form() -> None:
    assert build.bytes_quantity(80 << 30) == "80Gi"
    assert build.bytes_quantity(9856 << 20) == "9856Mi"
    assert build.bytes_quantity(1536 << 20) == "1536Mi"
    assert build.bytes_quantity(1000) == "1000"
    assert build.count_quantity(98) == "98" and build.count_quantity(2000) == "2k"


def test_names_and_bad_identity() -> None:
    assert build.slice_name("n1", "GPU.nvidia.com", 3) == "n1-gpu.nvidia.com-3"
    long_node = "a" * 250
    name = build.slice_name(long_node, "gpu.nvidia.com", 0)
    assert len(name) <= 253 and name.endswith("-0")
    assert build.slice_name(long_node, "gpu.nvidia.com", 0) == name
    with pytest.raises(build.BuildError, match=r"node 'N1'.*spec.nodeName"):
        build.build(devices_of("pcie-l4"), node_name="N1")


def test_custom_driver_name_is_used_throughout() -> None:
    slices = build.build(devices_of("pcie-l4"), node_name="n1", driver_name="gpu.example.com")
    for i, obj in enumerate(slices.slices):
        assert obj["spec"]["driver"] == "gpu.example.com"
        assert obj["metadata"]["name"] == f"n1-gpu.example.com-{i}"


# --- GPU sets and shared counters (docs/topology.md) -----------------------------------------


def test_gpu_sets_follow_the_gpus_by_size_best_first() -> None:
    devices = devices_of("dgx-1-v100")
    topo = topology.build(devices)
    slices = build.build(devices, node_name="n1").slices
    published = [d for s in slices for d in s["spec"].get("devices", [])]
    assert [d["name"] for d in published[:8]] == [f"gpu-{i}" for i in range(8)]
    sets = published[8:]
    assert sets and all(d["attributes"]["type"] == {"string": "gpu-set"} for d in sets)
    by_minor = {g.minor: g for g in devices.gpus}
    keys = []
    for d in sets:
        attrs = d["attributes"]
        minors = [int(m) for m in attrs["minors"]["string"].split(",")]
        assert d["name"] == "gpus-" + "-".join(map(str, minors))
        assert attrs["gpuCount"] == {"int": len(minors)}
        members = [by_minor[m] for m in minors]
        score = gpusets.set_score(topo, [g.index for g in members])
        assert attrs["nvlinkLinks"] == {"int": score[0]}
        assert [attrs[f"uuid{i}"]["string"] for i in range(len(minors))] == [
            g.uuid for g in members
        ]
        assert slices_gpusets.gpu_uuids(d) == [g.uuid for g in members]
        assert d["consumesCounters"] == [
            {"counterSet": "gpus", "counters": {f"gpu-{m}": {"value": "32Gi"} for m in minors}}
        ]
        keys.append((len(minors), tuple(-v for v in score)))
    assert keys == sorted(keys)  # by size, then best score first
    # The best pair of an empty DGX-1: two links, one NUMA node, one PCIe root.
    assert sets[0]["name"] == "gpus-0-3"
    assert {d["attributes"]["gpuCount"]["int"] for d in sets} == {2, 3, 4, 5, 6, 7}


def test_slice_names_sort_in_the_order_the_devices_are_meant_to_be_tried() -> None:
    slices = build.build(devices_of("hgx-16-mesh"), node_name="n1").slices
    names = [s["metadata"]["name"] for s in slices]
    assert len(slices) > 10
    assert names == sorted(names)
    assert names[0] == "n1-gpu.nvidia.com-00" and names[-1].endswith(f"-{len(slices) - 1}")
    sets = [d for s in slices for d in s["spec"].get("devices", []) if d["name"].startswith("gpus")]
    assert len(sets) == gpusets.MAX_SETS
    for obj in slices:
        assert validate.validate(obj) == []
        assert kubernetes_validate.validate(obj, "1.37.0", strict=True)


def test_many_gpus_fill_several_counter_sets_and_publish_no_sets(
    make_devices: Callable[..., model.NodeDevices],
) -> None:
    slices = build.build(make_devices(70), node_name="big").slices
    counters = slices[0]["spec"]["sharedCounters"]
    assert [(c["name"], len(c["counters"])) for c in counters] == [
        ("gpus", 32),
        ("gpus-1", 32),
        ("gpus-2", 6),
    ]
    devices = [d for s in slices[1:] for d in s["spec"]["devices"]]
    assert [len(s["spec"]["devices"]) for s in slices[1:]] == [64, 6]
    assert devices[40]["consumesCounters"] == [
        {"counterSet": "gpus-1", "counters": {"gpu-40": {"value": "80Gi"}}}
    ]
    assert not any(d["name"].startswith("gpus-") for d in devices)  # > 16 GPUs: no sets


def test_mig_only_nodes_keep_their_layout_and_sets_can_be_turned_off() -> None:
    (mig,) = build.build(devices_of("a100-mig"), node_name="n1").slices
    assert "sharedCounters" not in mig["spec"]
    assert not any("consumesCounters" in d for d in mig["spec"]["devices"])
    (plain,) = build.build(devices_of("dgx-h100"), node_name="n1", gpu_sets=False).slices
    assert [d["name"] for d in plain["spec"]["devices"]] == [f"gpu-{i}" for i in range(8)]
    assert not any("consumesCounters" in d for d in plain["spec"]["devices"])
