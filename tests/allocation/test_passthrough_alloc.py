"""Passthrough and the scheduler: one GPU never goes to a container claim and a VM claim at once.

Over the slices the agent publishes with ``--passthrough`` (``gpu-vfio-<minor>`` devices sharing
a counter with their GPU), the project's allocator — which books counters as kube-scheduler
1.36 does (:mod:`dra_driver.allocation.counters`, checked against recorded real picks in
test_real_allocations.py) — is asked for both kinds of claim, in both orders, across claims and
inside one claim, for each composition: a whole GPU, a MIG device (dynamic and static MIG), a
share of a shareable GPU. Each must refuse the second claim for the same GPU and allow it on
another GPU.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from dra_driver.allocation import allocator, simulator
from dra_driver.devices import fake, migprofiles, model, passthrough
from dra_driver.slices import build, shares, vfioslices

DRIVER = "gpu.nvidia.com"
NODE = "n1"
ALL = passthrough.Passthrough.parse("all")
Obj = dict[str, Any]


def node(profile: str) -> model.NodeDevices:
    return passthrough.mark(fake.FakeBackend.from_name(profile).discover(), ALL)


def claim(name: str, klass: str, *selectors: str, capacity: Obj | None = None) -> Obj:
    exactly: Obj = {
        "deviceClassName": klass,
        "selectors": [{"cel": {"expression": s}} for s in selectors],
    }
    if capacity is not None:
        exactly["capacity"] = capacity
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "t"},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": exactly}]}},
    }


def on(gpu: model.Gpu, key: str = "uuid") -> str:
    return f'device.attributes["{DRIVER}"].{key} == "{gpu.uuid}"'


def vm(name: str, gpu: model.Gpu | None = None) -> Obj:
    return claim(name, passthrough.DEVICE_CLASS, *([on(gpu)] if gpu else []))


def container(name: str, gpu: model.Gpu | None = None) -> Obj:
    return claim(name, "gpu.nvidia.com", *([on(gpu)] if gpu else []))


def run(
    devices: model.NodeDevices,
    claims: list[Obj],
    *,
    dynamic: migprofiles.DynamicMig = migprofiles.STATIC,
    shareable: shares.Shareable = shares.NONE,
) -> list[allocator.Outcome]:
    slices = simulator.fake_slices(
        devices, node_name=NODE, driver_name=DRIVER, dynamic_mig=dynamic, shareable=shareable
    )
    inputs = simulator.Inputs(
        claims=claims,
        classes=simulator.builtin_classes(),
        slices=slices,
        node_name=NODE,
        allocated=set(),
        node_devices=devices,
    )
    return simulator.run(inputs, share_rng=random.Random(1))


def picked(outcome: allocator.Outcome) -> list[str]:
    assert outcome.allocation is not None, outcome.explanation
    return [r["device"] for r in outcome.allocation["devices"]["results"]]


def refused(outcome: allocator.Outcome) -> bool:
    return outcome.allocation is None


def test_every_selected_gpu_is_published_twice_with_the_vm_attributes() -> None:
    devices = node("dgx-h100")
    built = build.build(devices, node_name=NODE)
    assert not built.problems
    names = vfioslices.names_in(built.slices)
    assert names == [f"gpu-vfio-{g.minor}" for g in devices.gpus]
    entry = next(
        d for s in built.slices for d in s["spec"].get("devices", []) if d["name"] == "gpu-vfio-3"
    )
    attrs = entry["attributes"]
    gpu = devices.gpus[3]
    assert attrs["resource.kubernetes.io/pciBusID"] == {"string": gpu.pci_bus_id}
    assert attrs["resource.kubernetes.io/pcieRoot"] == {"string": gpu.pcie_root}
    assert attrs["resource.kubernetes.io/numaNode"] == {"int": gpu.numa_node}
    assert attrs["iommuGroup"] == {"int": gpu.iommu_group}
    assert attrs["productName"] == {"string": gpu.product_name}
    assert attrs["type"] == {"string": "vfio"}
    assert entry["capacity"] == {"memory": {"value": "80Gi"}}


def test_whole_gpu_and_passthrough_exclude_each_other_in_both_orders() -> None:
    devices = node("pcie-l4")
    g0, g1 = devices.gpus[0], devices.gpus[1]
    first = run(devices, [container("pod", g0), vm("vm-same", g0), vm("vm-other", g1)])
    assert picked(first[0]) == ["gpu-0"]
    assert refused(first[1])
    assert picked(first[2]) == ["gpu-vfio-1"]
    second = run(devices, [vm("vm", g0), container("pod-same", g0), container("pod-any")])
    assert picked(second[0]) == ["gpu-vfio-0"]
    assert refused(second[1])
    assert picked(second[2]) != ["gpu-0"]


def test_a_full_node_of_vms_leaves_no_gpu_for_containers() -> None:
    devices = node("pcie-l4")
    outcomes = run(devices, [vm(f"vm-{i}") for i in range(4)] + [container("pod")])
    assert sorted(d for o in outcomes[:4] for d in picked(o)) == [
        f"gpu-vfio-{g.minor}" for g in devices.gpus
    ]
    assert refused(outcomes[4])


def test_one_claim_cannot_take_a_gpu_both_ways() -> None:
    devices = node("pcie-l4")
    g0 = devices.gpus[0]
    both = claim("both", "gpu.nvidia.com", on(g0))
    both["spec"]["devices"]["requests"].append(
        {
            "name": "v",
            "exactly": {
                "deviceClassName": passthrough.DEVICE_CLASS,
                "selectors": [{"cel": {"expression": on(g0)}}],
            },
        }
    )
    assert refused(run(devices, [both])[0])


def test_dynamic_mig_device_and_passthrough_exclude_each_other() -> None:
    devices = node("h100-mig")
    g0 = devices.gpus[0]
    dynamic = migprofiles.DynamicMig.parse("all")
    mig = claim(
        "mig",
        "mig.nvidia.com",
        on(g0, "parentUUID"),
        f'device.attributes["{DRIVER}"].profile == "1g.10gb"',
    )
    first = run(devices, [mig, vm("vm-same", g0)], dynamic=dynamic)
    assert picked(first[0])[0].startswith("gpu-0-mig-1g-10gb-")
    assert refused(first[1])
    second = run(devices, [vm("vm", g0), mig], dynamic=dynamic)
    assert picked(second[0]) == ["gpu-vfio-0"]
    assert refused(second[1])


def test_static_mig_devices_and_passthrough_exclude_each_other() -> None:
    devices = node("a100-mig")
    parent = next(g for g in devices.gpus if g.mig_enabled and g.mig_devices)
    name = model.mig_device_name(parent, parent.mig_devices[0])
    mig = claim(
        "mig",
        "mig.nvidia.com",
        f'device.attributes["{DRIVER}"].uuid == "{parent.mig_devices[0].uuid}"',
    )
    first = run(devices, [mig, vm("vm-same", parent)])
    assert picked(first[0]) == [name]
    assert refused(first[1])
    second = run(devices, [vm("vm", parent), mig])
    assert picked(second[0]) == [f"gpu-vfio-{parent.minor}"]
    assert refused(second[1])


def test_share_and_passthrough_exclude_each_other() -> None:
    devices = node("h100-nvl-pairs")
    g0 = devices.gpus[0]
    shareable = shares.Shareable.parse("all")
    share = claim("share", "gpu.nvidia.com", on(g0), capacity={"requests": {"memory": "10Gi"}})
    share2 = claim("share2", "gpu.nvidia.com", on(g0), capacity={"requests": {"memory": "10Gi"}})
    first = run(devices, [share, share2, vm("vm-same", g0)], shareable=shareable)
    assert picked(first[0]) == ["gpu-0"]
    assert picked(first[1]) == ["gpu-0"]  # shares still share: the counter is booked once
    assert refused(first[2])
    second = run(devices, [vm("vm", g0), share], shareable=shareable)
    assert picked(second[0]) == ["gpu-vfio-0"]
    assert refused(second[1])


@pytest.mark.parametrize("profile", ["dgx-h100", "h100-mig", "a100-mig", "pcie-l4"])
def test_slices_keep_the_api_rules_and_every_counter_resolves(profile: str) -> None:
    from dra_driver.apimachinery import quantity
    from dra_driver.slices import migslices, validate

    devices = node(profile)
    for dynamic in (migprofiles.STATIC, migprofiles.DynamicMig.parse("all")):
        built = build.build(devices, node_name=NODE, dynamic_mig=dynamic)
        for s in built.slices:
            assert validate.validate(s) == []
        parse = lambda t: quantity.parse_quantity(t).nanos  # noqa: E731
        assert migslices.check_references(built.slices, parse) == []
        assert len(vfioslices.names_in(built.slices)) == len(devices.gpus)
