"""Shares of multi-allocatable devices in the simulator: capacity left per device, requestPolicy
rounding and violations, defaults, distinct shareIDs, consumedCapacity, and explanations."""

from __future__ import annotations

import random
from typing import Any

import pytest
from claimkit import DRIVER, GPU_CLASS, NODE, Obj, device, rclaim, request, rslice

from dra_driver.allocation import allocator, capacity, pools, simulator
from dra_driver.devices import fake
from dra_driver.slices import build, shares


def shared_slices(gpus: int = 2, memory: str = "80Gi") -> list[Obj]:
    devices = []
    for i in range(gpus):
        dev = device(f"gpu-{i}", memory=memory)
        dev["allowMultipleAllocations"] = True
        dev["capacity"] = shares.capacity(int(memory.removesuffix("Gi")) << 30, memory_text=memory)
        devices.append(dev)
    return [rslice(devices)]


def share_claim(name: str, **requests: str) -> Obj:
    return rclaim(request("gpu", capacity={"requests": requests}), name=name)


def run(claims: list[Obj], slices: list[Obj], **inputs: Any) -> list[allocator.Outcome]:
    return simulator.run(
        simulator.Inputs(
            claims=claims,
            classes=[GPU_CLASS],
            slices=slices,
            node_name=NODE,
            allocated=inputs.get("allocated", set()),
            consumed=inputs.get("consumed", capacity.Ledger()),
        ),
        share_rng=random.Random(7),
    )


def result(outcome: allocator.Outcome) -> dict[str, Any]:
    assert outcome.allocation is not None, outcome.explanation
    (res,) = outcome.allocation["devices"]["results"]
    return dict(res)


def test_shares_fill_the_first_gpu_then_the_next_with_distinct_share_ids() -> None:
    claims = [
        share_claim("a", memory="20Gi", computeShare="25"),
        share_claim("b", memory="30Gi"),
        share_claim("c", memory="30Gi", computeShare="35"),
        share_claim("d", memory="20Gi"),
    ]
    out = [result(o) for o in run(claims, shared_slices())]
    assert [r["device"] for r in out] == ["gpu-0", "gpu-0", "gpu-0", "gpu-1"]
    assert out[0]["consumedCapacity"] == {"computeShare": "25", "memory": "20Gi"}
    assert out[1]["consumedCapacity"] == {"computeShare": "0", "memory": "30Gi"}
    ids = [r["shareID"] for r in out]
    assert len(set(ids)) == 4
    assert all(len(i) == 36 and i == i.lower() for i in ids)


def test_the_gpu_that_is_full_explains_what_is_left() -> None:
    used = capacity.Ledger()
    used.add((DRIVER, NODE, "gpu-0"), {f"{DRIVER}/memory": capacity.Q.from_int(68 << 30)})
    used.add((DRIVER, NODE, "gpu-1"), {f"{DRIVER}/memory": capacity.Q.from_int(80 << 30)})
    (out,) = run([share_claim("big", memory="20Gi")], shared_slices(), consumed=used)
    assert out.allocation is None
    text = "\n".join(out.explanation)
    assert "gpu-0: 12Gi of memory left, 20Gi requested" in text
    assert "gpu-1: 0 of memory left, 20Gi requested" in text


def test_requests_round_up_by_the_policy_and_violations_do_not_fit() -> None:
    out = run(
        [
            share_claim("odd", memory="20500Mi", computeShare="0.5"),
            share_claim("tiny", memory="1"),
            share_claim("huge", memory="81Gi"),
            share_claim("unknown", bandwidth="1"),
        ],
        shared_slices(gpus=1),
    )
    assert result(out[0])["consumedCapacity"] == {"computeShare": "1", "memory": "21Gi"}
    assert result(out[1])["consumedCapacity"]["memory"] == "1Gi"  # up to validRange.min
    text = "\n".join(out[2].explanation)
    assert "memory: 81Gi requested, more than the most a request may take (80Gi)" in text
    assert "gpu-0: has no capacity bandwidth" in "\n".join(out[3].explanation)


def test_rounded_requests_that_no_longer_fit_say_so() -> None:
    used = capacity.Ledger()
    used.add((DRIVER, NODE, "gpu-0"), {f"{DRIVER}/memory": capacity.Q.from_int(60 << 30)})
    (out,) = run([share_claim("r", memory="19500Mi")], shared_slices(gpus=1), consumed=used)
    assert result(out)["consumedCapacity"]["memory"] == "20Gi"  # exactly what is left
    used.add((DRIVER, NODE, "gpu-0"), {f"{DRIVER}/memory": capacity.Q.from_int(1 << 30)})
    (out,) = run([share_claim("r", memory="19500Mi")], shared_slices(gpus=1), consumed=used)
    assert "gpu-0: 19Gi of memory left, 19500Mi requested (rounded up to 20Gi)" in "\n".join(
        out.explanation
    )


def test_a_plain_claim_takes_the_default_share_the_whole_gpu() -> None:
    out = run([rclaim(request("gpu"), name="plain"), share_claim("s", memory="1Gi")],
              shared_slices(gpus=1))  # fmt: skip
    assert result(out[0])["consumedCapacity"] == {"computeShare": "0", "memory": "80Gi"}
    assert "gpu-0: 0 of memory left, 1Gi requested" in "\n".join(out[1].explanation)


def test_shares_from_allocated_claims_count_and_do_not_make_the_gpu_busy() -> None:
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
                            "device": "gpu-0",
                            "shareID": "0b8c4c52-35c8-4a55-a0f1-3c6a6ec5bd2d",
                            "consumedCapacity": {"memory": "70Gi", "computeShare": "0"},
                        }
                    ]
                }
            }
        },
    }
    assert pools.allocated_ids([earlier]) == set()
    consumed = simulator.consumed_from([earlier], source="t")
    out = run([share_claim("x", memory="10Gi"), share_claim("y", memory="1Gi")],
              shared_slices(gpus=1), consumed=consumed)  # fmt: skip
    assert result(out[0])["device"] == "gpu-0"
    assert out[1].allocation is None


def test_capacity_requests_on_exclusive_devices_are_minimums() -> None:
    slices = [rslice([device("gpu-0", memory="24Gi"), device("gpu-1", memory="80Gi")])]
    (out,) = run([share_claim("m", memory="40Gi")], slices)
    res = result(out)
    assert res["device"] == "gpu-1"
    assert "shareID" not in res and "consumedCapacity" not in res


def test_the_driver_slices_of_a_profile_share_gpus_end_to_end() -> None:
    devices = fake.FakeBackend.from_name("dgx-h100").discover()
    slices = build.build(
        devices, node_name=NODE, driver_name=DRIVER, shareable=shares.Shareable.parse("H100")
    ).slices
    claims = [share_claim(n, memory=m) for n, m in (("a", "20Gi"), ("b", "30Gi"), ("c", "30Gi"))]
    assert [result(o)["device"] for o in run(claims, slices)] == ["gpu-0"] * 3


@pytest.mark.parametrize("bad", [{"memory": "lots"}, {"memory": "1Gi", "x": "?"}])
def test_a_bad_capacity_request_is_an_input_error(bad: dict[str, str]) -> None:
    with pytest.raises(simulator.SimulateError, match=r"capacity\.requests"):
        run([share_claim("bad", **bad)], shared_slices(gpus=1))
