"""How many N-GPU sets this node's free GPUs still give, and how well connected the best one is.

Why it exists: free-GPU counts hide fragmentation. A node with four free GPUs on two NVLink
islands fits a 4-GPU job only badly, and one with a single free GPU fits no 2-GPU job at all.
The node agent already ranks the free GPUs' sets for the scheduler (:mod:`.gpusets`); this module
turns the same ladder into the numbers an operator graphs (``dra_driver_placeable_sets``,
``dra_driver_best_set_links``, docs/metrics.md, docs/capacity.md):

* ``placeable[N]``: how many disjoint N-GPU sets the free GPUs give, taking them the way the set
  ranks do (rank 1 = the best free N-set, rank 2 = the best of what is left, ...): the length of
  the ladder, which is ``free // N``;
* ``best_links[N]``: the NVLink links summed over the pairs of the best free N-set (rank 1), and
  ``best_links_max[N]`` the same on the empty node: the best the hardware can do. A node whose
  ``best_links`` is below ``best_links_max`` places its next N-GPU job on a worse set than it
  could when empty.

Free: a full GPU (not in MIG mode) neither held by a prepared claim nor unhealthy. Sizes run from
1 to the node's full GPUs. Pure and cheap: the rank keys of a topology are cached by
:mod:`.gpusets`, and one call is a handful of passes over the free GPUs' subsets
(``benchmarks/capacity.py`` measures it).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from dra_driver import records
from dra_driver.devices import gpusets, model, topology


@records.record
class SetCapacity:
    """One node's numbers; ``best_links``/``best_links_max`` lack sizes they cannot tell
    (more than :data:`~.gpusets.MAX_GPUS` GPUs: no ranking)."""

    free: int
    held: int
    unhealthy: int
    placeable: Mapping[int, int]
    best_links: Mapping[int, int]
    best_links_max: Mapping[int, int]


def of(
    devices: model.NodeDevices,
    *,
    held: Collection[str] = (),
    unhealthy_uuids: Collection[str] = (),
    empty: SetCapacity | None = None,
) -> SetCapacity:
    """The node's set capacity with the GPUs named in ``held`` held and those whose UUID is in
    ``unhealthy_uuids`` unhealthy (a held GPU that is unhealthy counts as held). ``empty``: this
    node's own result with nothing held or unhealthy, to reuse its maxima."""
    gpus = gpusets.eligible(devices)
    held_names = {g.name for g in gpus if g.name in held}
    sick = {g.name for g in gpus if g.uuid in unhealthy_uuids and g.name not in held_names}
    blocked = held_names | sick
    free = [g for g in gpus if g.name not in blocked]
    n = len(gpus)
    placeable = {size: len(free) // size for size in range(1, n + 1)}
    best = _best_links(devices, gpus, free, blocked)
    if empty is None:
        maxima = best if not blocked else _best_links(devices, gpus, gpus, set())
    else:
        maxima = dict(empty.best_links_max)
    return SetCapacity(
        free=len(free),
        held=len(held_names),
        unhealthy=len(sick),
        placeable=placeable,
        best_links=best,
        best_links_max=maxima,
    )


def _best_links(
    devices: model.NodeDevices,
    gpus: list[model.Gpu],
    free: list[model.Gpu],
    blocked: Collection[str],
) -> dict[int, int]:
    """Size -> links of the best free set of that size (sizes with at least one such set)."""
    n = len(gpus)
    if n > gpusets.MAX_GPUS:
        return {}
    out = {1: 0} if free else {}
    if n >= 3:
        for size, chain in gpusets.ranked(devices, taken=blocked, max_ranks=1).items():
            if chain:
                out[size] = chain[0].score[0]
    elif len(free) == 2:  # no ranks below 3 GPUs: the pair is its own best set
        out[2] = topology.build(devices).links(free[0].index, free[1].index)
    if n >= 3 and len(free) == n:
        out[n] = gpusets.set_score(topology.build(devices), [g.index for g in gpus])[0]
    return out
