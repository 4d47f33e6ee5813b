"""Explanations for claims that cannot be allocated: per request, device and constraint."""

from __future__ import annotations

from collections.abc import Sequence

from claimkit import (
    DRIVER,
    GPU_CLASS,
    NODE,
    Obj,
    device,
    device_class,
    first_available,
    rclaim,
    request,
    rslice,
)

from dra_driver.allocation import allocator, pools

PRODUCT = 'device.attributes["gpu.nvidia.com"].productName'
NODE_DEVICES = [
    device("gpu-0", productName="NVIDIA H100 80GB HBM3", numa=0, nvlinkIsland="island-0"),
    device("gpu-1", productName="NVIDIA H100 80GB HBM3", numa=0, nvlinkIsland="island-0"),
    device("gpu-2", productName="NVIDIA L4", memory="24Gi", numa=1),
    device("gpu-3", productName="NVIDIA L4", memory="24Gi", numa=1),
]


def explain(
    the_claim: Obj,
    *,
    slices: Sequence[Obj] | None = None,
    classes: Sequence[Obj] = (GPU_CLASS,),
    allocated: Sequence[pools.DeviceId] = (),
) -> list[str]:
    outcome = allocator.allocate(
        the_claim,
        slices=slices if slices is not None else [rslice(NODE_DEVICES)],
        classes=classes,
        node_name=NODE,
        allocated=allocated,
    )
    assert not outcome.allocated
    return list(outcome.explanation)


def test_selector_failures_name_the_selector_and_the_values() -> None:
    lines = explain(
        rclaim(
            request(
                "gpu",
                'device.attributes["resource.kubernetes.io"].numaNode >= 0',
                f'{PRODUCT} == "NVIDIA B200"',
                count=1,
            )
        )
    )
    assert lines == [
        "request gpu: needs 1 device of class gpu; 0 of 4 usable",
        "  gpu-0, gpu-1: selectors[1] false: productName is 'NVIDIA H100 80GB HBM3'",
        "  gpu-2, gpu-3: selectors[1] false: productName is 'NVIDIA L4'",
    ]


def test_one_device_per_line_when_reasons_differ() -> None:
    used = [(DRIVER, NODE, "gpu-0")]
    sel = 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0'
    lines = explain(rclaim(request("gpu", sel, count=2)), allocated=used)
    assert lines == [
        "request gpu: needs 2 devices of class gpu; 1 of 4 usable",
        "  gpu-0: allocated to another claim",
        "  gpu-2, gpu-3: selectors[0] false: memory is 24Gi",
    ]


def test_class_selectors_and_evaluation_errors() -> None:
    h100 = device_class("h100", f'{PRODUCT}.startsWith("NVIDIA H100")')
    lines = explain(
        rclaim(request("gpu", 'device.attributes["gpu.nvidia.com"].mem > 1', cls="h100")),
        classes=[h100],
    )
    assert lines[0] == (
        "the scheduler stops with an error: request gpu: selectors[0] on gpu-0: no such key: mem"
    )
    assert "  gpu-0, gpu-1: selectors[0] error: no such key: mem" in lines
    assert "  gpu-2, gpu-3: class h100 selectors[0] false: productName is 'NVIDIA L4'" in lines


def test_constraint_that_cannot_be_met() -> None:
    island = {"matchAttribute": "gpu.nvidia.com/nvlinkIsland"}
    lines = explain(rclaim(request("gpus", count=3), constraints=[island]))
    assert lines == [
        "request gpus: needs 3 devices of class gpu; 4 of 4 usable",
        "constraint 0 (matchAttribute over gpus): no 3 devices share "
        "gpu.nvidia.com/nvlinkIsland (largest group: 2, value island-0)",
        "  gpu-2, gpu-3: has no gpu.nvidia.com/nvlinkIsland",
    ]


def test_constraint_on_an_attribute_no_usable_device_has_says_so() -> None:
    # Only gpu-2 and gpu-3 (no NVLink island) are usable: no group at all, not "largest 0".
    used = [(DRIVER, NODE, "gpu-0"), (DRIVER, NODE, "gpu-1")]
    island = {"matchAttribute": "gpu.nvidia.com/nvlinkIsland"}
    lines = explain(rclaim(request("gpus", count=2), constraints=[island]), allocated=used)
    assert lines == [
        "request gpus: needs 2 devices of class gpu; 2 of 4 usable",
        "  gpu-0, gpu-1: allocated to another claim",
        "constraint 0 (matchAttribute over gpus): no 2 devices share "
        "gpu.nvidia.com/nvlinkIsland (no usable device has the attribute)",
        "  gpu-2, gpu-3: has no gpu.nvidia.com/nvlinkIsland",
    ]


def test_first_available_lists_every_alternative() -> None:
    lines = explain(
        rclaim(
            first_available(
                "gpu",
                request("b200", f'{PRODUCT} == "NVIDIA B200"'),
                request("many", count=5),
            )
        )
    )
    assert (
        lines[0] == "request gpu/b200 (alternative 1 of 2): needs 1 device of class gpu; "
        "0 of 4 usable"
    )
    assert (
        lines[-1] == "request gpu/many (alternative 2 of 2): needs 5 devices of class gpu; "
        "4 of 4 usable"
    )


def test_requests_that_only_fail_together() -> None:
    lines = explain(rclaim(request("a", count=3), request("b", count=2)))
    assert lines[-1].startswith(
        "each request could be served on its own, but no set of "
        "distinct devices serves all of them at once (together at "
        "least 5 devices)"
    )


def test_no_slices_for_the_node() -> None:
    lines = explain(rclaim(request("gpu")), slices=[rslice(NODE_DEVICES, node="other")])
    assert lines[0] == "no ResourceSlice offers devices to this node"


def test_all_mode_lists_busy_devices_only() -> None:
    used = [(DRIVER, NODE, "gpu-3")]
    lines = explain(
        rclaim(request("gpus", f'{PRODUCT} == "NVIDIA L4"', mode="All")), allocated=used
    )
    assert lines == [
        "request gpus: wants all devices of class gpu matching its selectors: 2 match, "
        "1 of them usable",
        "  gpu-3: allocated to another claim",
    ]


def test_rank_selectors_show_the_packed_ranks_digit_by_digit() -> None:
    """The generated claim's rank selector reads ``setRanks`` through ``.?`` (optional): the
    explanation still names its value, digit by digit from the single-GPU rank up."""
    from dra_driver.allocation import claimgen

    ranked = [device("gpu-0", setRanks=1234), device("gpu-1")]
    expression = claimgen.rank_expression(2, 1, DRIVER, claimgen.RANKED_CLASS)
    lines = explain(rclaim(request("gpu", expression, count=1)), slices=[rslice(ranked)])
    assert lines == [
        "request gpu: needs 1 device of class gpu; 0 of 2 usable",
        "  gpu-0: selectors[0] false: setRanks is 1234 (ranks for 1, 2, ... GPUs: 4 3 2 1), "
        "driver is 'gpu.nvidia.com'",
        "  gpu-1: selectors[0] false: setRanks is not set, driver is 'gpu.nvidia.com'",
    ]
