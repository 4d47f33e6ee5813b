"""Scheduler cost at cluster scale: the DRA allocator's work per pod for each slice design.

Why it exists: what nodes publish costs kube-scheduler time on every node it filters for every
pod. A real v1.36.2 scheduler on 200 DGX-H100 nodes, 300 pods of 4 GPUs each, bound 13.1 pods/s
with one device per GPU, 0.5 pods/s with the GPU sets we published (generated claim) and about
0.1 pods/s with those sets and a plain ``count: 4`` claim. This benchmark shows where that
goes, without a cluster: it runs kube-scheduler's loop (``dra_driver.allocation.schedloop``:
rotating start node, ``numFeasibleNodesToFind``, one pod after the other) over N identical
DGX-H100 nodes (fake profile ``dgx-h100``, 8 GPUs) and counts, for every node filtered, the
work of the structured allocator's ``Allocate`` as the upstream loops do it
(``dra_driver.allocation.schedwork``: ``GatherPools`` and the search ``allocateOne``).

Designs (how every node publishes; the claim each pod has):

* ``plain``: one device per GPU, no counters (``--gpu-sets=false``); claim ``count: 4``;
* ``sets-v2``: the GPU sets we published until now (8 GPUs + 83 set devices consuming per-GPU
  shared counters, 3 slices; ``fixtures/gpu-sets-v2-dgx-h100.json.gz``); the generated claim of
  that version (``fixtures/claim-v2-gpus-4.json``: one 4-GPU set, else ``count: 4``);
* ``sets-v2+count4``: the same slices, a plain ``count: 4`` claim;
* ``ranks-caught-up`` / ``ranks-stale``: what ships: GPUs with their set ranks packed in one
  int attribute ``setRanks`` (digit N, from the right, is the rank for N GPUs), no set
  devices, no counters (``build.build(..., taken=...)``); the generated claim
  (``claimgen.claim(4)``: rank subrequests on the selector-less class ``gpu-ranked.nvidia.com``,
  each with one selector testing the driver and the digit). Caught up: each node republishes
  with its allocated GPUs as taken after every allocation on it; stale: the slices published
  before the burst stay for the whole run;
* ``ranks-without-class``: the same slices, the claim ``dra-driver claim
  --without-ranked-class`` writes (rank subrequests on ``gpu.nvidia.com``: its selector and the
  digit's, two evaluations per device and subrequest);
* ``per-size`` / ``per-size-stale``: the design shipped before, for comparison: one int
  attribute ``setRank<N>`` per size, rank subrequests on ``gpu.nvidia.com`` testing
  ``setRank<N>``; ``per-size-one-selector``: those attributes with the one-selector claim.

Besides the loop counts, ``cost`` weighs what the real allocator copies per device: every
attribute and capacity of a converted device once, and of a device a selector is evaluated on
twice (``selectorsMatch`` converts the device for each expression, ``cel.DeviceMatches`` builds
the map of all its attributes), so a device's size and the number of expressions evaluated on
it count (``dra_driver.allocation.schedwork``). ``pods/s x plain`` is plain's cost over a
design's: the throughput ratio the cost predicts (real v1.36.2 scheduler, 1,000 nodes: the
per-size set ranks 0.51x of plain; the cost says 0.47x; the shipped design 0.93x by the cost,
0.81x on stale ranks, not yet timed on a real scheduler).

Run: ``python benchmarks/scheduler_scale.py [--nodes 1,50,200,1000] [--pods 300]
[--designs plain,sets-v2] [--pick first|spread]``; the cost at 1,000 nodes, 1,000 pods:
``--nodes 1000 --pods 1000 --designs plain,ranks-caught-up,ranks-stale,ranks-without-class,
per-size,per-size-stale,per-size-one-selector``. Counts are exact for the emulation; wall
times are of this Python emulation (memoized), not of the scheduler.
"""

from __future__ import annotations

