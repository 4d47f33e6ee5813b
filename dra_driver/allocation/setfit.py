"""Will the next N-GPU job fit? The fleet's answer per claim size, from slices and claims.

Why it exists: free-GPU counts hide fragmentation (400 free GPUs one or two per node fit no
8-GPU job) and topology (four free GPUs on two NVLink islands fit a 4-GPU job only badly). This
is the computation behind ``dra-driver capacity`` (docs/capacity.md); the nodes come from
:mod:`.fleetnodes`. No Kubernetes client here: the CLI is the adapter.

Per node and claim size N, with F the node's free GPUs (each size on its own, never jointly):

* ``fit`` = ``len(F) // N``: how many claims for N GPUs of one node the allocator places there
  one after another (any N free GPUs satisfy a plain or a ``dra-driver claim`` claim);
* the *ladder* of N-sets is the set ranks' (:mod:`dra_driver.devices.gpusets`): the best N-subset
  of F, then the best of what is left, ... (score: NVLink links, same-NUMA pairs, same-PCIe-root
  pairs; ties to the lowest GPUs) — the sets a burst of ``dra-driver claim --gpus N`` claims gets;
* ``optimal``: how many sets of the ladder are as well connected as the best N-set of the same
  node when empty (equal score): the claims that would get a topology-optimal set now;
* ``stranded``: free GPUs in no set of the ladders of the sizes asked above 1 (every free GPU is
  a 1-GPU set); e.g. the fifth free GPU of a node asked for 2 and 4.

A fleet's numbers are the sums over its nodes. Nodes with more than 16 GPUs get ``fit`` but no
``optimal`` (no ranking: ``None``, reported as unknown).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from typing import Any

from dra_driver import records
from dra_driver.allocation import fleetnodes
from dra_driver.devices import gpusets

DEFAULT_SIZES = (1, 2, 4, 8)
MAX_SIZE = 1024


class SizeError(ValueError):
    """A claim size that is not a positive integer (names it)."""


@records.record
class NodeFit:
    node: fleetnodes.NodeGpus
    fit: dict[int, int]
    optimal: dict[int, int | None]
    stranded: int

    @property
    def free(self) -> int:
        return self.node.free.bit_count()


@records.record
class Fleet:
    sizes: tuple[int, ...]
    nodes: tuple[NodeFit, ...]

    def fit(self, size: int) -> int:
        return sum(n.fit[size] for n in self.nodes)

    def optimal(self, size: int) -> int:
        return sum(n.optimal[size] or 0 for n in self.nodes)

    def fitting(self, size: int) -> list[str]:
        """Nodes with room for at least one claim of ``size``."""
        return [n.node.node for n in self.nodes if n.fit[size] > 0]


def parse_sizes(texts: Iterable[str]) -> tuple[int, ...]:
    """``--sizes 3,16`` (repeatable) added to :data:`DEFAULT_SIZES`, sorted, no repeats."""
    sizes = set(DEFAULT_SIZES)
    for text in texts:
        for part in text.split(","):
            word = part.strip()
            if not word.isdigit() or not 1 <= int(word) <= MAX_SIZE:
                raise SizeError(f"size {word!r}: must be a whole number of GPUs, 1 to {MAX_SIZE}")
            sizes.add(int(word))
    return tuple(sorted(sizes))


class _Keys:
    """Rank keys per distinct topology, and best subsets per (topology, free GPUs): nodes of
    one kind share them, which keeps a fleet of thousands of nodes at milliseconds per kind."""

    def __init__(self) -> None:
        self._ids: dict[tuple[tuple[fleetnodes.Score, ...], ...], int] = {}
        self._keys: list[array[int]] = []
        self._best: dict[tuple[int, int], dict[int, int]] = {}

    def of(self, pairs: tuple[tuple[fleetnodes.Score, ...], ...]) -> int:
        kid = self._ids.get(pairs)
        if kid is None:
            kid = self._ids[pairs] = len(self._keys)
            self._keys.append(gpusets.subset_keys(pairs))
        return kid

    def key(self, kid: int, mask: int) -> int:
        return self._keys[kid][mask]

    def best(self, kid: int, left: int) -> dict[int, int]:
        found = self._best.get((kid, left))
        if found is None:
            found = self._best[(kid, left)] = gpusets.best_subsets(self._keys[kid], left)
        return found


def node_fit(node: fleetnodes.NodeGpus, sizes: Sequence[int], keys: _Keys) -> NodeFit:
    """One node's numbers for every size."""
    n, free = len(node.names), node.free
    count = free.bit_count()
    fit = {size: count // size if size <= n else 0 for size in sizes}
    optimal: dict[int, int | None] = {}
    covered = 0
    multi = [s for s in sizes if s > 1]
    if n > gpusets.MAX_GPUS:  # not ranked: no ladder; stranded at most what the best size leaves
        optimal = {s: None for s in sizes}
        stranded = min((count % s if s <= n else count for s in multi), default=0)
        return NodeFit(node, fit, optimal, stranded)
    kid = keys.of(node.pairs) if n else -1
    for size in sizes:
        if size == 1:
            optimal[size] = count
            continue
        if fit[size] == 0:
            optimal[size] = 0
            continue
        target = keys.key(kid, keys.best(kid, (1 << n) - 1)[size]) >> n
        left, good = free, 0
        while left.bit_count() >= size:
            mask = keys.best(kid, left)[size]
            good += int(keys.key(kid, mask) >> n == target)
            covered |= mask
            left &= ~mask
        optimal[size] = good
    stranded = (free & ~covered).bit_count() if multi else 0
    return NodeFit(node, fit, optimal, stranded)


def fleet(nodes: Iterable[fleetnodes.NodeGpus], sizes: Sequence[int] = DEFAULT_SIZES) -> Fleet:
    """Every node's numbers for ``sizes``."""
    keys = _Keys()
    return Fleet(tuple(sizes), tuple(node_fit(n, sizes, keys) for n in nodes))


UNKNOWN_TEXT = {
    fleetnodes.ISLAND_LINKS: "NVLink link counts between GPUs are not in the slices: sets are "
    "judged by nvlinkIsland (one link per pair on an island; coarse on NVLink meshes)",
    fleetnodes.NUMA: "the NUMA node of some GPUs is not published",
    fleetnodes.PCIE_ROOT: "the PCIe root of some GPUs is not published",
    fleetnodes.UNUSABLE: "the pool is incomplete or invalid: its GPUs are not counted",
    "ranking": "more than 16 GPUs: not ranked, optimal not computed",
}


def unknowns(result: Fleet) -> dict[str, list[str]]:
    """What the slices do not tell, with the nodes concerned."""
    out: dict[str, list[str]] = {}
    for nf in result.nodes:
        flags = set(nf.node.unknown)
        if len(nf.node.names) > gpusets.MAX_GPUS:
            flags.add("ranking")
        for flag in flags:
            out.setdefault(flag, []).append(nf.node.node)
    return dict(sorted(out.items()))


def report(result: Fleet, *, by_node: bool = False) -> dict[str, Any]:
    """The JSON answer (``-o json``)."""
    gpus = {
        "total": sum(len(n.node.names) for n in result.nodes),
        "free": sum(n.free for n in result.nodes),
        "held": sum(n.node.held for n in result.nodes),
        "unhealthy": sum(n.node.unhealthy for n in result.nodes),
    }
    largest = max(result.sizes)
    out: dict[str, Any] = {
        "nodes": len(result.nodes),
        "gpus": gpus,
        "sizes": {
            str(s): {
                "fit": result.fit(s),
                "optimal": result.optimal(s),
                "nodes": len(result.fitting(s)),
            }
            for s in result.sizes
        },
        "largest": {"size": largest, "nodes": result.fitting(largest)},
        "stranded": {
            "gpus": sum(n.stranded for n in result.nodes),
            "nodes": [n.node.node for n in result.nodes if n.stranded],
        },
        "unknown": [
            {"what": UNKNOWN_TEXT[flag], "nodes": names} for flag, names in unknowns(result).items()
        ],
    }
    if by_node:
        out["byNode"] = {
            n.node.node: {
                "product": n.node.product,
                "gpus": len(n.node.names),
                "free": n.free,
                "held": n.node.held,
                "unhealthy": n.node.unhealthy,
                "stranded": n.stranded,
                "sizes": {str(s): {"fit": n.fit[s], "optimal": n.optimal[s]} for s in result.sizes},
                **({"problem": n.node.problem} if n.node.problem else {}),
            }
            for n in result.nodes
        }
    return out
