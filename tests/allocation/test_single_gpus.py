"""Single GPUs placed to keep the best sets whole, and ranks that are never a lock.

``dra-driver claim --gpus 1`` asks for the GPU of rank 1 (digit 1 of ``setRanks``), else 2, ...,
else any GPU.
The agent ranks single GPUs so that the ones it hands out first are those whose loss hurts the
node's best remaining sets least (docs/topology.md). Checked here through the project's
emulation of the scheduler's allocator, on the slices the agent publishes:

* after 4 single-GPU claims on an empty DGX-1 and on the 16-GPU mesh the node still offers an
  optimal 4-GPU set, with the agent re-ranking after each claim and in a burst on the empty
  node's ranks; on the mesh 8 single claims leave an optimal 8-GPU set, where first fit
  (plain ``count: 1``) leaves none;
* the rank order is the greedy order its definition states, against brute force;
* whatever the ranks say, no claim gets a GPU another claim holds, and a claim whose ranked
  GPUs are all held still gets a free GPU through ``any``.
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from dra_driver.allocation import allocator, capacity, claimgen, simulator
from dra_driver.devices import fake, gpusets, model, topology
from dra_driver.slices import build

NODE = "node-1"
DRIVER = "gpu.nvidia.com"
Obj = dict[str, Any]


@functools.cache
def devices_of(profile: str) -> model.NodeDevices:
    return fake.FakeBackend.from_name(profile).discover()


def slices_of(profile: str, taken: Sequence[str] = ()) -> list[Obj]:
    """What the agent publishes when its GPUs ``taken`` (names) are held."""
    return build.build(devices_of(profile), node_name=NODE, taken=set(taken)).slices


def ids(names: Sequence[str]) -> set[tuple[str, str, str]]:
    return {(DRIVER, NODE, n) for n in names}


def allocate(profile: str, the_claim: Obj, slices: list[Obj], held: Sequence[str]) -> list[str]:
    """The GPU names the claim gets on the node (none of ``held``)."""
    outcome = allocator.allocate(
        the_claim,
        slices=slices,
        classes=simulator.builtin_classes(),
        node_name=NODE,
        allocated=ids(held),
        node_devices=devices_of(profile),
    )
    assert outcome.allocation is not None, outcome.explanation
    return [r["device"] for r in outcome.allocation["devices"]["results"]]


def singles_caught_up(profile: str, count: int, the_claim: Obj) -> list[str]:
    """``count`` single-GPU claims, the agent re-ranking after each (ranks follow allocations)."""
    held: list[str] = []
    for _ in range(count):
        held += allocate(profile, the_claim, slices_of(profile, held), held)
    return held


def burst(profile: str, claims: list[Obj]) -> list[allocator.Outcome]:
    """Claims allocated one after another on the empty node's ranks (the agent saw none)."""
    inputs = simulator.Inputs(
        claims=claims,
        classes=simulator.builtin_classes(),
        slices=slices_of(profile),
        node_name=NODE,
        allocated=set(),
        node_devices=devices_of(profile),
        consumed=capacity.Ledger(),
    )
    return simulator.run(inputs)


@functools.cache
def optimal_masks(profile: str, size: int) -> tuple[int, ...]:
    """The ``size``-GPU sets (bit masks of GPU indices) that score as the empty node's best."""
    devices = devices_of(profile)
    topo = topology.build(devices)
    scored = [
        (gpusets.set_score(topo, c), sum(1 << i for i in c))
        for c in itertools.combinations([g.index for g in devices.gpus], size)
    ]
    best = max(score for score, _ in scored)
    return tuple(mask for score, mask in scored if score == best)


def optimal_sets_left(profile: str, held: Sequence[str], size: int) -> int:
    """How many ``size``-GPU sets of the free GPUs score as the empty node's best."""
    index = {g.name: g.index for g in devices_of(profile).gpus}
    taken = sum(1 << index[n] for n in held)
    return sum(1 for mask in optimal_masks(profile, size) if not mask & taken)


def single(i: int) -> Obj:
    return claimgen.claim(1, name=f"one-{i}", namespace="default")


