"""Placement quality: what each way of writing a claim gets from kube-scheduler, and our search.

Why it exists: the product's promise is the best NVLink-connected GPUs free on a node, picked by
the stock scheduler (docs/topology.md). Two tables, seeded and reproducible:

1. **Claims through the scheduler.** For each profile (ours and two mixed-product nodes) and
   request size N, over random occupancies (a uniformly random number of GPUs, 0 to G-N, taken
   at random), the devices the scheduler's search (``dra-driver simulate``) allocates for each
   claim shape, against the optimum (most links, then pairs on one NUMA node, then under one
   PCIe root, over every N free GPUs): share of occupancies where the pick is optimal and mean
   ratio of the pick's links to the optimum's. Claim shapes: plain ``count: N``; ``count: N``
   with ``matchAttribute`` on the NVLink island; a ``firstAvailable`` ladder over the
   hierarchical attributes we publish (same PCIe root, else NUMA node, else island, else any);
   and the shipped mechanism, N GPUs of set rank 1, else rank 2, ..., else ``count: N``
   (``dra-driver claim --gpus N``), on the slices the agent publishes once it has prepared the
   occupying claims (with its simulated decision time per claim), and on stale slices: the
   ranks of the empty node while the occupying claims are allocated but not yet prepared (the
   worst case of a burst).
2. **What each node publishes** for the mechanism: devices, slices and bytes.

A third table keeps the device plugin's exact search honest: best-subset search vs brute
force, first fit and greedy, with times (target: 16 GPUs choosing 8 in <= 10 ms).

Run: ``python benchmarks/placement.py [--trials N] [--seed S] [--quick]``. Figures are noisy on a
shared machine; the optima and shares are exact for the seed.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dra_driver.allocation import allocator, claimgen, placement, simulator
from dra_driver.devices import fake, model, topology
from dra_driver.devices.fake import profiles
from dra_driver.slices import build

NODE = "bench-node"
DRIVER = "gpu.nvidia.com"
HERE = Path(__file__).resolve().parent
PROFILES = (
    "dgx-1-v100",
    "h100-nvl-pairs",
    "hgx-16-mesh",
    "dgx-h100",
    "pcie-l4",
    "mixed-nvl-l4",
    "mixed-sxm-pcie",
)
SIZES = {16: (2, 3, 4, 6, 8, 12)}  # request sizes for a node of that many GPUs (else 2..G-1)
SHAPES = ("plain", "island", "ladder", "ranks", "stale")
Score = tuple[int, int, int]


@functools.cache
def devices_of(name: str) -> model.NodeDevices:
    if name.startswith("mixed-"):
        return fake.FakeBackend(profiles.load_file(HERE / "profiles" / f"{name}.yaml")).discover()
    return fake.FakeBackend.from_name(name).discover()


def claim_for(shape: str, size: int) -> dict[str, Any]:
    if shape == "plain":
        return claimgen.claim(size, nvlink="any")
    if shape == "island":
        return claimgen.claim(size, nvlink="island")
    if shape in ("ranks", "stale"):
        return claimgen.claim(size)
    # The attribute ladder: the tightest published grouping that has N free GPUs.
    levels = ("resource.kubernetes.io/pcieRoot", "resource.kubernetes.io/numaNode")
    levels += (f"{DRIVER}/nvlinkIsland",)
    subs = [
        {"name": f"level{i}", "deviceClassName": "gpu.nvidia.com", "count": size}
        for i in range(len(levels))
    ]
    subs.append({"name": "any", "deviceClassName": "gpu.nvidia.com", "count": size})
    cons = [{"matchAttribute": a, "requests": [f"gpus/level{i}"]} for i, a in enumerate(levels)]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"ladder-{size}"},
        "spec": {
            "devices": {"requests": [{"name": "gpus", "firstAvailable": subs}], "constraints": cons}
        },
    }


def optimum(topo: topology.Topology, free: Sequence[int], size: int) -> Score:
    weights = placement.Weights.from_topology(topo, list(free))
    found = placement.best_subset(weights, range(len(free)), size)
    assert found is not None and found.optimal
    return found.score


def occupancies(rng: random.Random, count: int, size: int, trials: int) -> list[tuple[int, ...]]:
    out = [()]
    for _ in range(trials - 1):
        taken = rng.randint(0, count - size)
        out.append(tuple(sorted(rng.sample(range(count), taken))))
    return out


def run_claims(name: str, *, trials: int, rng: random.Random) -> list[dict[str, Any]]:
    devices = devices_of(name)
    topo = topology.build(devices)
    empty = build.build(devices, node_name=NODE).slices  # ranks of the empty node
    classes = simulator.builtin_classes()
    count = len(devices.gpus)
    rows = []
    for size in SIZES.get(count, range(2, count)):
        stats = {s: [0, 0.0] for s in SHAPES}
        times: list[float] = []
        occs = occupancies(rng, count, size, trials)
        for occ in occs:
            free = [i for i in range(count) if i not in occ]
            best = optimum(topo, free, size)
            taken = {(DRIVER, NODE, devices.gpu(i).name) for i in occ}
            held = {name for _, _, name in taken}
            ranked = build.build(devices, node_name=NODE, taken=held).slices
            for shape in SHAPES:
                start = time.perf_counter()
                outcome = allocator.allocate(
                    claim_for(shape, size),
                    slices=ranked if shape == "ranks" else empty,
                    classes=classes,
                    node_name=NODE,
                    allocated=taken,
                    node_devices=devices,
                )
                elapsed = time.perf_counter() - start
                got = outcome.score if outcome.allocation is not None else None
                if shape == "ranks":
                    times.append(elapsed)
                    assert got is not None, outcome.explanation
                if got is None:
                    continue  # the shape cannot place N GPUs here (e.g. no island has N free)
                stats[shape][0] += got == best
                stats[shape][1] += 1.0 if best[0] == 0 else got[0] / best[0]
        n = len(occs)
        rows.append(
            {
                "profile": name,
                "gpus": count,
                "size": size,
                "cases": n,
                **{s: (stats[s][0] / n, stats[s][1] / n) for s in SHAPES},
                "p50": _pct(times, 0.5) * 1e3,
                "max": max(times) * 1e3,
            }
        )
    return rows


def publish_costs(name: str) -> dict[str, Any]:
    devices = devices_of(name)
    slices = build.build(devices, node_name=NODE).slices
    published = [d for s in slices for d in s["spec"].get("devices", [])]
    ranks = [k for d in published for k in d.get("attributes", {}) if k.startswith("setRank")]
    return {
        "profile": name,
        "gpus": len(devices.gpus),
        "devices": len(published),
        "slices": len(slices),
        "counters": sum(len(s["spec"].get("sharedCounters", [])) for s in slices),
        "ranks": len(ranks) // max(1, len(published)),
        "kib": sum(len(json.dumps(s)) for s in slices) / 1024,
    }


def search_table(*, trials: int, rng: random.Random) -> list[dict[str, Any]]:
    """The exact best-subset search (device plugin) vs brute force, first fit, greedy."""
    rows = []
    for name in ("dgx-1-v100", "h100-nvl-pairs", "dgx-h100", "hgx-16-mesh"):
        topo = topology.build(devices_of(name))
        count = len(topo.indices)
        weights = placement.Weights.from_topology(topo, list(topo.indices))
        cases = exact = first = greedy = 0
        times: list[float] = []
        for size in range(1, count + 1):
            for occ in set(occupancies(rng, count, size, trials)):
                free = [g for g in topo.indices if g not in occ]
                start = time.perf_counter()
                ours = placement.best_subset(weights, free, size)
                times.append(time.perf_counter() - start)
                best = max(weights.packed(c) for c in itertools.combinations(free, size))
                assert ours is not None
                cases += 1
                exact += weights.packed(ours.items) == best
                first += weights.packed(free[:size]) == best
                greedy += weights.packed(_greedy(weights, free, size)) == best
        rows.append(
            {
                "profile": name,
                "cases": cases,
                "exact": exact,
                "first": first,
                "greedy": greedy,
                "p50": _pct(times, 0.5) * 1e3,
                "max": max(times) * 1e3,
            }
        )
    return rows


def _greedy(weights: placement.Weights, cands: Sequence[int], k: int) -> tuple[int, ...]:
    chosen: list[int] = []
    for _ in range(k):
        chosen.append(
            max(
                (c for c in cands if c not in chosen),
                key=lambda c: (sum(weights.matrix[c][x] for x in chosen), -c),
            )
        )
    return tuple(chosen)


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _cell(share_ratio: tuple[float, float]) -> str:
    share, ratio = share_ratio
    return f"{share * 100:.1f} % / {ratio:.3f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=60, help="occupancies per profile and size")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="8 occupancies, 8-GPU profiles")
    args = parser.parse_args(argv)
    trials = 8 if args.quick else args.trials
    names = [p for p in PROFILES if not args.quick or p != "hgx-16-mesh"]
    rng = random.Random(args.seed)
    print("Claims through the scheduler: share of occupancies with an optimal pick / mean links")
    print("ratio to the optimum; decision time of the shipped claim in the simulator.\n")
    header = ("profile", "GPUs", "N", "cases", "count: N", "+ same island")
    header += ("attribute ladder", "set ranks (shipped)", "stale ranks", "p50 ms", "max ms")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    ranks_optimal = True
    for name in names:
        for r in run_claims(name, trials=trials, rng=rng):
            ranks_optimal = ranks_optimal and r["ranks"][0] == 1.0  # must always be optimal
            cells = [_cell(r[s]) for s in SHAPES]
            print(
                f"| {r['profile']} | {r['gpus']} | {r['size']} | {r['cases']} | "
                + " | ".join(cells)
                + f" | {r['p50']:.0f} | {r['max']:.0f} |"
            )
    print("\nWhat each node publishes:\n")
    header = ("profile", "GPUs", "devices", "slices", "counter sets", "rank attributes per GPU")
    header += ("KiB",)
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for name in names:
        c = publish_costs(name)
        print(
            f"| {c['profile']} | {c['gpus']} | {c['devices']} | {c['slices']} | {c['counters']} "
            f"| {c['ranks']} | {c['kib']:.0f} |"
        )
    print("\nThe device plugin's exact search (every size, random occupancies):\n")
    print(
        "| profile | cases | exact optimal | first-fit optimal | greedy optimal | p50 ms | max ms |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in search_table(trials=3, rng=rng):
        print(
            f"| {r['profile']} | {r['cases']} | {r['exact']}/{r['cases']} | {r['first']}/"
            f"{r['cases']} | {r['greedy']}/{r['cases']} | {r['p50']:.2f} | {r['max']:.2f} |"
        )
    print(f"\npython {sys.version.split()[0]}; trials={trials}, seed={args.seed}")
    return 0 if ranks_optimal else 1


if __name__ == "__main__":
    sys.exit(main())
