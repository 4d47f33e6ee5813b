"""Dynamic MIG slices: valid under the 1.36/1.37 limits and strict schema, split correctly,
counters that say exactly what the profile table allows, stable DNS-label names."""

from __future__ import annotations

import kubernetes_validate
import pytest
import refdata

from dra_driver.apimachinery import names
from dra_driver.apimachinery import quantity as qty
from dra_driver.devices import fake, migprofiles, model
from dra_driver.devices.fake import profiles
from dra_driver.slices import build, migslices, validate

from . import openapi
from .conftest import Obj

ALL = migprofiles.DynamicMig.parse("all")


def _nodes(gpus: int, table: str = "h100-80gb") -> model.NodeDevices:
    lines = [
        "name: many-mig",
        'driverVersion: "580.95.05"',
        'cudaDriverVersion: "13.0"',
        "defaults: {productName: NVIDIA H100 80GB HBM3, brand: Nvidia, architecture: Hopper,",
        f'           cudaComputeCapability: "9.0", memory: 80Gi, migProfiles: {table}}}',
        "gpus:",
    ] + [f'  - {{pciBusId: "0000:{i:02x}:00.0", numaNode: {i % 2}}}' for i in range(gpus)]
    return fake.FakeBackend(profiles.parse("\n".join(lines), source="test")).discover()


def _devices(slices: list[Obj]) -> list[Obj]:
    return [d for s in slices for d in s["spec"].get("devices", [])]


def _sets(slices: list[Obj]) -> list[Obj]:
    return [c for s in slices for c in s["spec"].get("sharedCounters", [])]


def _parse(text: str) -> int:
    return qty.parse_quantity(text).nanos


@pytest.mark.parametrize("profile", ["h100-mig", "a100-mig"])
def test_slices_with_counters_are_valid(profile: str) -> None:
    devices = fake.FakeBackend.from_name(profile).discover()
    built = build.build(devices, node_name="n1", node_uid="uid-n1", dynamic_mig=ALL)
    assert built.problems == []
    for obj in built.slices:
        assert kubernetes_validate.validate(obj, "1.37.0", strict=True)
        assert validate.validate(obj) == []
    assert migslices.check_references(built.slices, _parse) == []


@refdata.MARK
@pytest.mark.parametrize("profile", ["h100-mig", "a100-mig"])
def test_slices_with_counters_pass_the_reference_openapi_document(profile: str) -> None:
    devices = fake.FakeBackend.from_name(profile).discover()
    for obj in build.build(devices, node_name="n1", node_uid="uid-n1", dynamic_mig=ALL).slices:
        assert openapi.errors(obj) == []


def test_h100_gpu_counters_and_one_device_per_placement() -> None:
    devices = fake.FakeBackend.from_name("h100-mig").discover()
    built = build.build(devices, node_name="n1", dynamic_mig=ALL)
    sets = {c["name"]: c["counters"] for c in _sets(built.slices)}
    assert sorted(sets) == ["gpu-0-mig", "gpu-1-mig"]  # a set per dynamic GPU, nothing else
    assert {k: v["value"] for k, v in sets["gpu-0-mig"].items()} == {
        **{f"memory-slice-{i}": "1" for i in range(8)},
        "compute-slices": "7", "multiprocessors": "132", "copy-engines": "8", "decoders": "7",
        "jpeg-engines": "7", "ofa-engines": "1", "memory": "81152Mi",
        "1g-10gb-me-instances": "1",
    }  # fmt: skip
    gpu0 = [d["name"] for d in _devices(built.slices) if d["name"].startswith("gpu-0")]
    assert gpu0[0] == "gpu-0" and len(gpu0) == 26  # the full GPU, then 25 placements
    assert gpu0[1:8] == [f"gpu-0-mig-1g-10gb-{i}" for i in range(7)]
    assert "gpu-0-mig-1g-10gb-me-6" in gpu0 and "gpu-0-mig-7g-80gb-0" in gpu0
    by_name = {d["name"]: d for d in _devices(built.slices)}
    full = by_name["gpu-0"]["consumesCounters"]
    assert full == [{"counterSet": "gpu-0-mig", "counters": sets["gpu-0-mig"]}]  # all of it
    me = by_name["gpu-0-mig-1g-10gb-me-3"]
    assert me["attributes"]["profile"] == {"string": "1g.10gb+me"}
    assert me["attributes"]["type"] == {"string": "mig"}
    assert me["attributes"]["parentUUID"] == {"string": devices.gpus[0].uuid}
    assert "uuid" not in me["attributes"]  # the instance does not exist yet
    (use,) = me["consumesCounters"]
    assert use["counterSet"] == "gpu-0-mig"
    assert {k: v["value"] for k, v in use["counters"].items()} == {
        "memory-slice-3": "1", "compute-slices": "1", "multiprocessors": "16",
        "copy-engines": "1", "decoders": "1", "jpeg-engines": "1", "ofa-engines": "1",
        "memory": "9984Mi", "1g-10gb-me-instances": "1",
    }  # fmt: skip
    # The full GPU takes every counter this placement takes part of: they exclude each other.
    for name, amount in use["counters"].items():
        assert _parse(full[0]["counters"][name]["value"]) >= _parse(amount["value"]) > 0


