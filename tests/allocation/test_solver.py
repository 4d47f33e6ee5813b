"""The exact search agrees with a step-by-step replay of the scheduler on random claims.

:mod:`dra_driver.allocation.firstfit` replays kube-scheduler's depth-first search; here random
nodes and claims (alternatives, counts, All, adminAccess, constraints, selectors that fail to
evaluate on some devices) check that the allocator reaches the same verdict, and that every
allocation it returns is valid on its own terms, checked independently of the allocator.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from claimkit import DRIVER, GPU_CLASS, NODE, Obj, device, rclaim, request, rslice

from dra_driver.allocation import allocator, cel, claim, firstfit, pools, selection, solver

SELECTORS = [
    'device.attributes["gpu.nvidia.com"].productName == "H100"',
    'device.attributes["gpu.nvidia.com"].productName != "H100"',
    'device.attributes["resource.kubernetes.io"].numaNode == 1',
    'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0',
    # Errors on devices without "foo": the scheduler aborts if it evaluates one first.
    'device.attributes["gpu.nvidia.com"].foo == 1',
    'has(device.attributes["gpu.nvidia.com"].foo) && device.attributes["gpu.nvidia.com"].foo == 1',
]
ATTRIBUTES = [
    "resource.kubernetes.io/numaNode",
    "gpu.nvidia.com/nvlinkIsland",
    "gpu.nvidia.com/productName",
]


def _random_node(rng: random.Random) -> list[Obj]:
    devs = []
    for i in range(rng.randint(2, 7)):
        attrs: dict[str, Any] = {
            "productName": rng.choice(["H100", "H100", "L4"]),
            "numa": rng.randrange(2),
        }
        if rng.random() < 0.7:
            attrs["nvlinkIsland"] = rng.choice(["island-0", "island-4"])
        if rng.random() < 0.8:
            attrs["foo"] = rng.choice([1, 1, 2])
        devs.append(device(f"gpu-{i}", memory=rng.choice(["24Gi", "80Gi"]), **attrs))
    return devs


def _random_request(rng: random.Random, name: str, *, sub: bool) -> Obj:
    selectors = rng.sample(SELECTORS, rng.choice([0, 0, 1, 1, 2]))
    mode = "All" if rng.random() < 0.12 else None
    count = None if mode else rng.choice([None, 1, 2, 2, 3])
    return request(name, *selectors, count=count, mode=mode, admin=not sub and rng.random() < 0.1)


def _random_claim(rng: random.Random) -> Obj:
    reqs = []
    for g in range(rng.randint(1, 3)):
        if rng.random() < 0.35:
            subs = [_random_request(rng, f"s{j}", sub=True) for j in range(rng.randint(1, 3))]
            reqs.append(
                {
                    "name": f"r{g}",
                    "firstAvailable": [{"name": s["name"], **s["exactly"]} for s in subs],
                }
            )
        else:
            reqs.append(_random_request(rng, f"r{g}", sub=False))
    constraints = []
    for _ in range(rng.choice([0, 0, 1, 1, 2])):
        names = [r["name"] for r in reqs]
        con: Obj = {"matchAttribute": rng.choice(ATTRIBUTES)}
        if rng.random() < 0.4:
            con["requests"] = rng.sample(names, rng.randint(1, len(names)))
        constraints.append(con)
    return rclaim(*reqs, constraints=constraints)


def _check_valid(
    the_claim: Obj, devs: list[Obj], used: set[pools.DeviceId], result: dict[str, Any]
) -> tuple[int, ...]:
    """Validate an allocation independently; returns the chosen alternative per request."""
    by_name = {d["name"]: d for d in devs}
    parsed = claim.parse_claim(the_claim)
    results = result["devices"]["results"]
    names = [r["device"] for r in results]
    assert len(names) == len(set(names)), "a device is used twice in one claim"
    vector = []
    for group in parsed.groups:
        mine = [r for r in results if r["request"].split("/")[0] == group.name]
        chosen = {r["request"] for r in mine}
        assert len(chosen) == 1
        name = chosen.pop()
        (req,) = [a for a in group.alternatives if a.name == name]
        vector.append(group.alternatives.index(req))
        for r in mine:
            dev = by_name[r["device"]]
            for expr in req.selectors + GPU_SELECTORS:
                assert cel.compile_selector(expr).matches(dev, DRIVER), (expr, dev)
            if (DRIVER, NODE, dev["name"]) in used:
                assert req.admin_access and r.get("adminAccess") is True
        if req.mode == claim.EXACT_COUNT:
            assert len(mine) == req.count
        else:
            everything = [d["name"] for d in devs if all(_safe(expr, d) for expr in req.selectors)]
            assert sorted(r["device"] for r in mine) == sorted(everything)
    for con in parsed.constraints:
        values = set()
        for r in results:
            group = next(g for g in parsed.groups if g.name == r["request"].split("/")[0])
            req = next(a for a in group.alternatives if a.name == r["request"])
            if con.applies(req):
                key = pools.attribute_key(
                    pools.lookup_attribute(
                        pools.Device(
                            DRIVER, NODE, r["device"], by_name[r["device"]], "", None, None
                        ),
                        con.attribute,
                    )
                )
                assert key is not None
                values.add(key)
        assert len(values) <= 1, (con, values)
    return tuple(vector)


GPU_SELECTORS: tuple[str, ...] = (f'device.driver == "{DRIVER}"',)


def _safe(expr: str, dev: Obj) -> bool:
    try:
        return cel.compile_selector(expr).matches(dev, DRIVER)
    except cel.CelEvalError:
        return False


def _scheduler(the_claim: Obj, devs: list[Obj], used: set[pools.DeviceId]) -> firstfit.Verdict:
    parsed = claim.parse_claim(the_claim)
    pool_list = pools.gather([rslice(devs)], node_name=NODE)
    sel = selection.Selection(
        devices=list(pool_list[0].devices),
        classes={"gpu": claim.parse_class(GPU_CLASS)},
        in_use=used,
    )
    sel.compile_all(parsed)
    return firstfit.emulate(parsed, sel, bad_pools=[])


@pytest.mark.parametrize("seed", range(300))
def test_same_verdict_as_the_scheduler_and_valid_allocations(seed: int) -> None:
    rng = random.Random(seed)
    devs = _random_node(rng)
    used = {(DRIVER, NODE, d["name"]) for d in devs if rng.random() < 0.25}
    the_claim = _random_claim(rng)
    verdict = _scheduler(the_claim, devs, used)
    assert verdict.status != "undecided"
    outcome = allocator.allocate(
        the_claim, slices=[rslice(devs)], classes=[GPU_CLASS], node_name=NODE, allocated=used
    )
    assert outcome.allocated == (verdict.status == "allocated"), (verdict, outcome)
    if verdict.status == "error":
        assert outcome.scheduler_error == verdict.message
    if outcome.allocation is not None:
        ours = _check_valid(the_claim, devs, used, dict(outcome.allocation))
        names = [n for n, _ in verdict.picks]
        groups = claim.parse_claim(the_claim).groups
        theirs = tuple(
            next(i for i, a in enumerate(g.alternatives) if a.name in names) for g in groups
        )
        assert ours <= theirs  # the earliest alternatives that can be satisfied
    else:
        assert outcome.explanation


def test_assign_fills_requests_in_order_with_the_lowest_devices() -> None:
    assert solver.assign([1, 1], [[0, 1], [0]]) == [[1], [0]]
    assert solver.assign([2, 1], [[0, 1, 2], [0, 1, 2]]) == [[0, 1], [2]]
    assert solver.assign([2], [[0]]) is None
    assert solver.assign([1, 1], [[0, 1], [0, 1]], items=[1, 0]) == [[0], [1]]


def test_scheduler_replay_picks_first_fit() -> None:
    devs = [device(f"gpu-{i}", numa=n) for i, n in enumerate([0, 0, 1, 1, 1])]
    the_claim = rclaim(
        request("a"),
        request("b", count=2),
        constraints=[{"matchAttribute": "resource.kubernetes.io/numaNode"}],
    )
    verdict = _scheduler(the_claim, devs, set())
    # a takes gpu-0, then gpu-1: b finds no two more on NUMA 0; the search backtracks to gpu-2.
    assert verdict.status == "allocated"
    assert verdict.picks == (("a", 2), ("b", 3), ("b", 4))


def test_budget_exhaustion_is_undecided() -> None:
    devs = [device(f"gpu-{i}", numa=i % 2) for i in range(7)]
    the_claim = rclaim(
        request("g", count=5), constraints=[{"matchAttribute": "resource.kubernetes.io/numaNode"}]
    )
    parsed = claim.parse_claim(the_claim)
    pool_list = pools.gather([rslice(devs)], node_name=NODE)
    sel = selection.Selection(
        devices=list(pool_list[0].devices),
        classes={"gpu": claim.parse_class(GPU_CLASS)},
        in_use=set(),
    )
    sel.compile_all(parsed)
    assert firstfit.emulate(parsed, sel, bad_pools=[], budget=10).status == "undecided"
    assert firstfit.emulate(parsed, sel, bad_pools=[]).status == "unsatisfiable"