@pytest.mark.parametrize("profile", ["dgx-1-v100", "hgx-16-mesh"])
def test_four_single_gpus_leave_an_optimal_four_gpu_set(profile: str) -> None:
    devices = devices_of(profile)
    topo = topology.build(devices)
    best4 = max(
        gpusets.set_score(topo, c)
        for c in itertools.combinations([g.index for g in devices.gpus], 4)
    )
    # Caught up: the agent re-ranks after each claim.
    held = singles_caught_up(profile, 4, claimgen.claim(1))
    assert len(set(held)) == 4
    assert optimal_sets_left(profile, held, 4) >= 1
    four = allocate(profile, claimgen.claim(4), slices_of(profile, held), held)
    index = {g.name: g.index for g in devices.gpus}
    assert gpusets.set_score(topo, [index[n] for n in four]) == best4
    # Burst: four singles and then a 4-GPU claim, all on the empty node's ranks.
    outcomes = burst(profile, [*(single(i) for i in range(4)), claimgen.claim(4, name="four")])
    assert all(o.allocated for o in outcomes)
    firsts = [o.allocation["devices"]["results"][0] for o in outcomes[:4] if o.allocation]
    assert [r["request"] for r in firsts] == [f"gpus/rank{k}" for k in range(1, 5)]
    assert [r["device"] for r in firsts] == held  # the same GPUs, in the same order
    assert outcomes[4].score == best4


def test_first_fit_leaves_the_same_quad_on_an_empty_dgx_1() -> None:
    """What first fit (plain ``count: 1``) leaves today: on an empty DGX-1 it takes gpu-0..3
    and gpu-4..7 stay whole, as with the ranks (which take gpu-0, 3, 2, 1): minor order follows
    the quads there. The difference shows on the mesh, below, and once GPUs come and go."""
    plain = singles_caught_up("dgx-1-v100", 4, claimgen.claim(1, nvlink="any"))
    assert plain == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert singles_caught_up("dgx-1-v100", 4, claimgen.claim(1)) == [
        "gpu-0",
        "gpu-3",
        "gpu-2",
        "gpu-1",
    ]


def test_eight_single_gpus_keep_an_optimal_eight_gpu_set_on_the_mesh() -> None:
    """The 16-GPU mesh: first fit takes gpu-0..7 and breaks both optimal 8-GPU sets from the
    fifth GPU on; the ranks fill one 8-GPU set (two cube-mesh quads) and keep the other whole,
    caught up and in a burst (the first 7 by rank, the 8th re-ranked or by ``any``)."""
    profile = "hgx-16-mesh"
    assert optimal_sets_left(profile, [], 8) == 2
    plain = singles_caught_up(profile, 8, claimgen.claim(1, nvlink="any"))
    assert plain == [f"gpu-{i}" for i in range(8)]
    assert optimal_sets_left(profile, plain[:4], 8) == 1
    assert optimal_sets_left(profile, plain[:5], 8) == 0
    ranked = singles_caught_up(profile, 8, claimgen.claim(1))
    assert optimal_sets_left(profile, ranked, 8) == 1
    outcomes = burst(profile, [single(i) for i in range(8)])
    taken = [o.allocation["devices"]["results"][0]["device"] for o in outcomes if o.allocation]
    assert taken[:7] == ranked[:7] and len(set(taken)) == 8
    assert optimal_sets_left(profile, taken[:7], 8) == 1


def _greedy_by_brute_force(topo: topology.Topology, free: list[int]) -> int:
    """The first GPU (lowest index on ties) whose loss leaves the best sets, compared over
    the sizes :func:`gpusets.key_sizes` orders, each set's score by brute force."""

    def key(rest: list[int]) -> list[tuple[int, int, int]]:
        return [
            max(gpusets.set_score(topo, c) for c in itertools.combinations(rest, s))
            for s in gpusets.key_sizes(len(rest))
        ]

    return max(free, key=lambda g: (key([x for x in free if x != g]), -g))


@pytest.mark.parametrize("profile", ["dgx-1-v100", "h100-nvl-pairs", "gb200-nvl"])
def test_single_ranks_are_the_greedy_order_for_every_occupancy(profile: str) -> None:
    devices = devices_of(profile)
    topo = topology.build(devices)
    every = [g.index for g in gpusets.eligible(devices)]
    for held_count in range(len(every)):
        for held in itertools.combinations(every, held_count):
            free = [i for i in every if i not in held]
            order = gpusets.singles(topo, every, free)
            assert len(order) == min(len(free), gpusets.MAX_RANKS)
            for picked in order:
                assert picked == _greedy_by_brute_force(topo, free), (held, order)
                free.remove(picked)


def test_key_sizes_put_the_sizes_jobs_ask_for_first() -> None:
    assert gpusets.key_sizes(15) == [8, 4, 2, 15, 14, 13, 12, 11, 10, 9, 7, 6, 5, 3]
    assert gpusets.key_sizes(7) == [4, 2, 7, 6, 5, 3]
    assert gpusets.key_sizes(1) == []


# --- Ranks are a hint, never a lock ------------------------------------------------------------


