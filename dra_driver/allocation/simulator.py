"""Inputs of the claim simulator: YAML documents, built-in DeviceClasses, slices, examples.

Why it exists: ``dra-driver simulate`` and ``dra-driver demo`` both need to turn files a user
already has (a claim with its Pod, DeviceClasses, exported ResourceSlices, claims that are
already allocated) or a fake GPU profile into the allocator's inputs, and both run the example
claims shipped with the package. Every problem is reported as a :class:`SimulateError` naming
the file and document at fault.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import yaml

from dra_driver import deviceclasses, records
from dra_driver.allocation import allocator, capacity, claim, claimgen, physical, pools
from dra_driver.allocation.documents import CLAIM_KINDS as CLAIM_KINDS
from dra_driver.allocation.documents import IGNORED_KINDS as IGNORED_KINDS
from dra_driver.allocation.documents import SimulateError as SimulateError
from dra_driver.allocation.documents import load_file as load_file
from dra_driver.allocation.documents import parse_documents as parse_documents
from dra_driver.allocation.documents import split_kinds as split_kinds
from dra_driver.devices import gpusets, migprofiles, model
from dra_driver.slices import build as slices_build
from dra_driver.slices import shares


@records.record
class Inputs:
    """Everything one simulation needs."""

    claims: list[dict[str, Any]]
    classes: list[dict[str, Any]]
    slices: list[dict[str, Any]]
    node_name: str
    allocated: set[pools.DeviceId]
    node_devices: model.NodeDevices | None = None
    consumed: capacity.Ledger = dataclasses.field(default_factory=capacity.Ledger)


def builtin_classes(*, driver_name: str = slices_build.DEFAULT_DRIVER_NAME) -> list[dict[str, Any]]:
    """The DeviceClasses the driver ships, selecting ``driver_name``'s devices."""
    return deviceclasses.load_all(driver_name=driver_name)


