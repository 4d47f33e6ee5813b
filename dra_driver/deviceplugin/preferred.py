"""GetPreferredAllocation as a pure function: which of the offered devices a container should get.

The kubelet offers the free device IDs, the ones that must be in the answer and a size. We answer
with the topology-optimal set from the allocation core's exact search
(:mod:`dra_driver.allocation.placement`: NVLink links, then same NUMA node, then same PCIe root),
so ``nvidia.com/gpu: 4`` on a DGX-1 gets a fully connected quad instead of the first four IDs.
With time-slicing replicas the set is spread over as many distinct GPUs (or MIG devices) as the
size allows, preferring the least loaded ones when topology ties. A single whole GPU is the one
whose loss leaves the node's best sets whole (:func:`dra_driver.devices.gpusets.singles`, the
order the DRA side publishes as digit 1 of ``setRanks``): ``nvidia.com/gpu: 1`` no longer breaks
the best quad of a DGX-1 or the best 8-GPU set of a 16-GPU mesh by taking the first free ID.
"""

from __future__ import annotations

from collections.abc import Sequence

from dra_driver.allocation import placement
from dra_driver.deviceplugin import inventory
from dra_driver.devices import gpusets, topology


def choose(
    resource: inventory.Resource,
    topo: topology.Topology,
    *,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
) -> list[str]:
    """The preferred device IDs (in the resource's list order).

    Raises :class:`~dra_driver.deviceplugin.inventory.RequestError` for unknown IDs or a size
    that cannot be met. ``must_include`` IDs count as available even if the kubelet left them
    out of ``available``.
    """
    must = resource.lookup(must_include, field="must_include_deviceIDs")
    offered = resource.lookup(available, field="available_deviceIDs")
    pool = list({d.id: d for d in (*must, *offered)}.values())
    if size < 1:
        raise inventory.RequestError(f"allocation_size must be at least 1, got {size}")
    if size < len(must):
        raise inventory.RequestError(
            f"allocation_size {size} is smaller than the {len(must)} must-include devices"
        )
    if size > len(pool):
        raise inventory.RequestError(
            f"allocation_size {size} is larger than the {len(pool)} available devices of "
            f"resource {resource.name}"
        )
    order = {d.id: i for i, d in enumerate(resource.devices)}
    pool.sort(key=lambda d: order[d.id])
    if any(d.replica is not None for d in pool):
        picked = _spread(topo, pool, must, size)
    elif size == 1 and not must and (one := _single(resource, topo, pool)) is not None:
        picked = [one]
    else:
        picked = _best(topo, pool, must, size)
    return sorted(picked, key=order.__getitem__)


def _single(
    resource: inventory.Resource, topo: topology.Topology, pool: list[inventory.PluginDevice]
) -> str | None:
    """The offered whole GPU whose loss hurts the node's best sets least; None for MIG
    devices (their sets are not ranked) or nodes too large to rank."""
    if any(d.unit.mig is not None for d in resource.devices):
        return None
    every = sorted({d.unit.gpu_index for d in resource.devices})
    order = gpusets.singles(topo, every, [d.unit.gpu_index for d in pool], max_ranks=1)
    return next((d.id for d in pool if order and d.unit.gpu_index == order[0]), None)


def _best(
    topo: topology.Topology,
    pool: list[inventory.PluginDevice],
    must: list[inventory.PluginDevice],
    size: int,
) -> list[str]:
    """One device per unit: the exact best subset over the devices themselves."""
    weights = placement.Weights.from_topology(topo, [d.unit.gpu_index for d in pool])
    pos = {d.id: i for i, d in enumerate(pool)}
    forced = [pos[d.id] for d in must]
    cands = [i for i in range(len(pool)) if i not in set(forced)]
    result = placement.best_subset(weights, cands, size - len(forced), must=forced)
    if result is None:  # cannot happen: sizes were checked; keep the failure explicit
        raise inventory.RequestError(f"no set of {size} devices found")
    return [pool[i].id for i in (*forced, *result.items)]


def _spread(
    topo: topology.Topology,
    pool: list[inventory.PluginDevice],
    must: list[inventory.PluginDevice],
    size: int,
) -> list[str]:
    """Replicas: pick the best set of units (GPUs or MIG devices), then fill them evenly."""
    by_unit: dict[str, list[inventory.PluginDevice]] = {}
    for dev in pool:
        by_unit.setdefault(dev.unit.uuid, []).append(dev)
    # Preference order for ties: units with the most free replicas first (least loaded).
    units = sorted(by_unit, key=lambda u: -len(by_unit[u]))
    pos = {u: i for i, u in enumerate(units)}
    weights = placement.Weights.from_topology(topo, [by_unit[u][0].unit.gpu_index for u in units])
    forced = sorted({pos[d.unit.uuid] for d in must})
    want = min(size, len(units))
    cands = [i for i in range(len(units)) if i not in set(forced)]
    result = placement.best_subset(weights, cands, want - len(forced), must=forced)
    if result is None:
        raise inventory.RequestError(f"no set of {want} GPUs found for {size} replicas")
    chosen = [units[i] for i in (*forced, *result.items)]
    picked = [d.id for d in must]
    taken = {u: sum(1 for d in must if d.unit.uuid == u) for u in chosen}
    while len(picked) < size:
        # The chosen unit with the fewest picked replicas that still has a free one.
        unit = min(
            (u for u in chosen if any(d.id not in picked for d in by_unit[u])),
            key=lambda u: taken[u],
        )
        dev = next(d for d in by_unit[unit] if d.id not in picked)
        picked.append(dev.id)
        taken[unit] += 1
    return picked
