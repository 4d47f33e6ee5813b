"""Allocating one claim on one node: the scheduler's rules, topology choice, result shape."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from claimkit import (
    DRIVER,
    GPU_CLASS,
    NODE,
    WHOLE_GPU_CLASS,
    Obj,
    device,
    device_class,
    first_available,
    rclaim,
    request,
    rslice,
)
from conftest import ProfileSlices

from dra_driver.allocation import allocator, claim, pools

PRODUCT = 'device.attributes["gpu.nvidia.com"].productName'

MIXED = [
    device(
        "gpu-0",
        productName="NVIDIA L4",
        memory="23034Mi",
        numa=0,
        root="pci0000:00",
        driverVersion=("version", "535.104.12"),
    ),
    device(
        "gpu-1",
        productName="NVIDIA H100 80GB HBM3",
        numa=0,
        root="pci0000:00",
        driverVersion=("version", "580.95.5"),
        nvlinkIsland="island-1",
    ),
    device(
        "gpu-2",
        productName="NVIDIA H100 80GB HBM3",
        numa=1,
        root="pci0000:80",
        driverVersion=("version", "580.95.5"),
        nvlinkIsland="island-1",
    ),
    device(
        "gpu-3",
        productName="NVIDIA A100-SXM4-40GB",
        memory="40Gi",
        numa=1,
        root="pci0000:80",
        driverVersion=("version", "550.54.15"),
    ),
]


def alloc(
    the_claim: Obj,
    slices: Sequence[Obj] | None = None,
    *,
    classes: Sequence[Obj] = (GPU_CLASS,),
    allocated: Sequence[pools.DeviceId] = (),
    **kwargs: Any,
) -> allocator.Outcome:
    return allocator.allocate(
        the_claim,
        slices=slices if slices is not None else [rslice(MIXED)],
        classes=classes,
        node_name=NODE,
        allocated=allocated,
        **kwargs,
    )


def best(
    the_claim: Obj,
    slices: Sequence[Obj] | None = None,
    *,
    classes: Sequence[Obj] = (GPU_CLASS,),
    allocated: Sequence[pools.DeviceId] = (),
    **kwargs: Any,
) -> allocator.Outcome:
    """The optimum (``simulate --explain``), not the scheduler's pick."""
    ctx = allocator.prepare(
        the_claim,
        slices=slices if slices is not None else [rslice(MIXED)],
        classes=classes,
        node_name=NODE,
        allocated=allocated,
        **kwargs,
    )
    return allocator.optimum(ctx)


def picked(outcome: allocator.Outcome) -> list[tuple[str, str]]:
    assert outcome.allocation is not None, outcome.explanation
    return [(r["request"], r["device"]) for r in outcome.allocation["devices"]["results"]]


# --- CEL selectors (class and request) ---------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "want"),
    [
        (f'{PRODUCT} == "NVIDIA L4"', ["gpu-0"]),
        (f'{PRODUCT}.startsWith("NVIDIA A100")', ["gpu-3"]),
        (
            'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0',
            ["gpu-1", "gpu-2", "gpu-3"],
        ),
        ('device.capacity["gpu.nvidia.com"].memory.isLessThan(quantity("24Gi"))', ["gpu-0"]),
        (
            'device.attributes["gpu.nvidia.com"].driverVersion.isGreaterThan(semver("550.0.0"))',
            ["gpu-1", "gpu-2", "gpu-3"],
        ),
        (
            'device.attributes["gpu.nvidia.com"].driverVersion.compareTo(semver("550.54.15")) == 0',
            ["gpu-3"],
        ),
        ('device.attributes["resource.kubernetes.io"].numaNode == 1', ["gpu-2", "gpu-3"]),
    ],
)
def test_request_selectors(selector: str, want: list[str]) -> None:
    outcome = alloc(rclaim(request("gpu", selector, count=len(want))))
    assert sorted(d for _, d in picked(outcome)) == want
    # One more than matches is unsatisfiable.
    assert not alloc(rclaim(request("gpu", selector, count=len(want) + 1))).allocated


def test_class_selectors_apply_before_request_selectors() -> None:
    h100 = device_class("h100", f'{PRODUCT}.startsWith("NVIDIA H100")')
    outcome = alloc(rclaim(request("gpu", cls="h100", count=2)), classes=[h100])
    assert [d for _, d in picked(outcome)] == ["gpu-1", "gpu-2"]
    assert not alloc(
        rclaim(request("gpu", f'{PRODUCT} == "NVIDIA L4"', cls="h100")), classes=[h100]
    ).allocated


def test_unknown_class_is_an_explained_failure() -> None:
    outcome = alloc(rclaim(request("gpu", cls="nope")))
    assert not outcome.allocated
    assert outcome.explanation == ("request gpu: device class nope not found",)


