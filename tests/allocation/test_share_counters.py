"""Shares and the generated claim on the slices the agent publishes: capacity keeps them apart.

A shareable GPU is one multi-allocatable device; a request that asks no memory takes all of it
(the capacity's default), so a claim for whole GPUs (the ``dra-driver claim`` ladder, a plain
request) never lands on a GPU that has shares, and no share lands on a GPU a whole claim holds.
The set ranks are only a hint: a ranked set with a shared GPU is skipped for the next rank.
Both directions, across claims (allocated earlier, or earlier in the same run) and inside one
claim. No shared counters are involved any more (docs/topology.md).
"""

from __future__ import annotations

import random
from typing import Any

from claimkit import DRIVER, NODE, Obj, rclaim, request

from dra_driver.allocation import allocator, capacity, claimgen, simulator
from dra_driver.devices import fake
from dra_driver.slices import build, shares

SHARE_CLASS = "gpu.nvidia.com"
SET_CLASS = "gpu-set.nvidia.com"


def node_slices(profile: str = "h100-nvl-pairs") -> list[Obj]:
    """gpu-0..gpu-3 (H100 NVL, 94Gi, shareable), ranked as on an empty node: pairs gpus 0+1
    then 2+3, the triple 0+1+2."""
    devices = fake.FakeBackend.from_name(profile).discover()
    return build.build(
        devices, node_name=NODE, driver_name=DRIVER, shareable=shares.Shareable.parse("all")
    ).slices


def share(name: str, memory: str) -> Obj:
    return request(name, cls=SHARE_CLASS, capacity={"requests": {"memory": memory}})


def run(*claims: Obj, consumed: capacity.Ledger | None = None) -> list[allocator.Outcome]:
    return simulator.run(
        simulator.Inputs(
            claims=list(claims),
            classes=simulator.builtin_classes(driver_name=DRIVER),
            slices=node_slices(),
            node_name=NODE,
            allocated=set(),
            consumed=consumed if consumed is not None else capacity.Ledger(),
        ),
        share_rng=random.Random(3),
    )


def results(outcome: allocator.Outcome) -> list[dict[str, Any]]:
    assert outcome.allocation is not None, outcome.explanation
    return [dict(r) for r in outcome.allocation["devices"]["results"]]


def picked(outcome: allocator.Outcome) -> list[str]:
    return [r["device"] for r in results(outcome)]


def why(outcome: allocator.Outcome) -> str:
    assert outcome.allocation is None
    return "\n".join(outcome.explanation)


def test_later_shares_skip_the_counter_the_first_one_booked() -> None:
    # The counter gpu-0 holds 94Gi and the shareable gpu-0 consumes all of it: were every share
    # charged, the second would not fit.
    out = run(*(rclaim(share("gpu", m), name=n) for n, m in (("a", "20Gi"), ("b", "30Gi"))))
    assert [picked(o) for o in out] == [["gpu-0"], ["gpu-0"]]


def test_shares_of_a_gpu_keep_the_generated_claim_off_it() -> None:
    first, pair, triple = run(
        rclaim(share("gpu", "20Gi"), name="s"),
        claimgen.claim(2, name="pair"),
        claimgen.claim(3, name="triple"),
    )
    assert picked(first) == ["gpu-0"]
    assert picked(pair) == ["gpu-2", "gpu-3"]  # rank 1 (gpu-0, gpu-1) holds the shared gpu-0
    assert {r["request"] for r in results(pair)} == {"gpus/rank2"}
    # Whole GPUs are left only on gpu-1: a plain request takes a GPU's whole memory.
    assert "gpu-0: 74Gi of memory left, 94Gi needed by default (not requested)" in why(triple)