import argparse
import gzip
import inspect
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dra_driver.allocation import claimgen, schedloop, schedwork, simulator  # noqa: E402
from dra_driver.devices import fake, model, passthrough  # noqa: E402
from dra_driver.slices import build  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "fixtures"
PROFILE = "dgx-h100"
GPUS_PER_POD = 4
DRIVER = "gpu.nvidia.com"
DESIGNS = (
    "plain",
    "sets-v2",
    "sets-v2+count4",
    "ranks-caught-up",
    "ranks-stale",
    "ranks-without-class",
    "per-size",
    "per-size-stale",
    "per-size-one-selector",
    "plain-passthrough",
)
LABELS = {
    "plain": "plain",
    "sets-v2": "sets-v2",
    "sets-v2+count4": "sets-v2 + count:4",
    "ranks-caught-up": "ranks (agent caught up)",
    "ranks-stale": "ranks (burst, stale)",
    "ranks-without-class": "ranks, no gpu-ranked class (caught up)",
    "per-size": "per-size ranks, before (caught up)",
    "per-size-stale": "per-size ranks, before (stale)",
    "per-size-one-selector": "per-size ranks, one selector (caught up)",
    "plain-passthrough": "plain, every GPU also offered for passthrough",
}
# The design shipped before (docs/topology.md, "What it costs the scheduler"): every size's rank
# in its own int attribute ``setRank<N>``, the rank subrequests on ``gpu.nvidia.com``.
PACKED = "setRanks"
PER_SIZE = "setRank"
# The class the v2 claim asks for; shipped with v2, kept here should the tree drop it.
SET_CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "gpu-set.nvidia.com"},
    "spec": {
        "selectors": [
            {
                "cel": {
                    "expression": f'device.driver == "{DRIVER}" && '
                    f'device.attributes["{DRIVER}"].type == "gpu-set"'
                }
            }
        ]
    },
}
Obj = dict[str, Any]


def plain_claim(gpus: int = GPUS_PER_POD) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"gpus-{gpus}-plain"},
        "spec": claimgen.spec(gpus, nvlink="any"),
    }


def v2_slices() -> list[Obj]:
    """The v2 sets slices of node ``node-x`` (the template node)."""
    with gzip.open(FIXTURES / "gpu-sets-v2-dgx-h100.json.gz", "rt") as f:
        items: list[Obj] = json.load(f)["items"]
    return items


def ranks_available() -> bool:
    """Whether this tree's ``build.build`` publishes rank attributes for ``taken`` GPUs."""
    return "taken" in inspect.signature(build.build).parameters


def designs(
    names: Sequence[str], gpus: int = GPUS_PER_POD
) -> tuple[list[schedloop.Design], list[str]]:
    """The designs asked for, pods of ``gpus`` GPUs, and lines about those this tree cannot
    run (the v2 sets' claim is recorded for 4 GPUs only)."""
    devices = fake.FakeBackend.from_name(PROFILE).discover()
    builtin = simulator.builtin_classes()
    classes = simulator.merge_classes([SET_CLASS], builtin)
    node = schedloop.TEMPLATE_NODE
    out: list[schedloop.Design] = []
    notes: list[str] = []

    def fixed(slices: list[Obj]) -> Callable[[frozenset[str]], list[Obj]]:
        return lambda _allocated: slices

    for name in names:
        label = LABELS[name]
        if name == "plain":
            plain = build.build(devices, node_name=node, gpu_sets=False).slices
            out.append(schedloop.Design(label, plain_claim(gpus), fixed(plain), classes))
        elif name == "plain-passthrough":  # twice the devices, a counter per GPU
            offered = passthrough.mark(devices, passthrough.Passthrough.parse("all"))
            both = build.build(offered, node_name=node, gpu_sets=False).slices
            out.append(schedloop.Design(label, plain_claim(gpus), fixed(both), classes))
        elif name.startswith("sets-v2") and gpus != GPUS_PER_POD:
            notes.append(f"{label}: skipped, recorded for {GPUS_PER_POD}-GPU pods only")
        elif name == "sets-v2":
            claim = json.loads((FIXTURES / "claim-v2-gpus-4.json").read_text())
            out.append(schedloop.Design(label, claim, fixed(v2_slices()), classes))
        elif name == "sets-v2+count4":
            out.append(schedloop.Design(label, plain_claim(), fixed(v2_slices()), classes))
        elif not ranks_available():
            notes.append(f"{label}: skipped, build.build has no taken= in this tree")
        else:
            packed = not name.startswith("per-size")
            one_selector = name != "ranks-without-class" and (packed or "one-selector" in name)
            out.append(
                schedloop.Design(
                    label,
                    rank_claim(gpus, packed=packed, one_selector=one_selector),
                    _ranked(devices, packed=packed),
                    classes,
                    follows_allocations=not name.endswith("stale"),
                )
            )
    return out, notes