def lying_slices(profile: str, size: int, rank_of: dict[str, int]) -> list[Obj]:
    """The node's slices with digit ``size`` of ``setRanks`` overwritten: ``rank_of`` per GPU,
    0 elsewhere (ranks as stale or wrong as a broken agent could publish)."""
    slices = slices_of(profile)
    place = 10 ** (size - 1)
    for obj in slices:
        for dev in obj["spec"].get("devices") or ():
            attrs = dev["attributes"]
            if "setRanks" in attrs:
                value = attrs["setRanks"]["int"]
                value -= value // place % 10 * place  # that digit cleared
                attrs["setRanks"] = {"int": value + rank_of.get(dev["name"], 0) * place}
    return slices


def test_a_rank_on_a_held_gpu_never_hands_it_out() -> None:
    """Ranks 1..7 for one GPU all on GPUs another claim holds: the claim skips every rank and
    gets the one free GPU through ``any``; with rank 1 on a held GPU and on a free one, the
    free one."""
    profile = "dgx-h100"
    held = [f"gpu-{i}" for i in range(7)]
    wrong = lying_slices(profile, 1, {name: k for k, name in enumerate(held, 1)})
    outcome = allocator.allocate(
        claimgen.claim(1),
        slices=wrong,
        classes=simulator.builtin_classes(),
        node_name=NODE,
        allocated=ids(held),
        node_devices=devices_of(profile),
    )
    assert outcome.allocation is not None, outcome.explanation
    [result] = outcome.allocation["devices"]["results"]
    assert (result["request"], result["device"]) == ("gpus/any", "gpu-7")
    # Rank 1 claimed by a held GPU and a free one: the free one, still by rank 1.
    both = lying_slices(profile, 1, {"gpu-0": 1, "gpu-5": 1})
    [got] = allocate(profile, claimgen.claim(1), both, ["gpu-0"])
    assert got == "gpu-5"


def test_a_burst_on_ranks_that_never_change_gives_every_claim_its_own_gpus() -> None:
    """Eight single claims and then two 4-GPU claims on ranks that claim rank 1 for every GPU
    of every size: each claim still gets GPUs no earlier claim holds, the last ones by ``any``,
    until the node is full; an 11th claim gets nothing rather than a held GPU."""
    profile = "dgx-h100"
    names = [f"gpu-{i}" for i in range(8)]
    wrong = slices_of(profile)
    for obj in wrong:
        for dev in obj["spec"].get("devices") or ():
            if "setRanks" in dev["attributes"]:  # rank 1 for every size: digits 1..7 all 1
                dev["attributes"]["setRanks"] = {"int": 1111111}
    inputs = simulator.Inputs(
        claims=[*(single(i) for i in range(8)), single(8)],
        classes=simulator.builtin_classes(),
        slices=wrong,
        node_name=NODE,
        allocated=set(),
        node_devices=devices_of(profile),
        consumed=capacity.Ledger(),
    )
    outcomes = simulator.run(inputs)
    got = [
        r["device"]
        for o in outcomes[:8]
        if o.allocation
        for r in o.allocation["devices"]["results"]
    ]
    assert sorted(got) == names  # eight claims, eight distinct GPUs
    assert not outcomes[8].allocated  # the node is full: nothing, never a GPU twice
    fours = [claimgen.claim(4, name=f"four-{i}", namespace="default") for i in range(3)]
    outcomes = simulator.run(
        simulator.Inputs(
            claims=fours,
            classes=simulator.builtin_classes(),
            slices=wrong,
            node_name=NODE,
            allocated=set(),
            node_devices=devices_of(profile),
            consumed=capacity.Ledger(),
        )
    )
    first, second, third = outcomes
    assert first.allocation is not None and second.allocation is not None
    a = {r["device"] for r in first.allocation["devices"]["results"]}
    b = {r["device"] for r in second.allocation["devices"]["results"]}
    assert len(a) == len(b) == 4 and not a & b
    assert not third.allocated


def test_the_benchmark_prints_both_tables(capsys: pytest.CaptureFixture[str]) -> None:
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "single_gpus.py"
    spec = importlib.util.spec_from_file_location("_benchmarks_single_gpus", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--profiles", "dgx-1-v100,h100-nvl-pairs", "--steps", "12"]) == 0
    out = capsys.readouterr().out
    assert "| dgx-1-v100 | 4 | 2 | 1 1 1 1 | 1 1 1 1 | 1 1 1 1 |" in out
    assert "| h100-nvl-pairs | 2 | 2 | 1 1 | 1 1 | 1 1 |" in out
    churn = [line for line in out.splitlines() if line.startswith("| dgx-1-v100 | 4 | ")]
    assert len(churn) == 2 and churn[1].endswith("| 100% / 1.00 | 100% / 1.00 |")
