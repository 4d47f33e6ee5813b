"""Dynamic MIG in the simulator: claims allocated one after another never over-commit a counter,
never get overlapping instances, block (and are blocked by) the full GPU, and get
the same verdicts the hardware gives — checked by creating every allocation in the NVML
stand-in. Explanations say why in MIG terms."""

from __future__ import annotations

import ctypes
import random
from collections import defaultdict
from typing import Any

import pynvml
import pytest

from dra_driver.allocation import allocator, claimgen, simulator
from dra_driver.apimachinery import quantity as qty
from dra_driver.devices import fake, migprofiles, model, nvml
from dra_driver.devices.fake import fakenvml, profiles

DRIVER = "gpu.nvidia.com"
ALL = migprofiles.DynamicMig.parse("all")
PROFILE_NAMES = ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")


def _claim(name: str, klass: str, *selectors: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "t"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "r",
                        "exactly": {
                            "deviceClassName": f"{klass}.nvidia.com",
                            "selectors": [{"cel": {"expression": s}} for s in selectors],
                        },
                    }
                ]
            }
        },
    }


def mig_claim(name: str, profile: str, gpu: model.Gpu | None = None) -> dict[str, Any]:
    selectors = [f'device.attributes["{DRIVER}"].profile == "{profile}"']
    if gpu is not None:
        selectors.append(f'device.attributes["{DRIVER}"].parentUUID == "{gpu.uuid}"')
    return _claim(name, "mig", *selectors)


def gpu_claim(name: str, gpu: model.Gpu) -> dict[str, Any]:
    return _claim(name, "gpu", f'device.attributes["{DRIVER}"].uuid == "{gpu.uuid}"')


def _run(devices: model.NodeDevices, claims: list[dict[str, Any]]) -> list[allocator.Outcome]:
    inputs = simulator.Inputs(
        claims=claims,
        classes=simulator.builtin_classes(),
        slices=simulator.fake_slices(devices, node_name="n1", driver_name=DRIVER, dynamic_mig=ALL),
        node_name="n1",
        allocated=set(),
        node_devices=devices,
    )
    return simulator.run(inputs)


def _devices(outcome: allocator.Outcome) -> list[str]:
    assert outcome.allocation is not None
    return [r["device"] for r in outcome.allocation["devices"]["results"]]


def test_three_claims_then_the_reasons_in_mig_terms() -> None:
    devices = fake.FakeBackend.from_name("h100-mig").discover()
    gpu0 = devices.gpus[0]
    outcomes = _run(
        devices,
        [
            mig_claim("small", "1g.10gb", gpu0),
            mig_claim("medium", "2g.20gb", gpu0),
            mig_claim("large", "3g.40gb", gpu0),
            mig_claim("too-big", "4g.40gb", gpu0),
            gpu_claim("whole", gpu0),
        ],
    )
    assert [_devices(o) for o in outcomes[:3]] == [
        ["gpu-0-mig-1g-10gb-0"],
        ["gpu-0-mig-2g-20gb-2"],
        ["gpu-0-mig-3g-40gb-4"],
    ]
    assert (
        "  gpu-0-mig-4g-40gb-0: gpu-0: 1 of 7 compute slices left, 4g.40gb needs 4 at "
        "placement 0, overlaps 1g.10gb at 0, 2g.20gb at 2" in outcomes[3].explanation
    )
    assert (
        "  gpu-0: gpu-0: 1 of 7 compute slices left, the full GPU needs all 7, overlaps "
        "1g.10gb at 0, 2g.20gb at 2, 3g.40gb at 4" in outcomes[4].explanation
    )


def test_the_full_gpu_and_whole_gpu_claims_block_mig_devices_and_the_reverse() -> None:
    devices = fake.FakeBackend.from_name("dgx-h100").discover()
    gpu0, gpu1 = devices.gpus[:2]
    pair = claimgen.claim(2, name="pair")
    first = _run(devices, [mig_claim("mig", "1g.10gb", gpu0), pair, gpu_claim("whole", gpu0)])
    assert _devices(first[0]) == ["gpu-0-mig-1g-10gb-0"]
    # The rank-1 pair (gpu-0, gpu-1) holds gpu-0, whose full device the MIG device blocks:
    # the ladder moves on to rank 2.
    assert _devices(first[1]) == ["gpu-2", "gpu-3"]
    assert first[2].allocation is None
    assert (
        "  gpu-0: gpu-0: 6 of 7 compute slices left, the full GPU needs all 7, overlaps 1g.10gb "
        "at 0" in first[2].explanation
    )
    second = _run(devices, [pair, mig_claim("mig", "1g.10gb", gpu1)])
    assert _devices(second[0]) == ["gpu-0", "gpu-1"]
    assert second[1].allocation is None
    assert (
        "  gpu-1-mig-1g-10gb-0: gpu-1: 0 of 7 compute slices left, 1g.10gb needs 1 at placement "
        "0, overlaps gpu-1" in second[1].explanation
    )


