"""The slices the driver publishes: schema-valid, topology attributes right, deterministic,
split within the API limits."""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Callable, Collection

import kubernetes_validate
import pytest
import refdata

from dra_driver.devices import fake, gpusets, model, topology
from dra_driver.devices.fake import profiles
from dra_driver.slices import build, devicerules, shares, validate
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
# hgx-16-mesh (16 GPUs, the most that get set ranks) is validated in its own test below.


def gpus(slices: list[Obj]) -> list[Obj]:
    """Every published device (one per full GPU or MIG device), in pool order."""
    return [d for s in slices for d in s["spec"].get("devices", [])]


def ranks(slices: list[Obj], size: int) -> list[int]:
    """Every full GPU's rank among the best sets of ``size`` (digit ``size`` of ``setRanks``),
    by minor."""
    return [
        slices_gpusets.unpack(d["attributes"][slices_gpusets.PACKED_ATTRIBUTE]["int"])[size]
        for d in gpus(slices)
        if d["attributes"]["type"]["string"] == "gpu"
    ]


def rank_sizes(devices: list[Obj]) -> list[int]:
    """The set sizes ranked on ``devices`` (every one carries ``setRanks``, and some device
    has a non-zero digit for the size), ascending; ``[]`` when a device carries no ranks."""
    packed = slices_gpusets.PACKED_ATTRIBUTE
    if not devices or not all(packed in d["attributes"] for d in devices):
        return []
    values = [slices_gpusets.unpack(d["attributes"][packed]["int"]) for d in devices]
    return [n for n in range(1, slices_gpusets.MAX_SIZE + 1) if any(v[n] for v in values)]


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


def test_dgx_h100_is_one_slice_of_eight_gpus_with_every_attribute_and_one_island(
    dgx_slices: list[Obj],
) -> None:
    (only,) = dgx_slices
    assert only["metadata"] == {
        "name": "n1-gpu.nvidia.com-0",
        "ownerReferences": [
            {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "uid-n1", "controller": True}
        ],
    }
    assert only["spec"]["pool"] == {"name": "n1", "generation": 1, "resourceSliceCount": 1}
    assert only["spec"]["nodeName"] == "n1" and only["spec"]["driver"] == "gpu.nvidia.com"
    assert "sharedCounters" not in only["spec"]  # counters only for dynamic MIG
    devices = only["spec"]["devices"]
    assert [d["name"] for d in devices] == [f"gpu-{i}" for i in range(8)]
    rank_keys = {"setRanks"}
    for d in devices:
        attrs = d["attributes"]
        assert GPU_ATTRIBUTES | {"nvlinkIsland"} | rank_keys == set(attrs)
        assert list(attrs) == sorted(attrs)  # a fixed order: byte-identical output
        assert attrs["type"] == {"string": "gpu"}
        assert attrs["driverVersion"] == {"version": "580.95.5"}
        assert attrs["cudaComputeCapability"] == {"version": "9.0.0"}
        assert attrs["cudaDriverVersion"] == {"version": "13.0.0"}
        assert attrs["nvlinkLinks"] == {"int": 18}
        assert d["capacity"] == {"memory": {"value": "80Gi"}}
        assert set(d) == {"name", "attributes", "capacity"}  # no counters, no taints
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


# --- Set ranks (docs/topology.md) -------------------------------------------------------------


def test_an_empty_dgx_1_ranks_its_best_sets_first() -> None:
    slices = build.build(devices_of("dgx-1-v100"), node_name="n1").slices
    # Pairs bonded with two links on one NUMA node and PCIe root, best (lowest minors) first.
    assert ranks(slices, 2) == [1, 2, 2, 1, 3, 4, 4, 3]
    # The two fully connected triangles on one NUMA node; gpu-1 and gpu-5 are left over.
    assert ranks(slices, 3) == [1, 0, 1, 1, 2, 0, 2, 2]
    assert ranks(slices, 4) == [1, 1, 1, 1, 2, 2, 2, 2]  # the two fully connected quads
    assert ranks(slices, 7) == [1, 1, 1, 1, 1, 1, 1, 0]
    # Single GPUs: fill the quad gpu-0..3 first (keeping gpu-4..7 whole), gpu-7 last.
    assert ranks(slices, 1) == [1, 4, 3, 2, 5, 6, 7, 0]
    assert rank_sizes(gpus(slices)) == list(range(1, 8))