def merge_classes(*groups: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Later groups override earlier ones by name (user classes over built-in ones)."""
    by_name: dict[str, dict[str, Any]] = {}
    for group in groups:
        for obj in group:
            name = (obj.get("metadata") or {}).get("name")
            if not isinstance(name, str) or not name:
                raise SimulateError("a DeviceClass has no metadata.name")
            by_name[name] = obj
    return list(by_name.values())


def fake_slices(
    devices: model.NodeDevices,
    *,
    node_name: str,
    driver_name: str,
    dynamic_mig: migprofiles.DynamicMig = migprofiles.STATIC,
    shareable: shares.Shareable = shares.NONE,
    allocated: Iterable[pools.DeviceId] = (),
) -> list[dict[str, Any]]:
    """The ResourceSlices the driver would publish for these devices once it has prepared the
    ``allocated`` devices of its pool (the set ranks are of the GPUs left free)."""
    try:
        built = slices_build.build(
            devices,
            node_name=node_name,
            driver_name=driver_name,
            dynamic_mig=dynamic_mig,
            shareable=shareable,
            taken=held_gpus(devices, allocated, node_name=node_name, driver_name=driver_name),
        )
    except slices_build.BuildError as err:
        raise SimulateError(str(err)) from err
    return built.slices


def held_gpus(
    devices: model.NodeDevices,
    allocated: Iterable[pools.DeviceId],
    *,
    node_name: str,
    driver_name: str,
) -> set[str]:
    """Names of the full GPUs that allocated devices of this node's pool use: a GPU itself, a
    GPU set of earlier versions (``gpus-0-1``: its members), a MIG device or share of a GPU."""
    by_minor = {g.minor: g.name for g in devices.gpus}
    names = set(by_minor.values())
    held: set[str] = set()
    for driver, pool, device in allocated:
        if driver != driver_name or pool != node_name:
            continue
        minors = gpusets.parse_name(device)
        if minors is not None:
            held |= {by_minor[m] for m in minors if m in by_minor}
        elif device in names:
            held.add(device)
        else:
            held |= {n for n in names if device.startswith(f"{n}-")}
    return held


def slice_node(slices: Sequence[Mapping[str, Any]]) -> str | None:
    """The one node all given slices are local to, if there is exactly one."""
    names = {
        str((s.get("spec") or {}).get("nodeName"))
        for s in slices
        if isinstance(s.get("spec"), Mapping) and (s.get("spec") or {}).get("nodeName")
    }
    return names.pop() if len(names) == 1 else None


def allocated_from(docs: Iterable[Any], *, source: str) -> set[pools.DeviceId]:
    """Devices in use according to ResourceClaims (with status) or bare results."""
    try:
        return pools.allocated_ids(docs)
    except pools.SliceError as err:
        raise SimulateError(f"{source}: {err}") from err


def consumed_from(docs: Iterable[Any], *, source: str) -> capacity.Ledger:
    """What shares in ResourceClaims (with status) or bare results consume of shared devices."""
    try:
        return capacity.Ledger.from_allocated(docs)
    except capacity.CapacityError as err:
        raise SimulateError(f"{source}: {err}") from err


@records.record
class Insight:
    """What ``--explain`` adds to an allocation: the optimum and, if better, another claim."""

    optimum: tuple[str, ...]  # GPU UUIDs of the optimum ()= unknown)
    score: tuple[int, int, int] | None
    better_claim: dict[str, Any] | None = None  # what `dra-driver claim` writes instead
    better: allocator.Outcome | None = None  # what that claim gets on this node


Progress = Callable[[int, int], None]  # (claims done, claims in all)


def run(
    inputs: Inputs, *, share_rng: random.Random | None = None, progress: Progress | None = None
) -> list[allocator.Outcome]:
    """Allocate the claims one after another; each sees the devices (and the capacity of
    shared devices) the previous ones took."""
    return [
        o for o, _ in _counted(_each(inputs, explain=False, share_rng=share_rng), inputs, progress)
    ]


def run_explained(
    inputs: Inputs, *, share_rng: random.Random | None = None, progress: Progress | None = None
) -> list[tuple[allocator.Outcome, Insight | None]]:
    """:func:`run`, with the optimum (and a better claim) for every allocated claim."""
    return list(_counted(_each(inputs, explain=True, share_rng=share_rng), inputs, progress))


def _counted(
    results: Iterable[tuple[allocator.Outcome, Insight | None]],
    inputs: Inputs,
    progress: Progress | None,
) -> Iterable[tuple[allocator.Outcome, Insight | None]]:
    for done, result in enumerate(results, 1):
        if progress is not None:
            progress(done, len(inputs.claims))
        yield result


def _each(
    inputs: Inputs, *, explain: bool, share_rng: random.Random | None
) -> Iterable[tuple[allocator.Outcome, Insight | None]]:
    used = set(inputs.allocated)
    consumed = inputs.consumed.copy()
    for obj in inputs.claims:
        where: dict[str, Any] = {
            "slices": inputs.slices,
            "classes": inputs.classes,
            "node_name": inputs.node_name,
            "node_devices": inputs.node_devices,
            "consumed": consumed,
            "share_rng": share_rng,
        }
        try:
            ctx = allocator.prepare(obj, allocated=used, **where)
            outcome = allocator.schedule(ctx)
            insight = _insight(ctx, outcome, used, where) if explain else None
        except (claim.ClaimError, pools.SliceError, capacity.CapacityError) as err:
            raise SimulateError(str(err)) from err
        yield outcome, insight
        if outcome.allocation is not None:
            used |= pools.allocated_ids([outcome.allocation["devices"]])
            taken = capacity.Ledger.from_allocated([outcome.allocation["devices"]])
            for device, amounts in taken.used.items():
                consumed.add(device, amounts)


def _insight(
    ctx: allocator.Context,
    outcome: allocator.Outcome,
    used: set[pools.DeviceId],
    where: Mapping[str, Any],
) -> Insight | None:
    """The optimum: the best equally many free whole GPUs when the pick is whole GPUs (the
    issue's "optimal"), else the best placement the claim itself allows."""
    if outcome.allocation is None or outcome.score is None:
        return None
    positions = _positions(ctx, outcome)
    if all(physical.kind(ctx.sel.devices[p]) in ("gpu", "gpu-set") for p in positions):
        found = allocator.best_gpus(ctx, len(outcome.gpus))
        optimum, score = found if found is not None else ((), None)
    else:
        best = allocator.optimum(ctx)
        optimum, score = best.gpus, best.score
    if score is None or outcome.score >= score:
        return Insight(optimum, score)
    better_claim = claimgen.claim(len(outcome.gpus), name=f"{ctx.parsed.name}-best")
    better = allocator.allocate(better_claim, allocated=used, **where)
    return Insight(optimum, score, better_claim, better)


def _positions(ctx: allocator.Context, outcome: allocator.Outcome) -> list[int]:
    if outcome.allocation is None:
        raise ValueError("the outcome has no allocation")
    index = {d.id: p for p, d in enumerate(ctx.sel.devices)}
    return [
        index[(r["driver"], r["pool"], r["device"])]
        for r in outcome.allocation["devices"]["results"]
    ]


def gpu_names(inputs: Inputs) -> dict[str, str]:
    """GPU UUID -> name of the device that is that GPU, for messages."""
    names: dict[str, str] = {}
    for sl in inputs.slices:
        for dev in (sl.get("spec") or {}).get("devices") or ():
            uuid = ((dev.get("attributes") or {}).get("uuid") or {}).get("string")
            if isinstance(uuid, str) and (dev.get("attributes") or {}).get("type") == {
                "string": "gpu"
            }:
                names.setdefault(uuid, str(dev.get("name")))
    return names


def render(
    outcome: allocator.Outcome,
    *,
    node_name: str,
    insight: Insight | None = None,
    names: Mapping[str, str] | None = None,
) -> str:
    """YAML for an allocation (with comment lines), or the explanation."""
    if outcome.allocation is None:
        lines = [f"ResourceClaim {outcome.claim_name} cannot be allocated on node {node_name}:"]
        lines += [
            f"  {line}" if line.startswith("  ") else f"  - {line}" for line in outcome.explanation
        ]
        return "\n".join(lines) + "\n"
    head = f"# ResourceClaim {outcome.claim_name}: allocated on node {node_name}"
    if outcome.score is not None and len(outcome.gpus) > 1:
        head += f"; placement: {_placement(outcome.score)}"
    notes = "".join(f"# note: {n}\n" for n in outcome.notes)
    body = yaml.safe_dump(dict(outcome.allocation), sort_keys=False)
    tail = _explained(outcome, insight, names or {}) if insight is not None else ""
    return f"{head}\n{notes}{body}{tail}"


def _placement(score: tuple[int, int, int]) -> str:
    links, numa, root = score
    return (
        f"{links} NVLink links between the devices, "
        f"{_pairs(numa)} on one NUMA node, {_pairs(root)} under one PCIe root"
    )


def _explained(outcome: allocator.Outcome, insight: Insight, names: Mapping[str, str]) -> str:
    """``--explain``: the scheduler's pick against the optimum, and a better claim."""

    def gpus(uuids: Sequence[str]) -> str:
        return ", ".join(names.get(u, u) for u in uuids) or "no GPU"

    lines = [f"scheduler's pick: {gpus(outcome.gpus)}"]
    if outcome.score is not None:
        lines[-1] += f" ({_placement(outcome.score)})"
    if insight.score is None or outcome.score is None:
        lines.append("optimum: unknown (no better placement found)")
    else:
        lines.append(f"optimum: {gpus(insight.optimum)} ({_placement(insight.score)})")
        if outcome.score >= insight.score:
            lines.append("gap: none, the scheduler's pick is optimal")
        else:
            gap = [b - a for a, b in zip(outcome.score, insight.score, strict=True)]
            lines.append(
                f"gap: {gap[0]} NVLink links, {gap[1]} same-NUMA pairs, "
                f"{gap[2]} same-PCIe-root pairs"
            )
    text = "".join(f"# explain: {line}\n" for line in lines)
    if insight.better_claim is None:
        return text
    got = insight.better
    if got is None or got.allocation is None or got.score is None:
        result = "on this node it would not be allocated"
    elif outcome.score is not None and got.score <= outcome.score:
        result = (
            f"on this node it gets {gpus(got.gpus)} too: the set ranks in these slices are not "
            "those of the GPUs free here (the agent re-ranks once it has prepared the claims "
            "holding them; see docs/topology.md)"
        )
    else:
        result = f"on this node it gets {gpus(got.gpus)} ({_placement(got.score)})"
    text += (
        f"# explain: not topology-optimal; `dra-driver claim --gpus {len(outcome.gpus)}` "
        f"writes this claim instead ({result}):\n"
    )
    text += "".join(
        f"#   {line}\n"
        for line in yaml.safe_dump(insight.better_claim, sort_keys=False).splitlines()
    )
    return text


def _pairs(n: int) -> str:
    return "1 pair" if n == 1 else f"{n} pairs"