def rank_claim(gpus: int, *, packed: bool = True, one_selector: bool = True) -> Obj:
    """The generated claim (packed, one selector), the one ``--without-ranked-class`` writes
    (packed, not one selector), or the per-size design's (``packed=False``)."""
    ranked_class = claimgen.RANKED_CLASS if one_selector else None
    claim: Obj = claimgen.claim(gpus, ranked_class=ranked_class)
    if packed:
        return claim
    for sub in claim["spec"]["devices"].get("requests", [{}])[0].get("firstAvailable", ()):
        if sub["name"].startswith("rank"):
            rank = int(sub["name"][len("rank") :])
            test = f'device.attributes["{DRIVER}"].?{PER_SIZE}{gpus}.orValue(0) == {rank}'
            if one_selector:
                test = f'device.driver == "{DRIVER}" && {test}'
            sub["selectors"] = [{"cel": {"expression": test}}]
    return claim


def per_size(slices: list[Obj]) -> list[Obj]:
    """The slices with every GPU's ``setRanks`` spread into one ``setRank<N>`` per size (the
    design shipped before): N from 1 to the ranked GPUs minus one, as the agent ranked them."""
    out = json.loads(json.dumps(slices))
    devices = [d for sl in out for d in sl["spec"].get("devices") or ()]
    sizes = range(1, sum(PACKED in d["attributes"] for d in devices))
    for dev in devices:
        attrs = dev["attributes"]
        packed = attrs.pop(PACKED, None)
        if packed is not None:
            for size in sizes:
                attrs[f"{PER_SIZE}{size}"] = {"int": packed["int"] // 10 ** (size - 1) % 10}
            dev["attributes"] = dict(sorted(attrs.items()))
    return out


def _ranked(
    devices: model.NodeDevices, *, packed: bool = True
) -> Callable[[frozenset[str]], list[Obj]]:
    def publish(allocated: frozenset[str]) -> list[Obj]:
        gpus = frozenset(g.name for g in devices.gpus if g.name in allocated)
        built: list[Obj] = build.build(  # type: ignore[call-arg,unused-ignore]
            devices, node_name=schedloop.TEMPLATE_NODE, taken=gpus
        ).slices
        return built if packed else per_size(built)

    return publish


COLUMNS = (
    ("nodes", "nodes in the cluster"),
    ("design", "how nodes publish, and the pods' claim"),
    ("bound", "pods bound / pods (never more pods than fit: nodes x 8 / GPUs per pod)"),
    ("filtered", "nodes filtered per pod (numFeasibleNodesToFind, rotating start)"),
    ("work", "allocator work per pod: the sum of the six counters"),
    ("gathered", "slices converted by GatherPools (addSlice, buildPool's not-targeting slices)"),
    ("converted", "devices in those slices (Convert_v1_ResourceSlice_To_api_ResourceSlice)"),
    ("scanned", "checkSlicesInPool iterations over all the cluster's slices"),
    ("visited", "allocateOne device-loop iterations, in-use devices included"),
    ("cel", "selector expressions evaluated (selectorsMatch; deviceMatchesRequest cache)"),
    ("counters", "checkAvailableCounters calls (devices consuming counters)"),
    ("x plain", "work per pod over plain's at the same node count"),
    (
        "cost",
        "work + entries copied: converted devices' attributes+capacities once, a CEL"
        " evaluation's device twice (conversion, attribute map)",
    ),
    ("cost x plain", "cost per pod over plain's"),
    ("pods/s x plain", "plain's cost over this design's: the throughput ratio the cost predicts"),
    ("ms/pod", "wall time of this emulation per pod (memoized; not the scheduler's)"),
)


def row(result: schedloop.Result, plain_work: tuple[float, float] | None) -> list[str]:
    pods = max(result.pods, 1)
    per = {k: v / pods for k, v in result.work.as_dict().items()}
    ratio = f"{per['total'] / plain_work[0]:,.1f}" if plain_work else "-"
    cost = f"{per['cost'] / plain_work[1]:,.2f}" if plain_work else "-"
    speed = f"{plain_work[1] / per['cost']:,.2f}" if plain_work else "-"
    return [
        str(result.nodes),
        result.design,
        f"{result.bound}/{result.pods}",
        f"{result.filtered / pods:,.1f}",
        f"{per['total']:,.0f}",
        *(f"{per[f]:,.0f}" for f in schedwork.FIELDS),
        ratio,
        f"{per['cost']:,.0f}",
        cost,
        speed,
        f"{result.seconds / pods * 1e3:.2f}",
    ]


def table(
    node_counts: Sequence[int],
    pods: int,
    chosen: Sequence[schedloop.Design],
    pick: str,
    gpus: int = GPUS_PER_POD,
) -> list[list[str]]:
    rows: list[list[str]] = []
    for nodes in node_counts:
        count = min(pods, nodes * 8 // gpus)
        plain_work: tuple[float, float] | None = None
        for design in chosen:
            result = schedloop.run(design, nodes=nodes, pods=count, pick=pick)
            if design.name == LABELS["plain"]:
                per_pod = max(result.pods, 1)
                plain_work = (result.work.total / per_pod, result.work.cost / per_pod)
            rows.append(row(result, plain_work))
    return rows


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--nodes", type=_ints, default=[1, 50, 200, 1000], help="e.g. 1,50,200")
    parser.add_argument("--pods", type=int, default=300, help="pending pods per run (default 300)")
    parser.add_argument(
        "--designs", default=",".join(DESIGNS), help=f"comma-separated: {', '.join(DESIGNS)}"
    )
    parser.add_argument(
        "--pick",
        choices=schedloop.PICKS,
        default="first",
        help="node a pod goes to: the first feasible found, or the one with fewest pods",
    )
    parser.add_argument(
        "--gpus", type=int, default=GPUS_PER_POD, help="GPUs per pod (default 4; 1 to 7)"
    )
    args = parser.parse_args(argv)
    if not 1 <= args.gpus <= 7:
        parser.error(f"--gpus must be between 1 and 7 (a DGX H100 has 8 GPUs), not {args.gpus}")
    names = [n.strip() for n in args.designs.split(",") if n.strip()]
    unknown = [n for n in names if n not in DESIGNS]
    if unknown:
        parser.error(f"unknown design(s) {', '.join(unknown)}; known: {', '.join(DESIGNS)}")
    names.sort(key=DESIGNS.index)  # plain first: the others' ratio is to it
    chosen, notes = designs(names, args.gpus)
    start = time.perf_counter()
    rows = table(args.nodes, args.pods, chosen, args.pick, args.gpus)
    header = [c for c, _ in COLUMNS]
    print("Allocator work per pod: kube-scheduler's loop over N DGX-H100 nodes (8 GPUs each),")
    print(f"pods of one claim for {args.gpus} GPUs, scheduled one after another.\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print()
    for line in notes:
        print(f"note: {line}")
    print("Columns:")
    for name, text in COLUMNS:
        print(f"  {name}: {text}")
    where = "first feasible node found" if args.pick == "first" else "feasible node, fewest pods"
    print(
        "Counters mirror kube-scheduler 1.36 (structured/internal/incubating); work = one unit\n"
        "per loop iteration or call, whatever it costs in time. Scoring is not modelled: the pod\n"
        f"goes to the {where} (--pick)."
    )
    print(f"\npython {sys.version.split()[0]}; {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