def test_selector_that_does_not_compile_is_a_claim_error() -> None:
    with pytest.raises(claim.ClaimError, match=r"request gpu: selectors\[0\].*device\.nope"):
        alloc(rclaim(request("gpu", "device.nope == 1")))
    with pytest.raises(claim.ClaimError, match=r"DeviceClass bad: spec.selectors\[0\]"):
        alloc(rclaim(request("gpu", cls="bad")), classes=[device_class("bad", '"x"')])


# --- in-use devices, adminAccess, taints --------------------------------------------------


def test_devices_allocated_to_other_claims_are_excluded() -> None:
    used = [(DRIVER, NODE, "gpu-0"), (DRIVER, NODE, "gpu-1")]
    outcome = alloc(rclaim(request("gpu", count=2)), allocated=used)
    assert [d for _, d in picked(outcome)] == ["gpu-2", "gpu-3"]
    assert not alloc(rclaim(request("gpu", count=3)), allocated=used).allocated
    # Same names in another pool or driver do not count.
    other = [("other.example.com", NODE, "gpu-0"), (DRIVER, "other-pool", "gpu-1")]
    assert len(picked(alloc(rclaim(request("gpu", count=4)), allocated=other))) == 4


def test_admin_access_may_use_allocated_devices_but_not_twice_in_one_claim() -> None:
    used = [(DRIVER, NODE, f"gpu-{i}") for i in range(4)]
    outcome = alloc(rclaim(request("gpu", count=4, admin=True)), allocated=used)
    assert outcome.allocation is not None
    results = outcome.allocation["devices"]["results"]
    assert [r["device"] for r in results] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert all(r["adminAccess"] is True for r in results)
    assert not alloc(rclaim(request("gpu", count=5, admin=True)), allocated=used).allocated
    both = rclaim(request("a", count=2, admin=True), request("b", count=2))
    assert not alloc(both, allocated=used[:3]).allocated  # b finds one free device only
    # a may take the busy gpu-0 and gpu-1, which leaves the two free ones to b.
    assert picked(alloc(both, allocated=used[:2])) == [
        ("a", "gpu-0"),
        ("a", "gpu-1"),
        ("b", "gpu-2"),
        ("b", "gpu-3"),
    ]


def test_taints_need_tolerations() -> None:
    tainted = [dict(d) for d in MIXED]
    tainted[0] = {**tainted[0], "taints": [{"key": "xid", "value": "79", "effect": "NoSchedule"}]}
    tainted[1] = {**tainted[1], "taints": [{"key": "note", "effect": "None"}]}
    outcome = alloc(rclaim(request("gpu", count=4)), [rslice(tainted)])
    assert not outcome.allocated
    assert any("gpu-0: tainted xid=79:NoSchedule" in line for line in outcome.explanation)
    tolerate = [{"key": "xid", "operator": "Exists"}]
    outcome = alloc(rclaim(request("gpu", count=4, tolerations=tolerate)), [rslice(tainted)])
    assert outcome.allocation is not None
    assert outcome.allocation["devices"]["results"][0]["tolerations"] == tolerate


# --- allocationMode All -------------------------------------------------------------------


def test_all_mode_takes_every_matching_device() -> None:
    sel = 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0'
    outcome = alloc(rclaim(request("gpu", sel, mode="All")))
    assert [d for _, d in picked(outcome)] == ["gpu-1", "gpu-2", "gpu-3"]


def test_all_mode_fails_when_one_matching_device_is_in_use_or_none_match() -> None:
    assert not alloc(
        rclaim(request("gpu", mode="All")), allocated=[(DRIVER, NODE, "gpu-2")]
    ).allocated
    assert not alloc(rclaim(request("gpu", f'{PRODUCT} == "B200"', mode="All"))).allocated


def test_all_mode_fails_on_an_incomplete_pool_with_an_error() -> None:
    slices = [rslice(MIXED[:2], name="a", count=2)]  # the second slice is not there yet
    outcome = alloc(rclaim(request("gpu", mode="All")), slices)
    assert not outcome.allocated
    assert outcome.scheduler_error is not None and "being updated" in outcome.scheduler_error


def test_all_mode_with_an_unmet_constraint_is_a_scheduler_error_not_a_fallback() -> None:
    numa = {"matchAttribute": "resource.kubernetes.io/numaNode"}
    the_claim = rclaim(
        first_available("gpu", request("all", mode="All"), request("one")), constraints=[numa]
    )
    outcome = alloc(the_claim)
    assert not outcome.allocated
    assert outcome.scheduler_error is not None
    assert "constraint matchAttribute resource.kubernetes.io/numaNode" in outcome.scheduler_error


# --- matchAttribute -----------------------------------------------------------------------


