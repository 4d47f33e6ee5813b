"""Dynamic MIG in ResourceSlices: a counter set per GPU, a device per profile placement.

Why it exists: with partitionable devices (KEP-4815, beta in 1.36) the scheduler itself picks
where a MIG instance goes, so the slices must make every placement the hardware forbids
impossible, and nothing else. Per dynamic GPU ``gpu-<minor>`` the pool gets a counter set
``gpu-<minor>-mig`` holding:

* ``memory-slice-<i>`` = 1 for each memory slice: a placement consumes the slices it covers, so
  no two allocated instances can overlap (what NVML refuses with InsufficientResources);
* ``compute-slices``: the GPU's compute slices (7 on A100/H100), each profile consuming its own;
* ``multiprocessors``, ``copy-engines``, ``decoders``, ``encoders``, ``jpeg-engines``,
  ``ofa-engines``, ``memory``: the whole-GPU profile's totals, each profile consuming its own
  (e.g. only one ``+me`` profile fits beside others: the GPU has one OFA engine);
* ``<profile>-instances`` where NVML allows fewer instances of a profile than its placements
  could hold side by side (``1g.10gb+me``: 1 of 7).

Devices: the full GPU consumes *everything* of its set (so it excludes every MIG device of the
GPU and the reverse), each placement ``gpu-<minor>-mig-<profile>-<start>`` what its profile and
place take, with the attributes and capacities of a static MIG device (``type: mig``,
``profile``, ``parentUUID``; no ``uuid`` yet: the instance exists only once prepared). An
allocated MIG device leaves its full GPU without its counters, so that GPU is neither allocatable
nor free for the set ranks (:mod:`dra_driver.slices.gpusets`) once the agent prepared the MIG
claim.

Limits (docs/api-limits.md, Kubernetes 1.36): ≤32 counters per set and per consumption, ≤2
consumptions per device, ≤8 counter sets per slice, counter sets and devices never in one slice,
≤64 devices in a slice holding a device that consumes counters. :func:`check_references` is the
pool-level rule the API server leaves to the allocator: every consumed set and counter exists
and no device consumes more of a counter than the set has.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from dra_driver.devices import migprofiles, model

Obj = dict[str, Any]
COMPUTE_SLICES = "compute-slices"
ENGINE_COUNTERS = (
    ("multiprocessors", "multiprocessors"),
    ("copy-engines", "copy_engines"),
    ("decoders", "decoders"),
    ("encoders", "encoders"),
    ("jpeg-engines", "jpeg_engines"),
    ("ofa-engines", "ofa_engines"),
)
MEMORY = "memory"


def counter_set_name(gpu: model.Gpu) -> str:
    return f"gpu-{gpu.minor}-mig"


def memory_slice(index: int) -> str:
    return f"memory-slice-{index}"


def instances_counter(profile: model.MigProfile) -> str:
    label = profile.name.lower().replace(".", "-").replace("+", "-")
    return f"{label}-instances"


def _side_by_side(profile: model.MigProfile) -> int:
    """How many of the profile's placements fit without sharing a memory slice."""
    count, free_from = 0, -1
    for start, size in sorted(profile.placements, key=lambda p: p[0] + p[1]):
        if start >= free_from:
            count, free_from = count + 1, start + size
    return count


def _limited(gpu: model.Gpu) -> list[model.MigProfile]:
    return [p for p in gpu.mig_profiles if p.placements and p.instances < _side_by_side(p)]


def totals(gpu: model.Gpu) -> dict[str, int]:
    """The counters of a dynamic GPU's set, as plain integers (bytes for ``memory``)."""
    whole = migprofiles.whole(gpu)
    out = {memory_slice(i): 1 for i in range(migprofiles.memory_slices(gpu))}
    out[COMPUTE_SLICES] = migprofiles.compute_slices(gpu)
    if whole is not None:
        for counter, field in ENGINE_COUNTERS:
            out[counter] = int(getattr(whole, field))
        out[MEMORY] = whole.memory_bytes
    for profile in _limited(gpu):
        out[instances_counter(profile)] = profile.instances
    return {k: v for k, v in out.items() if v}  # e.g. no encoders on an H100


def consumption(place: migprofiles.Placement) -> dict[str, int]:
    """What one placement takes from its GPU's set (zero amounts left out)."""
    profile = place.profile
    out = {memory_slice(i): 1 for i in place.memory_slices}
    out[COMPUTE_SLICES] = profile.slices
    for counter, field in ENGINE_COUNTERS:
        out[counter] = int(getattr(profile, field))
    out[MEMORY] = profile.memory_bytes
    if profile in _limited(place.gpu):
        out[instances_counter(profile)] = 1
    return {k: v for k, v in out.items() if v}