def _totals(slices: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    return {
        cs["name"]: {k: qty.parse_quantity(v["value"]).nanos for k, v in cs["counters"].items()}
        for s in slices
        for cs in s["spec"].get("sharedCounters", [])
    }


def _create(api: Any, handle: Any, place: migprofiles.Placement) -> Any:
    wanted = nvml.c_nvmlGpuInstancePlacement_t(start=place.start, size=place.size)
    return api.nvmlDeviceCreateGpuInstanceWithPlacement(
        handle, place.profile.id, ctypes.pointer(wanted)
    )


@pytest.mark.parametrize("seed", range(6))
def test_random_claims_never_overcommit_never_overlap_and_match_the_hardware(seed: int) -> None:
    rng = random.Random(seed)
    devices = fake.FakeBackend.from_name("h100-mig").discover()
    slices = simulator.fake_slices(devices, node_name="n1", driver_name=DRIVER, dynamic_mig=ALL)
    totals = _totals(slices)
    consumes = {
        d["name"]: d.get("consumesCounters", [])
        for s in slices
        for d in s["spec"].get("devices", [])
    }
    places = {p.name: p for g in devices.gpus for p in migprofiles.placements(g)}
    claims: list[dict[str, Any]] = []
    for i in range(40):
        gpu = rng.choice([*devices.gpus, None])
        if gpu is not None and rng.random() < 0.1:
            claims.append(gpu_claim(f"c{i}", gpu))
        else:
            claims.append(mig_claim(f"c{i}", rng.choice(PROFILE_NAMES), gpu))
    outcomes = _run(devices, claims)

    # The card: every allocated placement is created in the stand-in; NVML must agree.
    api = fakenvml.FakeNvml(profiles.load_builtin("h100-mig"))
    api.nvmlInit()
    handles = {g.uuid: api.nvmlDeviceGetHandleByIndex(g.index) for g in devices.gpus}
    for handle in handles.values():
        api.nvmlDeviceSetMigMode(handle, pynvml.NVML_DEVICE_MIG_ENABLE)
    used: dict[tuple[str, str], int] = defaultdict(int)
    whole: set[str] = set()
    allocated = 0
    for claim_obj, outcome in zip(claims, outcomes, strict=True):
        if outcome.allocation is None:
            selectors = claim_obj["spec"]["devices"]["requests"][0]["exactly"]["selectors"]
            text = " ".join(s["cel"]["expression"] for s in selectors)
            if "profile ==" not in text or "parentUUID" not in text:
                continue
            # A pinned MIG claim the scheduler refuses: no placement of it fits on the card.
            gpu = next(g for g in devices.gpus if g.uuid in text)
            profile = text.split('profile == "', 1)[1].split('"', 1)[0]
            if gpu.uuid in whole:
                continue
            for place in migprofiles.placements(gpu):
                if place.profile.name == profile:
                    with pytest.raises(pynvml.NVMLError_InsufficientResources):
                        _create(api, handles[gpu.uuid], place)
            continue
        allocated += 1
        for name in _devices(outcome):
            for use in consumes[name]:
                for counter, amount in use["counters"].items():
                    used[(use["counterSet"], counter)] += qty.parse_quantity(amount["value"]).nanos
            if name in places:
                _create(api, handles[places[name].gpu.uuid], places[name])  # never refused
            else:
                whole.add(next(g.uuid for g in devices.gpus if g.name == name))
    assert allocated >= 5
    for (set_name, counter), amount in used.items():
        assert amount <= totals[set_name][counter], (set_name, counter)
    for gpu in devices.gpus:
        if gpu.uuid in whole:
            assert used[(f"gpu-{gpu.minor}-mig", "memory-slice-0")] in (0, 10**9)