def test_dynamic_devices_carry_the_attributes_of_static_mig_devices() -> None:
    static = build.build(fake.FakeBackend.from_name("a100-mig").discover(), node_name="n1")
    dynamic = build.build(
        fake.FakeBackend.from_name("a100-mig").discover(), node_name="n1", dynamic_mig=ALL
    )
    old = {d["name"]: d for d in _devices(static.slices)}
    new = {d["name"]: d for d in _devices(dynamic.slices)}
    for name in ("gpu-0-mig-2g-10gb-0", "gpu-0-mig-1g-5gb-3", "gpu-0-mig-3g-20gb-4"):
        assert set(old[name]["attributes"]) - set(new[name]["attributes"]) == {"uuid"}
        assert old[name]["capacity"] == new[name]["capacity"]
        for key, value in new[name]["attributes"].items():
            assert old[name]["attributes"][key] == value


def test_eight_and_twelve_gpus_split_within_the_limits() -> None:
    for gpus, counter_slices in ((8, 1), (12, 2)):
        built = build.build(_nodes(gpus), node_name="n1", dynamic_mig=ALL)
        kinds = ["devices" if s["spec"].get("devices") else "counters" for s in built.slices]
        devices = _devices(built.slices)
        assert len(devices) == gpus * 26  # each GPU whole and its 25 placements
        device_slices = -(-len(devices) // validate.MAX_DEVICES_SPECIAL)
        assert kinds == ["counters"] * counter_slices + ["devices"] * device_slices
        assert len(_sets(built.slices)) == gpus  # one per GPU
        # The full GPUs carry their set ranks like any full GPU; placements none.
        full = [d for d in devices if "-mig-" not in d["name"]]
        assert [d["name"] for d in full] == [f"gpu-{i}" for i in range(gpus)]
        for dev in devices:
            ranked = [k for k in dev["attributes"] if k.startswith("setRank")]
            assert ranked == (["setRanks"] if dev in full else [])
        # Every size 1..gpus-1 ranked: each has a rank-1 set on some full GPU.
        digits = [d["attributes"]["setRanks"]["int"] for d in full]
        assert all(any(v // 10 ** (n - 1) % 10 == 1 for v in digits) for n in range(1, gpus))
        for obj in built.slices:
            spec = obj["spec"]
            assert spec["pool"]["resourceSliceCount"] == len(built.slices)
            assert len(spec.get("devices", [])) <= validate.MAX_DEVICES_SPECIAL
            assert len(spec.get("sharedCounters", [])) <= validate.MAX_COUNTER_SETS
            for cs in spec.get("sharedCounters", []):
                assert len(cs["counters"]) <= 32
            for dev in spec.get("devices", []):
                assert len(dev["consumesCounters"]) == 1
                assert all(len(c["counters"]) <= 32 for c in dev["consumesCounters"])
            assert validate.validate(obj) == []
            assert kubernetes_validate.validate(obj, "1.37.0", strict=True)
        assert migslices.check_references(built.slices, _parse) == []
        again = build.build(_nodes(gpus), node_name="n1", dynamic_mig=ALL)
        assert again.slices == built.slices  # stable: same hardware, same slices


def test_names_are_dns_labels_and_those_of_existing_mig_devices() -> None:
    devices = _nodes(2, "a100-sxm4-40gb")
    for gpu in devices.gpus:
        for place in migprofiles.placements(gpu):
            assert names.dns_label(place.name) == []
            assert place.name == model.mig_placement_name(
                gpu.minor, place.profile.name, place.start
            )
    assert {p.name for p in migprofiles.placements(devices.gpus[1])} >= {
        "gpu-1-mig-1g-5gb-me-6", "gpu-1-mig-1g-10gb-6", "gpu-1-mig-7g-40gb-0",
    }  # fmt: skip


def test_a_regex_picks_gpus_by_product_and_reports_the_ones_it_cannot_make_dynamic() -> None:
    # H100 NVLs: MIG-capable, but the profile lists no table for them (no placements known).
    devices = fake.FakeBackend.from_name("h100-nvl-pairs").discover()
    built = build.build(devices, node_name="n1", dynamic_mig=migprofiles.DynamicMig.parse("h100"))
    assert len(built.problems) == 4 and "lists no MIG profile placements" in built.problems[0]
    assert _sets(built.slices) == []  # no MIG counter set, and no other
    assert [d["name"] for d in _devices(built.slices)] == [f"gpu-{i}" for i in range(4)]
    none = build.build(
        fake.FakeBackend.from_name("h100-mig").discover(),
        node_name="n1",
        dynamic_mig=migprofiles.DynamicMig.parse("A100"),
    )
    # Static as before: GPU 1 is in MIG mode without MIG devices, so it offers nothing.
    assert _sets(none.slices) == []
    assert [d["name"] for d in _devices(none.slices)] == ["gpu-0"]
    with pytest.raises(migprofiles.SelectorError, match="not none, all or a regular expression"):
        migprofiles.DynamicMig.parse("H100(")


def test_check_references_catches_a_missing_set_and_an_oversized_consumption() -> None:
    built = build.build(
        fake.FakeBackend.from_name("h100-mig").discover(), node_name="n1", dynamic_mig=ALL
    )
    devices_only = [s for s in built.slices if s["spec"].get("devices")]
    problems = migslices.check_references(devices_only, _parse)
    assert problems and problems[0] == "device gpu-0: no counter set gpu-0-mig"
    [gpu0] = [c for c in _sets(built.slices) if c["name"] == "gpu-0-mig"]
    gpu0["counters"]["compute-slices"]["value"] = "6"
    problems = migslices.check_references(built.slices, _parse)
    assert problems == [
        "device gpu-0: consumes more compute-slices than gpu-0-mig has",
        "device gpu-0-mig-7g-80gb-0: consumes more compute-slices than gpu-0-mig has",
    ]


def test_check_references_names_a_missing_counter_and_a_set_defined_twice() -> None:
    built = build.build(
        fake.FakeBackend.from_name("h100-mig").discover(), node_name="n1", dynamic_mig=ALL
    )
    [gpu0] = [c for c in _sets(built.slices) if c["name"] == "gpu-0-mig"]
    del gpu0["counters"]["memory-slice-0"]
    problems = migslices.check_references(built.slices, _parse)
    users = [
        d["name"]
        for d in _devices(built.slices)
        for use in d.get("consumesCounters") or ()
        if use["counterSet"] == "gpu-0-mig" and "memory-slice-0" in use["counters"]
    ]
    assert users and problems == [
        f"device {name}: counter set gpu-0-mig has no memory-slice-0" for name in users
    ]
    twice = [s for s in built.slices if s["spec"].get("sharedCounters")]
    assert migslices.check_references(twice + twice, _parse) == [
        f"counter set {twice[0]['spec']['sharedCounters'][0]['name']} is defined twice in the pool"
    ]
    assert migslices.check_references([{"spec": {}}, {}], _parse) == []


def test_a_dynamic_gpu_in_mig_mode_is_a_full_gpu_consuming_only_its_own_set() -> None:
    devices = fake.FakeBackend.from_name("h100-mig").discover()
    assert devices.gpus[1].mig_enabled and not devices.gpus[1].mig_devices
    built = build.build(devices, node_name="n1", dynamic_mig=ALL)
    full = {d["name"]: d for d in _devices(built.slices) if "-mig-" not in d["name"]}
    assert sorted(full) == ["gpu-0", "gpu-1"]
    assert [c["counterSet"] for c in full["gpu-1"]["consumesCounters"]] == ["gpu-1-mig"]


def test_dynamic_gpus_in_mig_mode_are_ranked_as_full_gpus() -> None:
    lines = [
        "name: four",
        'driverVersion: "580.95.05"',
        'cudaDriverVersion: "13.0"',
        "defaults: {productName: NVIDIA H100 80GB HBM3, brand: Nvidia, architecture: Hopper,",
        '           cudaComputeCapability: "9.0", memory: 80Gi, migProfiles: h100-80gb}',
        "nvlink: {switched: 18}",
        "gpus:",
    ] + [
        f'  - {{pciBusId: "0000:{i:02x}:00.0", numaNode: {i // 2}' + (", mig: []}" if i else "}")
        for i in range(4)
    ]
    devices = fake.FakeBackend(profiles.parse("\n".join(lines), source="t")).discover()
    assert [g.mig_enabled for g in devices.gpus] == [False, True, True, True]

    def rank(built: build.Build, name: str, size: int) -> int | None:
        found = {d["name"]: d for d in _devices(built.slices)}
        attr = found[name]["attributes"].get("setRanks")
        return None if attr is None else int(attr["int"]) // 10 ** (size - 1) % 10

    dynamic = build.build(devices, node_name="n1", dynamic_mig=ALL)
    # Published whole: four full GPUs, ranked in pairs by NUMA node.
    assert [rank(dynamic, f"gpu-{i}", 2) for i in range(4)] == [1, 1, 2, 2]
    assert [rank(dynamic, f"gpu-{i}", 3) for i in range(4)] == [1, 1, 1, 0]
    static = build.build(devices, node_name="n1")
    # Static: the three in MIG mode offer nothing, and one full GPU makes no set.
    assert [d["name"] for d in _devices(static.slices)] == ["gpu-0"]
    assert rank(static, "gpu-0", 2) is None