def counter_set(gpu: model.Gpu, quantity: Any) -> Obj:
    """The ``sharedCounters`` entry of a dynamic GPU; ``quantity(name, int)`` formats values."""
    return {
        "name": counter_set_name(gpu),
        "counters": {k: {"value": quantity(k, v)} for k, v in sorted(totals(gpu).items())},
    }


def consumes(gpu: model.Gpu, amounts: Mapping[str, int], quantity: Any) -> list[Obj]:
    return [
        {
            "counterSet": counter_set_name(gpu),
            "counters": {k: {"value": quantity(k, v)} for k, v in sorted(amounts.items())},
        }
    ]


def full_gpu_consumes(gpu: model.Gpu, quantity: Any) -> list[Obj]:
    """The full GPU takes all of its set: no MIG device of it fits beside it, nor it beside one."""
    return consumes(gpu, totals(gpu), quantity)


def as_whole(devices: model.NodeDevices, dynamic: migprofiles.DynamicMig) -> model.NodeDevices:
    """The node as the set ranks see it: a dynamic GPU is a full GPU (its
    full device is published whatever its MIG mode; its MIG devices are placements)."""
    gpus = tuple(
        dataclasses.replace(g, mig_enabled=False, mig_devices=()) if dynamic.selects(g) else g
        for g in devices.gpus
    )
    return dataclasses.replace(devices, gpus=gpus)


def attach(
    devices: model.NodeDevices,
    dynamic: migprofiles.DynamicMig,
    entries: Sequence[Obj],
    *,
    quantity: Any,
) -> list[Obj]:
    """Wire the dynamic GPUs into the pool; returns their counter sets, to publish.

    Each full dynamic GPU consumes all of its MIG set, so it and the MIG devices of it block
    each other. ``entries`` are changed in place."""
    by_name = {e["name"]: e for e in entries}
    out: list[Obj] = []
    for gpu in sorted(dynamic.dynamic_gpus(devices.gpus), key=lambda g: (g.minor, g.index)):
        out.append(counter_set(gpu, quantity))
        full = by_name.get(gpu.name)
        if full is not None:
            full["consumesCounters"] = [
                *full.get("consumesCounters", []),
                *full_gpu_consumes(gpu, quantity),
            ]
    return out


def placement_device(place: migprofiles.Placement, attrs: Obj, quantity: Any) -> Obj:
    """A dynamic MIG device; ``attrs`` are the parent GPU's shared attributes."""
    profile = place.profile
    attributes = dict(attrs)
    attributes.update(
        {
            "type": {"string": "mig"},
            "parentUUID": {"string": place.gpu.uuid},
            "profile": {"string": profile.name},
        }
    )
    capacity = {
        "memory": quantity("memory", profile.memory_bytes),
        "multiprocessors": quantity("", profile.multiprocessors),
        "copyEngines": quantity("", profile.copy_engines),
        "decoders": quantity("", profile.decoders),
        "encoders": quantity("", profile.encoders),
        "jpegEngines": quantity("", profile.jpeg_engines),
        "ofaEngines": quantity("", profile.ofa_engines),
    }
    return {
        "name": place.name,
        "attributes": dict(sorted(attributes.items())),
        "capacity": {k: {"value": v} for k, v in sorted(capacity.items())},
        "consumesCounters": consumes(place.gpu, consumption(place), quantity),
    }


def check_references(slices: Sequence[Mapping[str, Any]], parse: Any) -> list[str]:
    """Pool-level counter rules: consumed sets and counters exist, no consumption exceeds its
    counter. ``parse`` turns a Quantity string into a number."""
    sets: dict[str, dict[str, Any]] = {}
    for sl in slices:
        for cs in (sl.get("spec") or {}).get("sharedCounters") or ():
            if cs["name"] in sets:
                return [f"counter set {cs['name']} is defined twice in the pool"]
            sets[cs["name"]] = {k: parse(v["value"]) for k, v in cs["counters"].items()}
    problems: list[str] = []
    for sl in slices:
        for dev in (sl.get("spec") or {}).get("devices") or ():
            for use in dev.get("consumesCounters") or ():
                have = sets.get(use["counterSet"])
                if have is None:
                    problems.append(f"device {dev['name']}: no counter set {use['counterSet']}")
                    continue
                for name, amount in use["counters"].items():
                    if name not in have:
                        problems.append(
                            f"device {dev['name']}: counter set {use['counterSet']} has no {name}"
                        )
                    elif parse(amount["value"]) > have[name]:
                        problems.append(
                            f"device {dev['name']}: consumes more {name} than "
                            f"{use['counterSet']} has"
                        )
    return problems