def test_taken_gpus_are_left_out_of_the_ranks_and_the_rest_re_ranked() -> None:
    devices = devices_of("dgx-1-v100")
    slices = build.build(devices, node_name="n1", taken={"gpu-0"}).slices
    # gpu-0 busy: the best free quad is gpu-4..gpu-7 (9 links), not gpu-1..gpu-4 (5).
    assert ranks(slices, 4) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert ranks(slices, 2) == [0, 1, 1, 0, 2, 3, 3, 2]
    assert ranks(slices, 7) == [0, 1, 1, 1, 1, 1, 1, 1]
    # Only the ranks change: every other byte of the devices is the same.
    free = build.build(devices, node_name="n1").slices
    strip = slices_gpusets.PACKED_ATTRIBUTE
    assert [
        {k: v for k, v in d["attributes"].items() if not k.startswith(strip)} for d in gpus(slices)
    ] == [{k: v for k, v in d["attributes"].items() if not k.startswith(strip)} for d in gpus(free)]
    dgx = build.build(devices_of("dgx-h100"), node_name="n1", taken=("gpu-0", "gpu-5")).slices
    assert ranks(dgx, 2) == [0, 3, 1, 1, 3, 0, 2, 2]  # same PCIe root first, then what is left
    assert ranks(dgx, 4) == [0, 1, 1, 1, 1, 0, 0, 0]
    assert ranks(dgx, 7) == [0] * 8  # six GPUs free: no free set of seven


def test_an_empty_dgx_h100_ranks_by_numa_node_and_pcie_root(dgx_slices: list[Obj]) -> None:
    assert ranks(dgx_slices, 2) == [1, 1, 2, 2, 3, 3, 4, 4]
    assert ranks(dgx_slices, 4) == [1, 1, 1, 1, 2, 2, 2, 2]
    assert ranks(dgx_slices, 5) == [1, 1, 1, 1, 1, 0, 0, 0]


def _exhaustive_chain(
    devices: model.NodeDevices, size: int, taken: Collection[str]
) -> list[tuple[int, ...]]:
    """The ranked sets of ``size`` by brute force: among all subsets of the free GPUs the one
    with the best (links, same-NUMA pairs, same-PCIe-root pairs), lowest minors on a tie; then
    the same over what is left."""
    topo = topology.build(devices)
    by_minor = {g.minor: g for g in devices.gpus}

    def score(minors: tuple[int, ...]) -> tuple[int, int, int]:
        links = numa = root = 0
        for a, b in itertools.combinations(minors, 2):
            ia, ib = by_minor[a].index, by_minor[b].index
            links += topo.links(ia, ib)
            na, nb = topo.numa_of.get(ia), topo.numa_of.get(ib)
            ra, rb = topo.pcie_root_of.get(ia), topo.pcie_root_of.get(ib)
            numa += na is not None and na == nb
            root += ra is not None and ra == rb
        return links, numa, root

    left = sorted(g.minor for g in devices.gpus if g.name not in taken)
    chain: list[tuple[int, ...]] = []
    while len(left) >= size and len(chain) < gpusets.MAX_RANKS:
        best = min(
            itertools.combinations(left, size),
            key=lambda c: (tuple(-v for v in score(c)), c),
        )
        chain.append(best)
        left = [m for m in left if m not in best]
    return chain


def _published_chain(slices: list[Obj], size: int) -> list[tuple[int, ...]]:
    by_rank: dict[int, list[int]] = {}
    for d in gpus(slices):
        rank = slices_gpusets.rank_of(d["attributes"], size)
        if rank:
            by_rank.setdefault(rank, []).append(int(d["name"].removeprefix("gpu-")))
    return [tuple(by_rank[r]) for r in sorted(by_rank)]


@pytest.mark.parametrize(
    ("profile", "taken"),
    [
        ("dgx-1-v100", ()),
        ("dgx-1-v100", ("gpu-0",)),
        ("dgx-1-v100", ("gpu-2", "gpu-7")),
        ("dgx-1-v100", ("gpu-0", "gpu-1", "gpu-6")),
        ("dgx-h100", ("gpu-1", "gpu-4", "gpu-6")),
        ("h100-nvl-pairs", ("gpu-2",)),
        ("pcie-l4", ()),
    ],
)
def test_ranked_sets_are_the_exhaustive_optimum_of_the_free_gpus(
    profile: str, taken: tuple[str, ...]
) -> None:
    devices = devices_of(profile)
    slices = build.build(devices, node_name="n1", taken=taken).slices
    for size in range(2, len(devices.gpus)):
        assert _published_chain(slices, size) == _exhaustive_chain(devices, size, taken), size


def test_rank_one_on_sixteen_gpus_is_the_exhaustive_optimum() -> None:
    devices = devices_of("hgx-16-mesh")
    taken = ("gpu-0", "gpu-5", "gpu-10")
    slices = build.build(devices, node_name="n1", taken=taken).slices
    for size in (2, 3, 4, 6, 8, 12):
        (best, *_) = _exhaustive_chain(devices, size, taken)
        assert _published_chain(slices, size)[0] == best, size


