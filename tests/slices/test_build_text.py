"""What the slice builder tells the operator, word for word (the agent logs each problem), and
quantities written the way the API server writes them (in slices and in error messages)."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest

from dra_driver.apimachinery import quantity
from dra_driver.devices import fake, migprofiles, model
from dra_driver.devices.fake import profiles
from dra_driver.slices import build, requestpolicy, shares

from .conftest import devices_of, generated_profile


def with_gpu(devices: model.NodeDevices, minor: int, **changes: object) -> model.NodeDevices:
    gpus = tuple(
        dataclasses.replace(g, **changes) if g.minor == minor else g  # type: ignore[arg-type]
        for g in devices.gpus
    )
    return dataclasses.replace(devices, gpus=gpus)


def generated(gpus: int, *, migs_per_gpu: int = 0) -> model.NodeDevices:
    text = generated_profile(gpus, migs_per_gpu=migs_per_gpu)
    return fake.FakeBackend(profiles.parse(text, source="t")).discover()


def test_a_version_that_is_not_semver_is_left_out_naming_the_device_and_attribute() -> None:
    bad = "banana"
    try:
        build.normalize_version(bad)
    except Exception as exc:  # the semver parser's own wording
        reason = str(exc)
    devices = with_gpu(generated(2, migs_per_gpu=1), 1, driver_version=bad)
    result = build.build(devices, node_name="n1")
    assert result.problems == [
        f"device 'gpu-1-mig-1g-10gb-0': attribute driverVersion omitted: {reason}"
    ]
    devices = with_gpu(generated(2), 0, cuda_driver_version=bad)
    result = build.build(devices, node_name="n1")
    assert result.problems == [f"device 'gpu-0': attribute cudaDriverVersion omitted: {reason}"]
    gpu0 = next(
        d for s in result.slices for d in s["spec"].get("devices") or () if d["name"] == "gpu-0"
    )
    assert "cudaDriverVersion" not in gpu0["attributes"]
    assert gpu0["attributes"]["driverVersion"] == {"version": "580.95.5"}
    dynamic = with_gpu(devices_of("h100-mig"), 0, cuda_driver_version=bad)
    result = build.build(dynamic, node_name="n1", dynamic_mig=migprofiles.DynamicMig.parse("all"))
    # the full GPU of a dynamic-MIG GPU says so once; its placements share its attributes
    assert result.problems == [f"device 'gpu-0': attribute cudaDriverVersion omitted: {reason}"]


def test_a_device_left_out_is_named_with_every_error() -> None:
    devices = with_gpu(generated(3), 1, product_name="X" * 70)
    result = build.build(devices, node_name="n1")
    assert result.problems == [
        "device 'gpu-1' left out of the ResourceSlice: "
        "spec.devices[0].attributes[productName].string: Too long: may not be more than 64 "
        "bytes (device 'gpu-1')"
    ]


def test_a_node_name_that_cannot_make_a_slice() -> None:
    with pytest.raises(build.BuildError) as info:
        build.build(devices_of("pcie-l4"), node_name="N1")
    assert str(info.value).startswith(
        "cannot publish ResourceSlices for node 'N1' with driver 'gpu.nvidia.com': "
        'metadata.name: Invalid value: "N1-gpu.nvidia.com-0": a lowercase RFC 1123 subdomain'
    )
    assert '; spec.nodeName: Invalid value: "N1": a lowercase RFC 1123' in str(info.value)
    with pytest.raises(build.BuildError) as info:
        build.build(devices_of("pcie-l4"), node_name="n1", driver_name="")
    assert str(info.value) == (
        "cannot publish ResourceSlices for node 'n1' with driver '': spec.driver: Required value"
    )


def test_shareable_problems() -> None:
    dynamic = build.build(
        devices_of("dgx-h100"),
        node_name="n1",
        dynamic_mig=migprofiles.DynamicMig.parse("all"),
        shareable=shares.Shareable.parse("all"),
    )
    assert dynamic.problems[0] == (
        "GPU gpu-0 (NVIDIA H100 80GB HBM3) is published for dynamic MIG; --shareable does not "
        "apply to it (its full GPU is exclusive)"
    )
    small = with_gpu(generated(2), 1, memory_bytes=(2 << 30) - 1)
    result = build.build(small, node_name="n1", shareable=shares.Shareable.parse("all"))
    assert result.problems == ["device 'gpu-1' has too little memory to share; published exclusive"]
    by_name = {d["name"]: d for s in result.slices for d in s["spec"].get("devices") or ()}
    assert "allowMultipleAllocations" not in by_name["gpu-1"]
    assert by_name["gpu-0"]["allowMultipleAllocations"] is True


def test_a_gpu_dynamic_mig_wants_but_cannot_have() -> None:
    devices = fake.FakeBackend.from_name("h100-nvl-pairs").discover()
    built = build.build(devices, node_name="n1", dynamic_mig=migprofiles.DynamicMig.parse("h100"))
    gpu = devices.gpus[0]
    assert built.problems[0] == (
        f"GPU {gpu.name} ({gpu.product_name}) matches --dynamic-mig 'h100' but NVML lists no MIG "
        "profile placements for it; published as it is"
    )
    everything = build.build(
        devices, node_name="n1", dynamic_mig=migprofiles.DynamicMig.parse("all")
    )
    assert everything.problems == []  # "all" takes what it can, quietly


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0, "0"),
        (1, "1"),
        (1023, "1023"),
        (1 << 10, "1Ki"),
        (3 << 20, "3Mi"),
        (80 << 30, "80Gi"),
        (1536 << 20, "1536Mi"),
        (2 << 40, "2Ti"),
        (5 << 50, "5Pi"),
        (1 << 60, "1Ei"),
        ((1 << 60) + (1 << 10), f"{(1 << 50) + 1}Ki"),
    ],
)
def test_byte_quantities(value: int, text: str) -> None:
    assert build.bytes_quantity(value) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0, "0"),
        (7, "7"),
        (98, "98"),
        (1500, "1500"),
        (2000, "2k"),
        (3 * 10**6, "3M"),
        (4 * 10**9, "4G"),
        (5 * 10**12, "5T"),
        (6 * 10**15, "6P"),
        (7 * 10**18, "7E"),
        (1024, "1024"),
    ],
)
def test_count_quantities(value: int, text: str) -> None:
    assert build.count_quantity(value) == text


@pytest.mark.parametrize(
    ("given", "shown"),
    [
        ("1Ki", "1Ki"),
        ("2048", "2048"),
        ("1024Ki", "1Mi"),
        ("1536Mi", "1536Mi"),
        ("1.5Gi", "1536Mi"),
        ("3Gi", "3Gi"),
        ("2048Gi", "2Ti"),
        ("1024Ti", "1Pi"),
        ("4096Pi", "4Ei"),
        ("1025Ki", "1025Ki"),
        ("1000", "1k"),
        ("1500", "1500"),
        ("1.5k", "1500"),
        ("2000k", "2M"),
        ("3000M", "3G"),
        ("4000G", "4T"),
        ("5000T", "5P"),
        ("6000P", "6E"),
        ("12", "12"),
        ("0", "0"),
        ("-2Gi", "-2Gi"),
        ("-1", "-1"),
        ("-1500", "-1500"),
        ("500m", "500m"),
        ("1.5", "1500m"),
        ("0.5Ki", "512"),  # binary suffixes from 1Ki up
        ("1.5Ki", "1536"),
        ("1n", "1n"),
        ("2u", "2u"),
        ("1e3", "1e3"),  # written with an exponent: shown with one
        ("12e-3", "12e-3"),
        ("1e0", "1"),
    ],
)
def test_request_policy_messages_show_quantities_like_the_server(given: str, shown: str) -> None:
    assert requestpolicy.shown(quantity.parse_quantity(given)) == shown


def test_share_of_defaults_and_errors() -> None:
    assert shares.share_of({}, driver="gpu.nvidia.com") == shares.Share(0, 0)
    assert shares.share_of({"memory": "2Gi"}, driver="gpu.nvidia.com") == shares.Share(2 << 30, 0)
    assert shares.share_of(
        {"gpu.nvidia.com/computeShare": "100", "other.com/memory": "1Gi", "cores": "x"},
        driver="gpu.nvidia.com",
    ) == shares.Share(0, 100)
    with pytest.raises(ValueError) as info:
        shares.share_of({"computeShare": "101"}, driver="gpu.nvidia.com")
    assert str(info.value) == "consumedCapacity[computeShare] 101 is above 100"
    with pytest.raises(ValueError) as info:
        shares.share_of({"gpu.nvidia.com/memory": "lots"}, driver="gpu.nvidia.com")
    assert str(info.value).startswith("consumedCapacity[gpu.nvidia.com/memory] 'lots' is not a ")
    assert "quantity: " in str(info.value)
    with pytest.raises(ValueError) as info:
        shares.share_of({"memory": "-1"}, driver="gpu.nvidia.com")
    assert str(info.value) == "consumedCapacity[memory] '-1' is not a whole, positive amount"
    assert shares.share_of({"memory": "0"}, driver="gpu.nvidia.com") == shares.Share(0, 0)


def test_slice_names_pad_the_index_and_hash_names_too_long_for_the_api() -> None:
    assert build.slice_name("n1", "gpu.nvidia.com", 0) == "n1-gpu.nvidia.com-0"
    assert build.slice_name("n1", "gpu.nvidia.com", 0, 0) == "n1-gpu.nvidia.com-0"
    assert build.slice_name("n1", "gpu.nvidia.com", 3, 10) == "n1-gpu.nvidia.com-3"
    assert build.slice_name("n1", "gpu.nvidia.com", 3, 11) == "n1-gpu.nvidia.com-03"
    assert build.slice_name("n1", "gpu.nvidia.com", 7, 101) == "n1-gpu.nvidia.com-007"
    fits = "a" * (253 - len("-gpu.nvidia.com-0"))
    assert build.slice_name(fits, "gpu.nvidia.com", 0) == f"{fits}-gpu.nvidia.com-0"
    node = "a" * 199 + "-" + "b" * 40
    digest = hashlib.sha256(f"{node}/GPU.nvidia.com".encode()).hexdigest()[:10]
    assert build.slice_name(node, "GPU.nvidia.com", 1, 12) == f"{'a' * 199}-{digest}-01"
    node = "c" * 199 + "." + "d" * 60
    digest = hashlib.sha256(f"{node}/gpu.nvidia.com".encode()).hexdigest()[:10]
    assert build.slice_name(node, "gpu.nvidia.com", 0) == f"{'c' * 199}-{digest}-0"
    node = "e" * 250
    digest = hashlib.sha256(f"{node}/gpu.nvidia.com".encode()).hexdigest()[:10]
    assert build.slice_name(node, "gpu.nvidia.com", 0) == f"{'e' * 200}-{digest}-0"


def test_a_slice_with_an_owner_and_one_with_counters() -> None:
    built = build.build(devices_of("pcie-l4"), node_name="n1", node_uid="uid-1", generation=4)
    (first,) = built.slices  # set ranks need no counters: one slice of devices
    assert first["apiVersion"] == "resource.k8s.io/v1" and first["kind"] == "ResourceSlice"
    assert first["metadata"] == {
        "name": "n1-gpu.nvidia.com-0",
        "ownerReferences": [
            {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "uid-1", "controller": True}
        ],
    }
    assert first["spec"]["driver"] == "gpu.nvidia.com" and first["spec"]["nodeName"] == "n1"
    assert first["spec"]["pool"] == {"name": "n1", "generation": 4, "resourceSliceCount": 1}
    assert "sharedCounters" not in first["spec"] and len(first["spec"]["devices"]) == 4
    dynamic = build.build(
        devices_of("h100-mig"), node_name="n1", dynamic_mig=migprofiles.DynamicMig.parse("all")
    ).slices
    counters, devices = dynamic  # dynamic MIG: its counter sets first, in a slice of their own
    assert "devices" not in counters["spec"]
    assert [c["name"] for c in counters["spec"]["sharedCounters"]] == ["gpu-0-mig", "gpu-1-mig"]
    assert "sharedCounters" not in devices["spec"] and devices["spec"]["devices"]
    assert counters["spec"]["pool"]["resourceSliceCount"] == 2
    plain = build.build(devices_of("pcie-l4"), node_name="n1", gpu_sets=False).slices[0]
    assert "ownerReferences" not in plain["metadata"]


def test_devices_follow_the_gpu_minors_whatever_order_nvml_lists_them_in() -> None:
    devices = devices_of("dgx-h100")
    shuffled = dataclasses.replace(devices, gpus=tuple(reversed(devices.gpus)))
    assert (
        build.build(shuffled, node_name="n1").slices == build.build(devices, node_name="n1").slices
    )
    names = [d["name"] for d in build.device_entries(shuffled)]
    assert names == [f"gpu-{i}" for i in range(8)]
    mig = devices_of("a100-mig")
    gpus = [dataclasses.replace(g, mig_devices=tuple(reversed(g.mig_devices))) for g in mig.gpus]
    assert any(len(g.mig_devices) > 1 for g in gpus)
    shuffled = dataclasses.replace(mig, gpus=tuple(reversed(gpus)))
    assert build.device_entries(shuffled) == build.device_entries(mig)


def test_set_ranks_are_int_attributes_in_the_sorted_attribute_order() -> None:
    built = build.build(devices_of("h100-nvl-pairs"), node_name="n1", taken=("gpu-0",))
    published = {d["name"]: d for s in built.slices for d in s["spec"].get("devices") or ()}
    gpu0, gpu1 = published["gpu-0"]["attributes"], published["gpu-1"]["attributes"]
    assert list(gpu0) == sorted(gpu0)
    assert [k for k in gpu0 if k.startswith("setRank")] == ["setRanks"]  # one, all sizes
    assert gpu0["setRanks"] == {"int": 0}  # taken: rank 0 for every size
    # gpu-1 is left alone beside the bridged pair gpu-2/gpu-3: no pair, but in the trio (digit
    # 3), and the first single GPU to take (digit 1): 100 + 0 * 10 + 1.
    assert gpu1["setRanks"] == {"int": 101}
    assert published["gpu-2"]["attributes"]["setRanks"]["int"] // 10 % 10 == 1


def test_a_device_a_decorating_pass_breaks_is_left_out_and_named() -> None:
    def bad_taint(devices: list[dict[str, object]]) -> None:
        for device in devices:
            if device["name"] == "gpu-1":
                device["taints"] = [{"key": "k", "effect": "Sometimes"}]

    result = build.build(devices_of("pcie-l4"), node_name="n1", decorate=bad_taint, gpu_sets=False)
    assert result.problems == [
        "device 'gpu-1' left out of the ResourceSlice: spec.devices[0].taints[0].effect: "
        'Unsupported value: "Sometimes": supported values: "NoExecute", "NoSchedule", "None" '
        "(device 'gpu-1')"
    ]
    names = [d["name"] for s in result.slices for d in s["spec"]["devices"]]
    assert "gpu-1" not in names and "gpu-0" in names
