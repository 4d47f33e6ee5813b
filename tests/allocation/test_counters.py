"""Shared counters as kube-scheduler books them, and the scheduler's search order around them."""

from __future__ import annotations

from typing import Any

import pytest
from claimkit import DRIVER, NODE, WHOLE_GPU_CLASS, Obj, device, device_class, rclaim, request
from claimkit import rslice as device_slice

from dra_driver.allocation import allocator, pools, simulator
from dra_driver.devices import fake
from dra_driver.slices import build

SET_CLASS = device_class(
    "set", f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "gpu-set"'
)


def counter_slice(*sets: Obj, name: str = "s-counters", count: int = 2) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": DRIVER,
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": count},
            "sharedCounters": list(sets),
        },
    }


def consuming(name: str, *counters: str, set_name: str = "gpus", **attrs: Any) -> Obj:
    dev = device(name, **attrs)
    dev["consumesCounters"] = [
        {"counterSet": set_name, "counters": {c: {"value": "1"} for c in counters}}
    ]
    return dev


GPUS = {"name": "gpus", "counters": {f"gpu-{i}": {"value": "1"} for i in range(4)}}
DEVICES = [
    consuming("gpu-0", "gpu-0", type="gpu"),
    consuming("gpu-1", "gpu-1", type="gpu"),
    consuming("gpu-2", "gpu-2", type="gpu"),
    consuming("gpu-3", "gpu-3", type="gpu"),
    consuming("gpus-1-2", "gpu-1", "gpu-2", type="gpu-set"),
    consuming("gpus-0-1", "gpu-0", "gpu-1", type="gpu-set"),
]


def alloc(the_claim: Obj, slices: list[Obj] | None = None, **kw: Any) -> allocator.Outcome:
    return allocator.allocate(
        the_claim,
        slices=slices or [counter_slice(GPUS), device_slice(DEVICES, name="s-devices", count=2)],
        classes=[WHOLE_GPU_CLASS, SET_CLASS],
        node_name=NODE,
        **kw,
    )


def picked(outcome: allocator.Outcome) -> list[str]:
    assert outcome.allocation is not None, outcome.explanation
    return [r["device"] for r in outcome.allocation["devices"]["results"]]


def used(*names: str) -> set[pools.DeviceId]:
    return {(DRIVER, NODE, n) for n in names}


def test_an_allocated_gpu_blocks_every_set_holding_it() -> None:
    assert picked(alloc(rclaim(request("s", cls="set")))) == ["gpus-1-2"]
    assert picked(alloc(rclaim(request("s", cls="set")), allocated=used("gpu-2"))) == ["gpus-0-1"]
    blocked = alloc(rclaim(request("s", cls="set")), allocated=used("gpu-1"))
    assert not blocked.allocated
    assert any("its shared counter is used up" in line for line in blocked.explanation)


def test_an_allocated_set_blocks_its_gpus() -> None:
    taken = used("gpus-1-2")
    assert picked(alloc(rclaim(request("g", count=2)), allocated=taken)) == ["gpu-0", "gpu-3"]
    assert not alloc(rclaim(request("g", count=3)), allocated=taken).allocated


def test_devices_of_one_claim_never_share_a_counter() -> None:
    both = rclaim(request("s", cls="set"), request("g", count=2))
    # gpus-1-2 first; then the first two GPUs whose counters are left: gpu-0 and gpu-3.
    assert picked(alloc(both)) == ["gpus-1-2", "gpu-0", "gpu-3"]
    # With three GPUs wanted there is no room next to gpus-1-2: the search backtracks to the
    # next set, gpus-0-1, and takes gpu-2 and gpu-3.
    three = rclaim(request("s", cls="set"), request("g", count=2), request("h"))
    assert not alloc(three).allocated
    two_and_set = rclaim(request("g", count=2), request("s", cls="set"))
    assert picked(alloc(two_and_set)) == ["gpu-0", "gpu-3", "gpus-1-2"]


