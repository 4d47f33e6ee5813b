"""kube-scheduler's loop over pending pods and nodes, counting its DRA allocator's work.

Why it exists: how a node's devices are published (one device per GPU, GPU sets sharing
counters, rank attributes) changes what *the scheduler* does for every pod on every node it
filters, and at cluster scale that decides its throughput. :func:`run` schedules pods one after
another, each with one ResourceClaim, as ``pkg/scheduler/schedule_one.go`` does:

* ``numFeasibleNodesToFind`` (:func:`num_feasible_nodes_to_find`): all nodes below 100; else
  ``percentageOfNodesToScore`` (default adaptive: 50 - nodes/125, at least 5 %) of the nodes,
  at least 100;
* ``findNodesThatPassFilters``: nodes are filtered from a start index that rotates over the
  cluster (``nextStartNodeIndex`` advances by the nodes processed, feasible or not) until that
  many feasible nodes are found. Upstream filters 16 nodes at a time and may filter a few more
  than needed; here one after the other;
* a node's Filter is the DRA plugin's ``Allocate(node, claims)``: ``GatherPools`` over the
  cluster's slices (:mod:`.gatherwork`) and the search (:mod:`.firstfit`), each counted
  (:class:`schedwork.Work`);
* scoring is not modelled: the pod goes to the first feasible node found (``first``) or to the
  one with the fewest pods bound, first found among equals (``spread``, as the default
  least-allocated scoring of CPU and memory would spread pods of equal requests). The claim is
  allocated there and the node's allocated devices grow. A pod no node fits stays pending (not
  retried).

Every node has the same hardware and publishes the slices of one template node
(:data:`TEMPLATE_NODE`), renamed (slice name, ``nodeName``, pool). A node's search sees only its
own pool (other pools' devices do not target it), so it runs on the template's slices: its
result depends only on what the node publishes and what is allocated on it, and is memoized
per (published state, allocated devices) within a run, for the design's claim; each Filter
still adds its full counted work. ``GatherPools``' work depends on the whole cluster and is
computed per node from the cluster's slices. A design whose agent follows allocations
(``follows_allocations``) republishes a node's slices after each allocation on it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dra_driver import records
from dra_driver.allocation import allocator, firstfit, gatherwork, pools, schedwork

TEMPLATE_NODE = "node-x"
PICKS = ("first", "spread")
MIN_FEASIBLE_NODES_TO_FIND = 100  # schedule_one.go minFeasibleNodesToFind
MIN_FEASIBLE_NODES_PERCENTAGE = 5  # minFeasibleNodesPercentageToFind
BASE_PERCENTAGE = 50  # schedulerapi.DefaultPercentageOfNodesToScore's adaptive base

Obj = Mapping[str, Any]
Publish = Callable[[frozenset[str]], Sequence[Obj]]


@dataclasses.dataclass(frozen=True)
class Design:
    """How each node publishes its devices, and the claim every pod has.

    ``publish(allocated device names)`` gives the template node's slices; unless
    ``follows_allocations`` it is called once, with nothing allocated (slices as published
    before the pods came).
    """

    name: str
    claim: Obj
    publish: Publish
    classes: Sequence[Obj]
    follows_allocations: bool = False


@dataclasses.dataclass
class Result:
    """One run: pods scheduled one after another onto ``nodes`` nodes."""

    design: str
    nodes: int
    pods: int
    bound: int = 0
    filtered: int = 0  # Filter calls (nodes filtered), all pods
    work: schedwork.Work = dataclasses.field(default_factory=schedwork.Work)
    seconds: float = 0.0
    searches: int = 0  # searches really run (the rest were memoized)
    placed: dict[str, int] = dataclasses.field(default_factory=dict)  # node -> pods bound


def num_feasible_nodes_to_find(num_all_nodes: int, percentage: int = 0) -> int:
    """``numFeasibleNodesToFind``: how many feasible nodes the scheduler looks for;
    ``percentage`` 0 is the adaptive default."""
    if num_all_nodes < MIN_FEASIBLE_NODES_TO_FIND:
        return num_all_nodes
    if percentage == 0:
        percentage = BASE_PERCENTAGE - num_all_nodes // 125
        percentage = max(percentage, MIN_FEASIBLE_NODES_PERCENTAGE)
    return max(num_all_nodes * percentage // 100, MIN_FEASIBLE_NODES_TO_FIND)


def rename(slices: Sequence[Obj], node: str, template: str = TEMPLATE_NODE) -> list[Obj]:
    """The template node's slices as ``node`` publishes them: name, ``nodeName`` and pool
    renamed (shallow copies; devices are shared)."""
    out: list[Obj] = []
    for sl in slices:
        meta = dict(sl.get("metadata") or {})
        name = str(meta.get("name") or "")
        if name.startswith(template):
            meta["name"] = node + name[len(template) :]
        spec = dict(sl["spec"])
        if spec.get("nodeName") == template:
            spec["nodeName"] = node
        pool = dict(spec["pool"])
        if pool.get("name") == template:
            pool["name"] = node
        spec["pool"] = pool
        out.append({**sl, "metadata": meta, "spec": spec})
    return out


@records.record
class _Search:
    work: schedwork.Work
    picks: tuple[pools.DeviceId, ...] | None  # None: the node does not fit the claim


class Scheduler:
    """The scheduling loop over ``node_names`` for one design (see the module docstring)."""

    def __init__(self, design: Design, node_names: Sequence[str], *, pick: str = "first") -> None:
        if pick not in PICKS:
            raise ValueError(f"pick must be one of {', '.join(PICKS)}, not {pick!r}")
        self.design = design
        self.nodes = list(node_names)
        self.pick = pick
        self.next_start = 0
        self.allocated: dict[str, frozenset[pools.DeviceId]] = {n: frozenset() for n in self.nodes}
        self.published: dict[str, frozenset[str]] = {n: frozenset() for n in self.nodes}
        self.bound: dict[str, int] = {n: 0 for n in self.nodes}
        self._templates: dict[frozenset[str], list[Obj]] = {}
        self._memo: dict[tuple[frozenset[str], frozenset[pools.DeviceId]], _Search] = {}
        self._renamed: dict[str, tuple[frozenset[str], list[Obj]]] = {}
        self._cluster: gatherwork.Cluster | None = None
        self.searches = 0

    def template(self, published: frozenset[str]) -> list[Obj]:
        """The template node's slices when its agent knows ``published`` are allocated."""
        if published not in self._templates:
            self._templates[published] = list(self.design.publish(published))
        return self._templates[published]

    def cluster(self) -> gatherwork.Cluster:
        """Every node's slices as published now (rebuilt after a node republished)."""
        if self._cluster is None:
            everything: list[Obj] = []
            for node in self.nodes:
                key = self.published[node]
                cached = self._renamed.get(node)
                if cached is None or cached[0] != key:
                    cached = (key, rename(self.template(key), node))
                    self._renamed[node] = cached
                everything += cached[1]
            self._cluster = gatherwork.Cluster(everything)
        return self._cluster

    def filter(self, node: str, work: schedwork.Work) -> tuple[pools.DeviceId, ...] | None:
        """The DRA Filter of one node: adds its work; the devices it would allocate (ids on
        the template node), or None."""
        work.add(self.cluster().gather_work(node))
        key = (self.published[node], self.allocated[node])
        found = self._memo.get(key)
        if found is None:
            found = self._search(*key)
            self._memo[key] = found
        work.add(found.work)
        return found.picks

    def _search(self, published: frozenset[str], allocated: frozenset[pools.DeviceId]) -> _Search:
        self.searches += 1
        work = schedwork.Work()
        ctx = allocator.prepare(
            self.design.claim,
            slices=self.template(published),
            classes=self.design.classes,
            node_name=TEMPLATE_NODE,
            allocated=allocated,
        )
        if ctx.error is not None:
            return _Search(work, None)
        verdict = firstfit.emulate(
            ctx.parsed, ctx.sel, bad_pools=ctx.bad_pools, ledger=ctx.ledger, work=work
        )
        if verdict.status != "allocated":
            return _Search(work, None)
        return _Search(work, tuple(ctx.sel.devices[pos].id for _, pos in verdict.picks))

    def schedule_pod(self, work: schedwork.Work) -> tuple[str | None, int]:
        """Schedule one pod: (the node it is bound to or None, nodes filtered)."""
        total = len(self.nodes)
        wanted = num_feasible_nodes_to_find(total)
        feasible: list[tuple[str, tuple[pools.DeviceId, ...]]] = []
        processed = 0
        for i in range(total):
            node = self.nodes[(self.next_start + i) % total]
            processed += 1
            picks = self.filter(node, work)
            if picks is not None:
                feasible.append((node, picks))
                if len(feasible) >= wanted:
                    break
        self.next_start = (self.next_start + processed) % total
        if not feasible:
            return None, processed
        if self.pick == "spread":
            node, picks = min(feasible, key=lambda f: self.bound[f[0]])
        else:
            node, picks = feasible[0]
        self.allocated[node] = self.allocated[node] | frozenset(picks)
        self.bound[node] += 1
        if self.design.follows_allocations:
            self.published[node] = frozenset(d for _, _, d in self.allocated[node])
            self._cluster = None  # the node republished its slices
        return node, processed


def node_names(count: int) -> list[str]:
    width = len(str(max(count - 1, 0)))
    return [f"node-{i:0{width}d}" for i in range(count)]


def run(design: Design, *, nodes: int, pods: int, pick: str = "first") -> Result:
    """Schedule ``pods`` pods, one claim each, onto ``nodes`` identical nodes."""
    sched = Scheduler(design, node_names(nodes), pick=pick)
    result = Result(design.name, nodes, pods)
    start = time.perf_counter()
    for _ in range(pods):
        node, filtered = sched.schedule_pod(result.work)
        result.filtered += filtered
        if node is not None:
            result.bound += 1
            result.placed[node] = result.placed.get(node, 0) + 1
    result.seconds = time.perf_counter() - start
    result.searches = sched.searches
    return result
