"""GPU-set devices and the per-GPU counters that keep them and single GPUs apart.

Why it exists: to let the stock scheduler pick NVLink-optimal GPU sets (docs/topology.md) the
pool publishes, next to one device per GPU, devices that each stand for a set of GPUs
(:mod:`dra_driver.devices.gpusets` decides which, best first). A set and the GPUs in it must
never both be allocated, so:

* the pool has one shared counter set, ``gpus``, with one counter per GPU, ``gpu-<minor>``,
  whose value is the GPU's memory: the counter stands for the whole GPU;
* a full-GPU device consumes its GPU's counter completely, a set device consumes every member's
  counter completely; the scheduler allocates a device only while its counters are untouched.

Later features share these counters: a MIG device of a dynamically partitioned GPU consumes
part of its parent's counter (so the full GPU and every set holding it are blocked while it is
allocated), and a shared GPU's first allocation consumes the counter once. More than 32 GPUs
get further sets ``gpus-1``, ``gpus-2``, ... (32 counters per set).

A set device carries ``type: gpu-set``, ``gpuCount``, ``nvlinkLinks`` (links between its
members), ``minors`` ("0,1,4,5"), one ``uuid<k>`` per member in minor order (an attribute string
holds at most 64 characters, so the UUIDs cannot share one), the attributes all members share
(product, versions, ``nvlinkIsland``, ``numaNode``, ``pcieRoot``) and ``memory``: the smallest
member's memory, so a selector on memory means "every GPU has at least".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dra_driver.devices import gpusets, model

COUNTER_SET = "gpus"
MAX_COUNTERS = 32  # per counter set (API limit)
SET_TYPE = "gpu-set"
_SHARED = (
    "productName",
    "brand",
    "architecture",
    "cudaComputeCapability",
    "driverVersion",
    "cudaDriverVersion",
    "nvlinkIsland",
    "resource.kubernetes.io/numaNode",
    "resource.kubernetes.io/pcieRoot",
)

Obj = dict[str, Any]


def counter_name(minor: int) -> str:
    return f"gpu-{minor}"


def counter_set_of(position: int) -> str:
    """The counter set holding the ``position``-th GPU (in minor order)."""
    chunk = position // MAX_COUNTERS
    return COUNTER_SET if chunk == 0 else f"{COUNTER_SET}-{chunk}"


def shared_counters(devices: model.NodeDevices, memory: Mapping[int, str]) -> list[Obj]:
    """The pool's counter sets: a counter per GPU, its value the GPU's memory quantity."""
    out: list[Obj] = []
    for pos, gpu in enumerate(sorted(devices.gpus, key=lambda g: (g.minor, g.index))):
        name = counter_set_of(pos)
        if not out or out[-1]["name"] != name:
            out.append({"name": name, "counters": {}})
        out[-1]["counters"][counter_name(gpu.minor)] = {"value": memory[gpu.minor]}
    return out


def consumes(minors: Sequence[int], sets: Sequence[Obj]) -> list[Obj]:
    """``consumesCounters`` taking the whole counter of each GPU in ``minors``."""
    out: list[Obj] = []
    for counter_set in sets:
        mine = {
            counter_name(m): dict(counter_set["counters"][counter_name(m)])
            for m in minors
            if counter_name(m) in counter_set["counters"]
        }
        if mine:
            out.append({"counterSet": counter_set["name"], "counters": mine})
    return out


def set_device(gset: gpusets.GpuSet, singles: Mapping[str, Obj]) -> Obj:
    """The device for one set; ``singles`` maps member names to their full-GPU devices."""
    members = [singles[g.name] for g in gset.gpus]
    attrs: Obj = {
        "type": {"string": SET_TYPE},
        "gpuCount": {"int": gset.size},
        "nvlinkLinks": {"int": gset.score[0]},
        "minors": {"string": ",".join(str(m) for m in gset.minors)},
    }
    for i, gpu in enumerate(gset.gpus):
        attrs[f"uuid{i}"] = {"string": gpu.uuid}
    for key in _SHARED:
        values = [m["attributes"].get(key) for m in members]
        if values[0] is not None and all(v == values[0] for v in values):
            attrs[key] = dict(values[0])
    memories = [m["capacity"]["memory"]["value"] for m in members]
    smallest = min(zip((g.memory_bytes for g in gset.gpus), memories, strict=True))[1]
    return {
        "name": gpusets.device_name(gset.minors),
        "attributes": dict(sorted(attrs.items())),
        "capacity": {"memory": {"value": smallest}},
    }


def gpu_uuids(device: Mapping[str, Any]) -> list[str]:
    """The UUIDs of the physical GPUs a published device uses (a MIG device: its parent's).

    For passes over the built devices, e.g. tainting every device that uses a sick GPU.
    """
    attrs = device.get("attributes") or {}
    if "uuid0" in attrs:
        out: list[str] = []
        while f"uuid{len(out)}" in attrs:
            out.append(attrs[f"uuid{len(out)}"]["string"])
        return out
    for key in ("parentUUID", "uuid"):
        if key in attrs:
            return [attrs[key]["string"]]
    return []


def add(
    devices: model.NodeDevices,
    entries: list[Obj],
    *,
    memory_text: Callable[[int], str],
    budget: int = gpusets.MAX_SETS,
) -> list[Obj]:
    """Counters for ``entries`` (full GPUs consume theirs) plus the set devices after them.

    Returns the pool's counter sets (empty when nothing consumes a counter: no full GPU).
    ``entries`` must be the per-GPU and MIG devices; it is extended in place. ``memory_text``
    writes a byte count as a quantity (for GPUs without a device of their own, e.g. in MIG mode).
    """
    by_name = {e["name"]: e for e in entries}
    full = [g for g in gpusets.eligible(devices) if g.name in by_name]
    if not full:
        return []
    memory = {
        g.minor: by_name[g.name]["capacity"]["memory"]["value"]
        if g.name in by_name
        else memory_text(g.memory_bytes)
        for g in devices.gpus
    }
    sets = shared_counters(devices, memory)
    for gpu in full:
        by_name[gpu.name]["consumesCounters"] = consumes([gpu.minor], sets)
    present = {g.name for g in full}
    for gset in gpusets.choose(devices, budget=budget):
        if all(g.name in present for g in gset.gpus):
            device = set_device(gset, by_name)
            device["consumesCounters"] = consumes(gset.minors, sets)
            entries.append(device)
    return sets