def test_shares_from_allocated_claims_keep_it_off_too() -> None:
    earlier = {
        "kind": "ResourceClaim",
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": DRIVER,
                            "pool": NODE,
                            "device": "gpu-1",
                            "shareID": "6f1c8d8e-0c39-4c1e-9a51-2b8f7a0e6d10",
                            "consumedCapacity": {"memory": "8Gi", "computeShare": "0"},
                        }
                    ]
                }
            }
        },
    }
    consumed = simulator.consumed_from([earlier], source="allocated.yaml")
    pair, more = run(
        claimgen.claim(2, name="pair"), rclaim(share("gpu", "70Gi"), name="s"), consumed=consumed
    )
    assert picked(pair) == ["gpu-2", "gpu-3"]
    assert picked(more) == ["gpu-0"]  # gpu-1 has 86Gi left too, but gpu-0 comes first


def test_a_whole_claim_keeps_shares_off_its_gpus() -> None:
    pair, first, other_pair, last = run(
        claimgen.claim(2, name="pair"),
        rclaim(share("gpu", "20Gi"), name="s1"),
        claimgen.claim(2, name="pair2"),
        rclaim(share("gpu", "20Gi"), name="s2"),
    )
    assert picked(pair) == ["gpu-0", "gpu-1"]
    assert picked(first) == ["gpu-2"]  # gpu-0 and gpu-1 are the pair's, whole
    # gpu-2 has a share now: rank 2 (gpu-2, gpu-3) and "any" find one whole GPU only.
    assert not other_pair.allocated
    assert picked(last) == ["gpu-2"]  # shares go on sharing gpu-2


def test_when_whole_claims_hold_every_gpu_no_share_fits_and_the_explanation_says_why() -> None:
    *_, late = run(claimgen.claim(2, name="p1"), claimgen.claim(2, name="p2"),
                   rclaim(share("gpu", "1Gi"), name="late"))  # fmt: skip
    assert "gpu-0, gpu-1, gpu-2, gpu-3: 0 of memory left, 1Gi requested" in why(late)


def test_an_exclusive_claim_on_a_shareable_gpu_takes_it_whole() -> None:
    whole, pair, small = run(
        rclaim(request("gpu", cls=SHARE_CLASS), name="whole"),
        claimgen.claim(2, name="pair"),
        rclaim(share("gpu", "1Gi"), name="small"),
    )
    (res,) = results(whole)
    assert res["device"] == "gpu-0" and res["consumedCapacity"]["memory"] == "94Gi"
    assert picked(pair) == ["gpu-2", "gpu-3"]  # rank 1 holds gpu-0
    assert picked(small) == ["gpu-1"]  # gpu-0: 0 of memory left


def test_inside_one_claim_a_share_keeps_the_ladder_off_its_gpu() -> None:
    ladder = claimgen.claim(2)["spec"]["devices"]["requests"][0]
    (share_first,) = run(rclaim(share("s", "10Gi"), ladder, name="a"))
    assert picked(share_first) == ["gpu-0", "gpu-2", "gpu-3"]
    assert [r["request"] for r in results(share_first)] == ["s", "gpus/rank2", "gpus/rank2"]


def test_two_requests_of_one_claim_share_one_gpu_as_the_scheduler_does() -> None:
    (out,) = run(rclaim(share("a", "10Gi"), share("b", "6Gi"), name="two"))
    a, b = results(out)
    assert a["device"] == b["device"] == "gpu-0"
    assert a["shareID"] != b["shareID"]
    assert (a["consumedCapacity"]["memory"], b["consumedCapacity"]["memory"]) == ("10Gi", "6Gi")
    # The devices of one request stay distinct: two shares in one request take two GPUs.
    two = request("gpu", cls=SHARE_CLASS, count=2, capacity={"requests": {"memory": "10Gi"}})
    (pair,) = run(rclaim(two, name="count-2"))
    assert picked(pair) == ["gpu-0", "gpu-1"]


def test_a_claim_of_two_shares_sees_what_its_first_share_took() -> None:
    (out,) = run(rclaim(share("a", "50Gi"), share("b", "45Gi"), name="big"))
    assert picked(out) == ["gpu-0", "gpu-1"]  # 44Gi left on gpu-0 after a