def test_match_attribute_over_all_requests() -> None:
    the_claim = rclaim(
        request("a"),
        request("b"),
        constraints=[{"matchAttribute": "resource.kubernetes.io/numaNode"}],
    )
    used = [(DRIVER, NODE, "gpu-1")]
    assert picked(alloc(the_claim, allocated=used)) == [("a", "gpu-2"), ("b", "gpu-3")]


def test_match_attribute_in_the_driver_domain_and_missing_attributes() -> None:
    island = {"matchAttribute": "gpu.nvidia.com/nvlinkIsland"}
    assert [d for _, d in picked(alloc(rclaim(request("g", count=2), constraints=[island])))] == [
        "gpu-1",
        "gpu-2",
    ]
    outcome = alloc(rclaim(request("g", count=3), constraints=[island]))
    assert not outcome.allocated
    text = "\n".join(outcome.explanation)
    assert (
        "no 3 devices share gpu.nvidia.com/nvlinkIsland (largest group: 2, value island-1)" in text
    )
    assert "gpu-0, gpu-3: has no gpu.nvidia.com/nvlinkIsland" in text


def test_match_attribute_over_listed_requests_only() -> None:
    numa = {"matchAttribute": "resource.kubernetes.io/numaNode", "requests": ["a", "b"]}
    the_claim = rclaim(request("a"), request("b"), request("c"), constraints=[numa])
    got = dict(picked(alloc(the_claim)))
    numa_of = {"gpu-0": 0, "gpu-1": 0, "gpu-2": 1, "gpu-3": 1}
    assert numa_of[got["a"]] == numa_of[got["b"]]
    assert len(set(got.values())) == 3


def test_match_attribute_compares_type_and_value() -> None:
    devs = [device("gpu-0", slot=1), device("gpu-1", slot="1"), device("gpu-2", slot=1)]
    the_claim = rclaim(request("g", count=2), constraints=[{"matchAttribute": f"{DRIVER}/slot"}])
    assert [d for _, d in picked(alloc(the_claim, [rslice(devs)]))] == ["gpu-0", "gpu-2"]


# --- firstAvailable -----------------------------------------------------------------------


def test_first_available_uses_the_first_alternative_that_fits() -> None:
    the_claim = rclaim(
        first_available(
            "gpu",
            request("b200", f'{PRODUCT} == "B200"'),
            request("h100", f'{PRODUCT}.startsWith("NVIDIA H100")', count=2),
            request("any"),
        )
    )
    assert picked(alloc(the_claim)) == [("gpu/h100", "gpu-1"), ("gpu/h100", "gpu-2")]
    used = [(DRIVER, NODE, "gpu-1")]
    assert picked(alloc(the_claim, allocated=used)) == [("gpu/any", "gpu-0")]


def test_constraint_on_a_request_covers_its_subrequests() -> None:
    island = {"matchAttribute": "gpu.nvidia.com/nvlinkIsland", "requests": ["gpu"]}
    the_claim = rclaim(
        first_available("gpu", request("four", count=4), request("two", count=2)),
        constraints=[island],
    )
    assert [r for r, _ in picked(alloc(the_claim))] == ["gpu/two", "gpu/two"]
    only_sub = {"matchAttribute": "gpu.nvidia.com/nvlinkIsland", "requests": ["gpu/two"]}
    the_claim = rclaim(
        first_available("gpu", request("four", count=4), request("two", count=2)),
        constraints=[only_sub],
    )
    assert [r for r, _ in picked(alloc(the_claim))] == ["gpu/four"] * 4


# --- result shape -------------------------------------------------------------------------


def test_configs_class_first_then_claim_and_node_selector() -> None:
    opaque = {"driver": DRIVER, "parameters": {"kind": "GpuConfig"}}
    cls = device_class("gpu", f'device.driver == "{DRIVER}"', config=[{"opaque": opaque}])
    sharing = {"driver": DRIVER, "parameters": {"sharing": "TimeSlicing"}}
    the_claim = rclaim(
        request("train"),
        first_available("infer", request("h100", f'{PRODUCT}.startsWith("NVIDIA H100")')),
        config=[
            {"requests": ["infer"], "opaque": sharing},
            {"opaque": sharing},
            {"requests": ["other"], "opaque": sharing},
        ],
    )
    outcome = alloc(the_claim, classes=[cls])
    assert outcome.allocation is not None
    assert outcome.allocation["devices"]["config"] == [
        {"source": "FromClass", "requests": ["train", "infer/h100"], "opaque": opaque},
        {"source": "FromClaim", "requests": ["infer"], "opaque": sharing},
        {"source": "FromClaim", "opaque": sharing},
    ]
    assert outcome.allocation["nodeSelector"] == {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
        ]
    }


def test_no_node_selector_for_all_nodes_slices() -> None:
    outcome = alloc(rclaim(request("gpu")), [rslice(MIXED, node=None, allNodes=True)])
    assert outcome.allocation is not None and "nodeSelector" not in outcome.allocation
    assert "config" not in outcome.allocation["devices"]


