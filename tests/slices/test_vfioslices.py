"""--passthrough: the selection grammar, the server-feature rules and the IOMMU-less GPU."""

from __future__ import annotations

import dataclasses

import pytest

from dra_driver.devices import fake, gpuselect, passthrough
from dra_driver.slices import build, vfioslices


def test_the_grammar_is_the_one_of_the_other_selection_flags() -> None:
    assert passthrough.Passthrough.parse(None).text == "none"
    assert passthrough.Passthrough.parse("ALL").text == "all"
    assert passthrough.Passthrough.parse("auto:H100").auto
    assert passthrough.Passthrough.parse("auto:H100").text == "auto:H100"
    for bad, words in (("auto", "say which GPUs"), ("auto:", "auto: needs"), ("(", "regular")):
        with pytest.raises(gpuselect.SelectionError, match=words) as err:
            passthrough.Passthrough.parse(bad)
        assert "--passthrough" in str(err.value)


def test_product_selection_marks_only_matching_gpus() -> None:
    devices = fake.FakeBackend.from_name("dgx-h100").discover()
    assert passthrough.marked(passthrough.mark(devices, passthrough.Passthrough.parse("L4"))) == []
    marked = passthrough.mark(devices, passthrough.Passthrough.parse("h100"))
    assert len(passthrough.marked(marked)) == 8
    assert passthrough.marked(passthrough.mark(marked, passthrough.NONE)) == []


def test_a_gpu_without_an_iommu_group_is_not_offered_and_says_why() -> None:
    devices = fake.FakeBackend.from_name("pcie-l4").discover()
    gpus = (dataclasses.replace(devices.gpus[0], iommu_group=None), *devices.gpus[1:])
    problems: list[str] = []
    marked = passthrough.mark(
        dataclasses.replace(devices, gpus=gpus), passthrough.Passthrough.parse("all"), problems
    )
    assert [g.name for g in passthrough.marked(marked)] == ["gpu-1", "gpu-2", "gpu-3"]
    assert len(problems) == 1 and "gpu-0" in problems[0] and "IOMMU" in problems[0]


def test_explicit_selection_is_refused_where_counters_are_dropped_and_auto_turns_off() -> None:
    devices = fake.FakeBackend.from_name("pcie-l4").discover()
    explicit = passthrough.Passthrough.parse("all")
    auto = passthrough.Passthrough.parse("auto:all")
    why = vfioslices.refusal(False, devices, explicit, server="https://api:6443")
    assert "DRAPartitionableDevices" in why and "--passthrough auto:all" in why
    assert vfioslices.refusal(True, devices, explicit) == ""
    assert vfioslices.refusal(False, devices, auto) == ""
    assert vfioslices.resolve(False, auto) == passthrough.NONE
    assert vfioslices.resolve(True, auto) == auto
    assert vfioslices.resolve(False, explicit) == explicit


def test_the_dgx_profiles_have_a_group_per_gpu_and_one_profile_shares_a_group() -> None:
    for name in ("dgx-h100", "dgx-1-v100"):
        groups = [g.iommu_group for g in fake.FakeBackend.from_name(name).discover().gpus]
        assert None not in groups and len(set(groups)) == len(groups)
    shared = fake.FakeBackend.from_name("pcie-l4-shared-iommu").discover()
    assert [g.iommu_group for g in shared.gpus] == [20, 20, 30, 31]


def test_no_passthrough_publishes_exactly_what_it_did_before() -> None:
    devices = fake.FakeBackend.from_name("dgx-h100").discover()
    plain = build.build(devices, node_name="n1").slices
    none = build.build(passthrough.mark(devices, passthrough.NONE), node_name="n1").slices
    assert plain == none
    assert vfioslices.names_in(plain) == []


def test_an_unhealthy_gpus_passthrough_device_is_tainted_too() -> None:
    from dra_driver.devices import health
    from dra_driver.slices import taints

    devices = passthrough.mark(
        fake.FakeBackend.from_name("pcie-l4").discover(), passthrough.Passthrough.parse("all")
    )
    board = health.HealthBoard()
    gpu = devices.gpus[1]
    board.set_conditions(
        gpu.uuid, [health.Condition(kind="xid", value="79", effect="NoExecute", message="off bus")]
    )
    built = build.build(
        devices, node_name="n1", decorate=taints.decorator(board.snapshot(), "gpu.nvidia.com")
    )
    by_name = {d["name"]: d for s in built.slices for d in s["spec"].get("devices", [])}
    assert by_name["gpu-1"].get("taints") and by_name["gpu-vfio-1"].get("taints")
    assert not by_name["gpu-vfio-0"].get("taints")
    names = taints.published_uuids(devices, node_name="n1", driver_name="gpu.nvidia.com")
    assert names["gpu-vfio-1"] == (gpu.uuid,)  # prepare's taint check sees it