def test_an_overdrawn_counter_blocks_every_consuming_device_of_the_pool() -> None:
    # Two allocated devices share gpu-1 (an inconsistent state): the scheduler then treats the
    # pool's counters as exhausted for every device that consumes any.
    outcome = alloc(rclaim(request("g")), allocated=used("gpu-1", "gpus-0-1"))
    assert not outcome.allocated


@pytest.mark.parametrize(
    ("sets", "consumer", "reason"),
    [
        ([GPUS], consuming("x", "gpu-9", type="gpu"), "counter gpu-9 not found in counter set"),
        ([GPUS], consuming("x", "gpu-0", set_name="nope", type="gpu"), "counter set nope not"),
        ([GPUS, GPUS], consuming("x", "gpu-0", type="gpu"), "duplicate counter set name gpus"),
    ],
)
def test_counters_the_pool_cannot_honour_make_it_invalid(
    sets: list[Obj], consumer: Obj, reason: str
) -> None:
    slices = [counter_slice(*sets), device_slice([consumer], name="s-devices", count=2)]
    outcome = alloc(rclaim(request("g")), slices)
    assert not outcome.allocated
    assert any(reason in line for line in outcome.explanation), outcome.explanation


def test_a_pool_without_its_counter_slice_is_incomplete() -> None:
    outcome = alloc(rclaim(request("g")), [device_slice(DEVICES, name="s-devices", count=2)])
    assert not outcome.allocated
    assert "incomplete" in outcome.explanation[0]


def test_counter_slices_count_even_when_they_name_another_node() -> None:
    elsewhere = counter_slice(GPUS)
    elsewhere["spec"]["nodeName"] = "node-2"
    slices = [elsewhere, device_slice(DEVICES, name="s-devices", count=2)]
    assert picked(alloc(rclaim(request("g")), slices)) == ["gpu-0"]


def test_each_request_tries_combinations_in_device_order() -> None:
    """One request's devices are tried as combinations in slice order (the second device
    after the first); the next request starts over from the first device."""
    devs = [device(f"gpu-{i}", type="gpu", numa=i % 2) for i in range(5)]
    numa = {"matchAttribute": "resource.kubernetes.io/numaNode", "requests": ["a"]}
    outcome = alloc(
        rclaim(request("a", count=2), request("b"), constraints=[numa]),
        [device_slice(devs)],
        allocated=used("gpu-0"),
    )
    assert picked(outcome) == ["gpu-1", "gpu-3", "gpu-2"]


def test_admin_access_skips_only_what_this_claim_takes() -> None:
    devs = [device(f"gpu-{i}", type="gpu") for i in range(2)]
    admin = rclaim(request("g", admin=True, count=2))
    assert picked(alloc(admin, [device_slice(devs)], allocated=used("gpu-0", "gpu-1"))) == [
        "gpu-0",
        "gpu-1",
    ]
    mixed = rclaim(request("a", admin=True), request("b"))
    # a takes gpu-0 (admin access); b may not take a device this claim already holds.
    assert picked(alloc(mixed, [device_slice(devs)])) == ["gpu-0", "gpu-1"]


def test_the_published_slices_of_a_profile_carry_no_counters() -> None:
    """Counters make the scheduler read this node's pool for every node it filters (1.36): the
    agent publishes them only for dynamic MIG, not for whole GPUs (docs/topology.md)."""
    devices = fake.FakeBackend.from_name("h100-nvl-pairs").discover()
    slices = build.build(devices, node_name=NODE).slices
    assert [s["spec"].get("sharedCounters") for s in slices] == [None]
    assert not any(d.get("consumesCounters") for s in slices for d in s["spec"]["devices"])
    the_claim = rclaim(request("s", cls="gpu-set.nvidia.com"))
    classes = simulator.builtin_classes()
    assert not allocator.allocate(
        the_claim, slices=slices, classes=classes, node_name=NODE
    ).allocated
