"""Claim configs in the allocation result: one without requests applies to every request and
does not end the list; those after it still appear, in order."""

from __future__ import annotations

from claimkit import DRIVER, GPU_CLASS, NODE, device, rclaim, request, rslice

from dra_driver.allocation import allocator


def test_configs_after_a_request_less_one_are_kept_in_order() -> None:
    first = {"driver": DRIVER, "parameters": {"n": 1}}
    second = {"driver": DRIVER, "parameters": {"n": 2}}
    third = {"driver": DRIVER, "parameters": {"n": 3}}
    the_claim = rclaim(
        request("a"),
        request("b"),
        config=[
            {"opaque": first},
            {"requests": ["b"], "opaque": second},
            {"opaque": third},
        ],
    )
    outcome = allocator.allocate(
        the_claim,
        slices=[rslice([device("gpu-0"), device("gpu-1")])],
        classes=[GPU_CLASS],
        node_name=NODE,
        allocated=(),
    )
    assert outcome.allocation is not None, outcome.explanation
    assert outcome.allocation["devices"]["config"] == [
        {"source": "FromClaim", "opaque": first},
        {"source": "FromClaim", "requests": ["b"], "opaque": second},
        {"source": "FromClaim", "opaque": third},
    ]