# --- pools --------------------------------------------------------------------------------


def test_only_highest_generation_and_complete_pools_count() -> None:
    old = rslice(MIXED, name="old", generation=1)
    new = rslice(MIXED[:1], name="new", generation=2)
    assert [d for _, d in picked(alloc(rclaim(request("g")), [old, new]))] == ["gpu-0"]
    assert not alloc(rclaim(request("g", count=2)), [old, new]).allocated
    half = [rslice(MIXED[:2], name="a", count=2)]
    outcome = alloc(rclaim(request("g")), half)
    assert not outcome.allocated
    assert "pool gpu.nvidia.com/node-1 is incomplete" in outcome.explanation[0]
    whole = [rslice(MIXED[2:], name="b", count=2), *half]
    # Slices are tried by name: a (gpu-0, gpu-1) before b.
    assert [d for _, d in picked(alloc(rclaim(request("g", count=4)), whole))] == [
        "gpu-0",
        "gpu-1",
        "gpu-2",
        "gpu-3",
    ]


def test_slices_of_other_nodes_are_ignored() -> None:
    elsewhere = rslice(MIXED, node="node-2")
    assert not alloc(rclaim(request("g")), [elsewhere]).allocated
    selector = {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
        ]
    }
    outcome = alloc(rclaim(request("g")), [rslice(MIXED, node=None, nodeSelector=selector)])
    assert outcome.allocation is not None
    assert outcome.allocation["nodeSelector"] == selector


def test_duplicate_device_names_make_a_pool_invalid() -> None:
    outcome = alloc(rclaim(request("g")), [rslice([MIXED[0], MIXED[0]])])
    assert not outcome.allocated
    assert "duplicate device name gpu-0" in outcome.explanation[0]


# --- topology -----------------------------------------------------------------------------


def test_topology_choice_on_dgx1(profile_slices: ProfileSlices) -> None:
    slices, devices = profile_slices("dgx-1-v100")
    for node_devices in (devices, None):  # exact link counts, or attributes only
        outcome = best(
            rclaim(request("g", count=4)),
            slices,
            classes=[WHOLE_GPU_CLASS],
            node_devices=node_devices,
        )
        assert [d for _, d in picked(outcome)] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    used = [(DRIVER, NODE, "gpu-0")]
    optimum = best(
        rclaim(request("g", count=4)),
        slices,
        classes=[WHOLE_GPU_CLASS],
        node_devices=devices,
        allocated=used,
    )
    assert [d for _, d in picked(optimum)] == ["gpu-4", "gpu-5", "gpu-6", "gpu-7"]
    assert optimum.score == (9, 6, 6)
    # The scheduler takes the first free GPUs (as the real one did on these slices).
    first = alloc(
        rclaim(request("g", count=4)),
        slices,
        classes=[WHOLE_GPU_CLASS],
        node_devices=devices,
        allocated=used,
    )
    assert [d for _, d in picked(first)] == ["gpu-1", "gpu-2", "gpu-3", "gpu-4"]
    assert first.score == (5, 3, 3)


def test_topology_choice_across_requests(profile_slices: ProfileSlices) -> None:
    slices, devices = profile_slices("h100-nvl-pairs")
    used = [(DRIVER, NODE, "gpu-0")]
    the_claim = rclaim(request("a"), request("b"))
    whole = [WHOLE_GPU_CLASS]
    outcome = best(the_claim, slices, classes=whole, node_devices=devices, allocated=used)
    # First-fit takes gpu-1 and gpu-2; the bridged pair 2-3 is the better choice.
    assert picked(outcome) == [("a", "gpu-2"), ("b", "gpu-3")]
    assert outcome.score == (12, 1, 0)
    first = alloc(the_claim, slices, classes=whole, node_devices=devices, allocated=used)
    assert picked(first) == [("a", "gpu-1"), ("b", "gpu-2")]
    assert first.score == (0, 0, 0)


def test_h100_nvl_pairs(profile_slices: ProfileSlices) -> None:
    slices, devices = profile_slices("h100-nvl-pairs")
    island = {"matchAttribute": "gpu.nvidia.com/nvlinkIsland"}
    whole = [WHOLE_GPU_CLASS]
    two = alloc(
        rclaim(request("g", count=2), constraints=[island]),
        slices,
        classes=whole,
        node_devices=devices,
    )
    assert [d for _, d in picked(two)] == ["gpu-0", "gpu-1"]
    four = alloc(rclaim(request("g", count=4), constraints=[island]), slices, classes=whole)
    assert not four.allocated
    assert any(
        "no 4 devices share gpu.nvidia.com/nvlinkIsland (largest group: 2" in line
        for line in four.explanation
    )