def test_sixteen_gpus_rank_every_size_within_32_attributes_per_device() -> None:
    devices = devices_of("hgx-16-mesh")
    for shareable in ("none", "all"):
        result = build.build(devices, node_name="n1", shareable=shares.Shareable.parse(shareable))
        assert result.problems == []
        (only,) = result.slices
        published = only["spec"]["devices"]
        assert [d["name"] for d in published] == [f"gpu-{i}" for i in range(16)]
        assert rank_sizes(published) == list(range(1, 16))
        for d in published:
            assert 0 < d["attributes"]["setRanks"]["int"] < 2**63  # 15 digits: an int64
            used = len(d["attributes"]) + len(d["capacity"])
            assert used <= devicerules.MAX_ATTRIBUTES_AND_CAPACITIES
        assert validate.validate(only) == []
        assert kubernetes_validate.validate(only, "1.37.0", strict=True)
    # Each rank-1 set of N is N GPUs; rank k never outnumbers the GPUs it could hold.
    slices = build.build(devices, node_name="n1").slices
    for size in range(2, 16):
        chain = _published_chain(slices, size)
        assert chain and all(len(s) == size for s in chain)
        assert len(chain) == min(16 // size, gpusets.MAX_RANKS)


@pytest.mark.parametrize(("count", "sizes"), [(2, []), (3, [1, 2]), (5, [1, 2, 3, 4]), (17, [])])
def test_only_nodes_with_3_to_16_full_gpus_get_ranks(
    make_devices: Callable[..., model.NodeDevices], count: int, sizes: list[int]
) -> None:
    slices = build.build(make_devices(count), node_name="n1").slices
    assert len(gpus(slices)) == count
    assert rank_sizes(gpus(slices)) == sizes


def test_mig_devices_get_no_ranks_and_mig_mode_gpus_are_not_members() -> None:
    slices = build.build(devices_of("a100-mig"), node_name="n1").slices
    assert not any("setRanks" in d["attributes"] for d in gpus(slices))
    # Two of four GPUs in MIG mode: two full GPUs, too few for ranks.
    text = generated_profile(4, migs_per_gpu=0)
    lines = text.splitlines()
    for i in (1, 3):
        line = next(j for j, ln in enumerate(lines) if f'"0000:{i:02x}:00.0"' in ln)
        lines[line] = lines[line].removesuffix("}") + ", mig: []}"
    devices = fake.FakeBackend(profiles.parse("\n".join(lines) + "\n", source="t")).discover()
    assert [g.mig_enabled for g in devices.gpus] == [False, True, False, True]
    published = gpus(build.build(devices, node_name="n1").slices)
    assert not any("setRanks" in d["attributes"] for d in published)


def test_slice_names_sort_in_the_order_the_devices_are_meant_to_be_tried(
    make_devices: Callable[..., model.NodeDevices],
) -> None:
    def taint_all(entries: list[Obj]) -> None:
        for entry in entries:
            entry["taints"] = [{"key": "gpu.nvidia.com/test", "effect": "None"}]

    # 641 tainted GPUs: 64 per slice, 11 slices, so the index is zero-padded.
    slices = build.build(make_devices(641), node_name="n1", decorate=taint_all).slices
    names = [s["metadata"]["name"] for s in slices]
    assert len(slices) == 11
    assert names == sorted(names)
    assert names[0] == "n1-gpu.nvidia.com-00" and names[-1] == "n1-gpu.nvidia.com-10"
    assert [len(s["spec"]["devices"]) for s in slices] == [64] * 10 + [1]
    for obj in slices:
        assert validate.validate(obj) == []


def test_many_gpus_are_one_slice_of_128_devices_without_counters_or_ranks(
    make_devices: Callable[..., model.NodeDevices],
) -> None:
    slices = build.build(make_devices(70), node_name="big").slices
    (only,) = slices
    assert "sharedCounters" not in only["spec"]
    published = only["spec"]["devices"]
    assert len(published) == 70
    assert not any("consumesCounters" in d for d in published)
    assert not any("setRanks" in d["attributes"] for d in published)  # > 16 GPUs: no ranks
    assert [
        len(s["spec"]["devices"]) for s in build.build(make_devices(200), node_name="b").slices
    ] == [128, 72]


def test_mig_only_nodes_keep_their_layout_and_ranks_can_be_turned_off() -> None:
    (mig,) = build.build(devices_of("a100-mig"), node_name="n1").slices
    assert "sharedCounters" not in mig["spec"]
    assert not any("consumesCounters" in d for d in mig["spec"]["devices"])
    with_ranks = build.build(devices_of("dgx-h100"), node_name="n1").slices
    (plain,) = build.build(devices_of("dgx-h100"), node_name="n1", gpu_sets=False).slices
    assert [d["name"] for d in plain["spec"]["devices"]] == [f"gpu-{i}" for i in range(8)]
    assert not any("consumesCounters" in d for d in plain["spec"]["devices"])
    assert rank_sizes(plain["spec"]["devices"]) == []
    assert "setRank" not in json.dumps(plain)
    assert rank_sizes(gpus(with_ranks)) == list(range(1, 8))
    # Apart from the ranks, the devices are the same.
    for bare, ranked in zip(plain["spec"]["devices"], gpus(with_ranks), strict=True):
        kept = {k: v for k, v in ranked["attributes"].items() if k != "setRanks"}
        assert bare == {**ranked, "attributes": kept}
