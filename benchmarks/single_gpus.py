"""Single-GPU claims and the best sets they leave: first fit against single-GPU ranks.

Why it exists: a claim for one GPU takes the first free GPU under first fit, and on NVLink meshes
that can break the node's best 4- or 8-GPU set for the next job. The agent publishes
digit 1 of ``setRanks`` (the free GPUs in the order whose loss hurts the best sets least,
``dra_driver.devices.gpusets.singles``) and ``dra-driver claim --gpus 1`` asks for them first.
This benchmark counts, per profile, how many optimal sets of the *largest job size* S (half the
node's GPUs: 8 on the 16-GPU mesh, 4 on 8-GPU nodes, 2 on 4-GPU nodes; optimal = the empty
node's best score) are still free after single-GPU claims, allocated by the project's
emulation of the 1.36 allocator (``dra_driver.allocation.allocator``) on the slices the agent
publishes:

* ``fill``: k single claims on an empty node (k = 1 .. GPUs - S). *first fit*: the plain claim
  ``count: 1``; *ranks*: the generated claim, the agent re-ranking after each claim; *burst*:
  the generated claim, all k allocated on the empty node's ranks (the agent saw none yet);
* ``churn``: a seeded stream of single claims arriving and finishing (a random held one
  finishes with probability 0.4 per step, arrivals only while more than S GPUs are free);
  after every arrival: is an optimal S-set still free, and how many are.

Run: ``python benchmarks/single_gpus.py [--profiles dgx-1-v100,hgx-16-mesh]
[--steps 200] [--seed 7]``. Counts are exact for the emulation.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dra_driver.allocation import allocator, capacity, claimgen, simulator  # noqa: E402
from dra_driver.devices import fake, gpusets, model, topology  # noqa: E402
from dra_driver.slices import build  # noqa: E402

PROFILES = ("dgx-1-v100", "hgx-16-mesh", "dgx-h100", "h100-nvl-pairs")
NODE = "node-x"
DRIVER = "gpu.nvidia.com"
DESIGNS = ("first fit", "ranks", "burst")
Obj = dict[str, Any]


class Node:
    """One node of a profile: its devices, the optimal S-sets as bit masks of GPU indices."""

    def __init__(self, profile: str) -> None:
        self.profile = profile
        self.devices: model.NodeDevices = fake.FakeBackend.from_name(profile).discover()
        topo = topology.build(self.devices)
        self.index = {g.name: g.index for g in self.devices.gpus}
        every = [g.index for g in self.devices.gpus]
        self.size = len(every) // 2
        scored = [
            (gpusets.set_score(topo, c), sum(1 << i for i in c))
            for c in itertools.combinations(every, self.size)
        ]
        best = max(s for s, _ in scored)
        self.optimal = [m for s, m in scored if s == best]

    def sets_left(self, held: Sequence[str]) -> int:
        mask = sum(1 << self.index[n] for n in held)
        return sum(1 for m in self.optimal if not m & mask)

    @functools.cache  # noqa: B019 - one Node per profile per run
    def slices(self, held: frozenset[str]) -> list[Obj]:
        return build.build(self.devices, node_name=NODE, taken=held).slices

    def allocate(self, the_claim: Obj, held: Sequence[str], *, stale: bool = False) -> str:
        """The GPU a single-GPU claim gets; ``stale``: on the empty node's slices."""
        outcome = allocator.allocate(
            the_claim,
            slices=self.slices(frozenset() if stale else frozenset(held)),
            classes=simulator.builtin_classes(),
            node_name=NODE,
            allocated={(DRIVER, NODE, n) for n in held},
            node_devices=self.devices,
        )
        if outcome.allocation is None:
            raise RuntimeError(f"{self.profile}: a single GPU did not fit: {outcome.explanation}")
        [result] = outcome.allocation["devices"]["results"]
        return str(result["device"])


def fill(node: Node) -> dict[str, list[int]]:
    """Optimal S-sets left after k = 1 .. GPUs - S single claims on the empty node."""
    steps = len(node.devices.gpus) - node.size
    out: dict[str, list[int]] = {}
    for design in DESIGNS:
        claim = claimgen.claim(1, nvlink="any" if design == "first fit" else "best")
        held: list[str] = []
        if design == "burst":
            inputs = simulator.Inputs(
                claims=[claimgen.claim(1, name=f"c{i}", namespace="d") for i in range(steps)],
                classes=simulator.builtin_classes(),
                slices=node.slices(frozenset()),
                node_name=NODE,
                allocated=set(),
                node_devices=node.devices,
                consumed=capacity.Ledger(),
            )
            for outcome in simulator.run(inputs):
                assert outcome.allocation is not None, outcome.explanation
                held.append(str(outcome.allocation["devices"]["results"][0]["device"]))
        else:
            for _ in range(steps):
                held.append(node.allocate(claim, held))
        out[design] = [node.sets_left(held[: k + 1]) for k in range(steps)]
    return out


def churn(node: Node, steps: int, seed: int) -> dict[str, tuple[float, float, int]]:
    """Per design: (share of arrivals leaving an optimal S-set free, mean S-sets left,
    arrivals). The draws do not depend on which GPU a claim got: every design sees the same
    stream."""
    out: dict[str, tuple[float, float, int]] = {}
    gpus = len(node.devices.gpus)
    for design in ("first fit", "ranks"):
        rng = random.Random(seed)
        claim = claimgen.claim(1, nvlink="any" if design == "first fit" else "best")
        held: list[str] = []
        kept = total = arrivals = 0
        for _ in range(steps):
            if held and (rng.random() < 0.4 or gpus - len(held) <= node.size):
                held.remove(rng.choice(held))
                continue
            held.append(node.allocate(claim, held))
            left = node.sets_left(held)
            arrivals += 1
            kept += left > 0
            total += left
        out[design] = (kept / max(arrivals, 1), total / max(arrivals, 1), arrivals)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--profiles", default=",".join(PROFILES), help="comma-separated")
    parser.add_argument("--steps", type=int, default=200, help="churn events per profile")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    profiles = [p.strip() for p in args.profiles.split(",") if p.strip()]
    start = time.perf_counter()
    nodes = [Node(p) for p in profiles]
    print("Optimal S-GPU sets left after k single-GPU claims on an empty node")
    print("(S = half the node's GPUs; k = 1, 2, ...; the empty node has the count in 'empty').\n")
    print("| profile | S | empty | first fit | single ranks | single ranks, burst |")
    print("|---|---|---|---|---|---|")
    for node in nodes:
        rows = fill(node)
        cells = [" ".join(str(x) for x in rows[d]) for d in DESIGNS]
        print(
            f"| {node.profile} | {node.size} | {node.sets_left([])} | " + " | ".join(cells) + " |"
        )
    print(f"\nChurn: {args.steps} events (seed {args.seed}), single claims arriving and finishing;")
    print("after each arrival: an optimal S-set still free (share), optimal S-sets free (mean).\n")
    print("| profile | S | arrivals | first fit: kept / mean | single ranks: kept / mean |")
    print("|---|---|---|---|---|")
    for node in nodes:
        res = churn(node, args.steps, args.seed)
        arrivals = res["ranks"][2]
        cells = [f"{res[d][0]:.0%} / {res[d][1]:.2f}" for d in ("first fit", "ranks")]
        print(f"| {node.profile} | {node.size} | {arrivals} | " + " | ".join(cells) + " |")
    print(f"\npython {sys.version.split()[0]}; {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
