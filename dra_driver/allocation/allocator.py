"""One node's structured-parameters allocation for a ResourceClaim, as kube-scheduler does it.

Why it exists: it is what ``dra-driver simulate`` and the demo run to answer "would the
scheduler place this claim on this node, and on which devices?". :func:`allocate` replays the
scheduler's own search (:mod:`.firstfit`): same pools, selectors, counters, taints,
constraints, in-use devices, ``firstAvailable`` order and errors, so its answer is the
allocation kube-scheduler would write. :func:`optimum` answers the other question, "what is the
best this claim could get here?": the best NVLink/NUMA/PCIe placement among every allocation
that satisfies the claim. The result has the shape of a claim's ``status.allocation``; a claim
that cannot be allocated comes back with an explanation. A share of a multi-allocatable device
comes back with its ``shareID`` and ``consumedCapacity``, as the scheduler writes them.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dra_driver import records
from dra_driver.allocation import (
    capacity,
    claim,
    counters,
    explain,
    firstfit,
    physical,
    placement,
    pools,
    schedwork,
    selection,
    solver,
)
from dra_driver.devices import model


@records.record
class Outcome:
    """What allocating one claim on one node gave."""

    claim_name: str
    allocation: Mapping[str, Any] | None  # status.allocation; None when not allocatable
    score: placement.Score | None = None  # of the allocated GPUs: (links, NUMA, root pairs)
    explanation: tuple[str, ...] = ()  # why not, when allocation is None
    notes: tuple[str, ...] = ()  # remarks about an allocation (e.g. search cut short)
    scheduler_error: str | None = None  # the scheduler would stop with this error
    gpus: tuple[str, ...] = ()  # UUIDs of the physical GPUs allocated, first use first
    steps: int = 0  # scheduler search steps taken

    @property
    def allocated(self) -> bool:
        return self.allocation is not None


@dataclasses.dataclass(slots=True)
class Context:
    """One claim on one node, parsed and matched against the node's devices once."""

    parsed: claim.Claim
    sel: selection.Selection
    pool_list: list[pools.Pool]
    bad_pools: list[pools.Pool]
    ledger: counters.Ledger
    gpus: physical.Gpus
    error: str | None  # a request names a class that does not exist
    share_rng: random.Random | None = None  # shareIDs from this generator (reproducible)


def prepare(
    claim_obj: Mapping[str, Any],
    *,
    slices: Sequence[Mapping[str, Any]],
    classes: Iterable[Mapping[str, Any]],
    node_name: str,
    allocated: Iterable[pools.DeviceId] = (),
    node_devices: model.NodeDevices | None = None,
    node_labels: Mapping[str, str] | None = None,
    consumed: capacity.Ledger | None = None,
    share_rng: random.Random | None = None,
) -> Context:
    """Parse ``claim_obj`` (a v1 ResourceClaim or template) against ``node_name``'s devices.

    ``node_devices`` (when known) gives exact NVLink link counts for scoring; otherwise the
    ``nvlinkIsland``, NUMA node and PCIe root attributes of the devices are used.
    ``consumed``: what allocated shares take of multi-allocatable devices (those devices'
    counters count as used, once); ``share_rng`` makes shareIDs reproducible. Raises
    :class:`claim.ClaimError` for a malformed claim or class or a selector that does not
    compile, and :class:`pools.SliceError` for a malformed slice.
    """
    parsed = claim.parse_claim(claim_obj)
    class_map = {c.name: c for c in (claim.parse_class(obj) for obj in classes)}
    pool_list = pools.gather(slices, node_name=node_name, node_labels=node_labels)
    bad_pools = [p for p in pool_list if p.incomplete or p.invalid]
    devices = [d for p in pool_list if not (p.incomplete or p.invalid) for d in p.devices]
    used = set(allocated)
    shares = consumed if consumed is not None else capacity.Ledger()
    ledger = firstfit.ledger_for(pool_list, used | shares.devices())
    blocked = [
        pos
        for pos, d in enumerate(devices)
        if d.consumes
        and not (capacity.multi_allocatable(d) and shares.has(d.id))  # shares skip counters
        and not ledger.fits((d.driver, d.pool), d.consumes)
    ]
    sel = selection.Selection(
        devices=devices, classes=class_map, in_use=used, blocked=blocked, consumed=shares
    )
    error = None
    try:
        sel.compile_all(parsed)
    except selection.UnknownClassError as err:
        error = str(err)
    gpus = physical.Gpus(devices, node_devices=node_devices)
    return Context(parsed, sel, pool_list, bad_pools, ledger, gpus, error, share_rng)


def allocate(claim_obj: Mapping[str, Any], **kwargs: Any) -> Outcome:
    """What kube-scheduler allocates for ``claim_obj`` on the node (see :func:`prepare`)."""
    return schedule(prepare(claim_obj, **kwargs))


def schedule(
    ctx: Context, *, budget: int = firstfit.DEFAULT_BUDGET, work: schedwork.Work | None = None
) -> Outcome:
    """The scheduler's allocation (its first fit), or why it allocates nothing.

    ``work`` counts the scheduler's search (:mod:`.schedwork`), not our explanations.
    """
    name = ctx.parsed.name
    if ctx.error is not None:
        return Outcome(name, None, explanation=(ctx.error,), scheduler_error=ctx.error)
    verdict = firstfit.emulate(
        ctx.parsed, ctx.sel, bad_pools=ctx.bad_pools, ledger=ctx.ledger, budget=budget, work=work
    )
    if verdict.status == "error":
        lines = (
            f"the scheduler stops with an error: {verdict.message}",
            *explain.explain(ctx.parsed, ctx.sel, ctx.pool_list),
        )
        return Outcome(
            name, None, explanation=lines, scheduler_error=verdict.message, steps=verdict.steps
        )
    if verdict.status == "unsatisfiable":
        lines = explain.explain(ctx.parsed, ctx.sel, ctx.pool_list)
        return Outcome(name, None, explanation=lines, steps=verdict.steps)
    if verdict.status == "undecided":
        best = optimum(ctx)
        note = (
            f"the scheduler's search did not finish in {budget} steps (it gives up after "
            "10 s on a node); shown is the best allocation, if the scheduler finds one it "
            "may differ"
        )
        return dataclasses.replace(best, notes=(note, *best.notes), steps=verdict.steps)
    picks = _group(ctx.parsed, verdict.picks)
    return _outcome(ctx, picks, notes=(), steps=verdict.steps)


def optimum(ctx: Context) -> Outcome:
    """The best placement among all allocations satisfying the claim (not the scheduler's)."""
    name = ctx.parsed.name
    if ctx.error is not None:
        return Outcome(name, None, explanation=(ctx.error,), scheduler_error=ctx.error)
    sel = ctx.sel
    overlapping = any(len(ctx.gpus.of(p)) > 1 for p in range(len(sel.devices)))
    plan = solver.Solver(
        ctx.parsed,
        sel,
        weights=ctx.gpus.weights(),
        pools_ok=not ctx.bad_pools,
        conflict=ctx.gpus.overlap if overlapping else None,
    ).solve()
    if plan is None:
        return Outcome(name, None, explanation=explain.explain(ctx.parsed, sel, ctx.pool_list))
    notes = () if plan.optimal else ("placement search stopped at its node limit",)
    picks = [(req, list(positions)) for req, positions in plan.picks]
    return _outcome(ctx, picks, notes=notes, steps=0)


def best_gpus(ctx: Context, count: int) -> tuple[tuple[str, ...], placement.Score] | None:
    """The best ``count`` free whole GPUs of the node, whatever the claim asks for.

    "Optimal" as the issue defines it: most NVLink links among them, then pairs on one NUMA
    node, then pairs under one PCIe root, over every equally large set of free GPUs (devices
    that are one whole GPU, not allocated, not shared, their counter untouched, untainted).
    """
    sel = ctx.sel
    whole = [
        pos
        for pos, dev in enumerate(sel.devices)
        if len(ctx.gpus.of(pos)) == 1
        and physical.kind(dev) == "gpu"
        and not sel.in_use[pos]
        and not sel.consumed.has(dev.id)
        and pos not in sel.blocked
        and not any(
            t.get("effect") in ("NoSchedule", "NoExecute") for t in dev.data.get("taints") or ()
        )
    ]
    uuids = list(dict.fromkeys(ctx.gpus.of(p)[0] for p in whole))
    if len(uuids) < count:
        return None
    rows = [[ctx.gpus.pair(a, b) if a != b else (0, 0, 0) for b in uuids] for a in uuids]
    found = placement.best_subset(placement.Weights(rows), range(len(uuids)), count)
    if found is None:
        return None
    return tuple(uuids[i] for i in found.items), found.score


def _group(
    parsed: claim.Claim, picks: Sequence[firstfit.Pick]
) -> list[tuple[claim.Request, list[int]]]:
    """The scheduler's results as (request, positions) in result order."""
    alternatives = {a.name: a for g in parsed.groups for a in g.alternatives}
    out: list[tuple[claim.Request, list[int]]] = []
    for req_name, pos in picks:
        if out and out[-1][0].name == req_name:
            out[-1][1].append(pos)
        else:
            out.append((alternatives[req_name], [pos]))
    return out


def _outcome(
    ctx: Context,
    picks: Sequence[tuple[claim.Request, Sequence[int]]],
    *,
    notes: tuple[str, ...],
    steps: int,
) -> Outcome:
    positions = [p for _, ps in picks for p in ps]
    uuids = ctx.gpus.of_positions(positions)
    return Outcome(
        ctx.parsed.name,
        allocation_result(ctx.parsed, picks, ctx.sel, share_rng=ctx.share_rng),
        score=ctx.gpus.score(uuids),
        notes=notes,
        gpus=tuple(dict.fromkeys(uuids)),
        steps=steps,
    )


def allocation_result(
    parsed: claim.Claim,
    picks: Sequence[tuple[claim.Request, Sequence[int]]],
    sel: selection.Selection,
    *,
    share_rng: random.Random | None = None,
) -> dict[str, Any]:
    """``status.allocation`` as the scheduler writes it (results, config, nodeSelector); a
    share of a multi-allocatable device gets its ``shareID`` and ``consumedCapacity``."""
    results: list[dict[str, Any]] = []
    chosen: list[pools.Device] = []
    for req, positions in picks:
        for pos in positions:
            dev = sel.devices[pos]
            chosen.append(dev)
            entry: dict[str, Any] = {
                "request": req.name,
                "driver": dev.driver,
                "pool": dev.pool,
                "device": dev.name,
            }
            if req.admin_access:
                entry["adminAccess"] = True
            if req.tolerations:
                entry["tolerations"] = [dict(t) for t in req.tolerations]
            if sel.multi[pos]:
                entry["shareID"] = capacity.share_id(share_rng)
                consumed = capacity.consumption(dev, req.capacity)
                if consumed:
                    entry["consumedCapacity"] = capacity.as_status(consumed, dev)
            results.append(entry)
    devices: dict[str, Any] = {"results": results}
    config = _configs(parsed, picks, sel)
    if config:
        devices["config"] = config
    out: dict[str, Any] = {"devices": devices}
    node_selector = _node_selector(chosen)
    if node_selector is not None:
        out["nodeSelector"] = node_selector
    return out


def _configs(
    parsed: claim.Claim,
    picks: Sequence[tuple[claim.Request, Sequence[int]]],
    sel: selection.Selection,
) -> list[dict[str, Any]]:
    """Class configs first (once per class, listing its requests), then the claim's own."""
    out: list[dict[str, Any]] = []
    by_class: dict[str, tuple[int, int]] = {}
    for req, _ in picks:
        cls = sel.class_of(req)
        if cls.name in by_class:
            start, end = by_class[cls.name]
            for entry in out[start:end]:
                entry["requests"].append(req.name)
            continue
        start = len(out)
        for cfg in cls.config:
            out.append({"source": "FromClass", "requests": [req.name], **_config_body(cfg)})
        by_class[cls.name] = (start, len(out))
    for cfg in parsed.config:
        listed = [str(r) for r in cfg.get("requests") or ()]
        body = {"source": "FromClaim", **_config_body(cfg)}
        if not listed:
            out.append(body)
            continue
        # As the scheduler does: one entry per request the config names (a config naming two
        # requests appears twice), matching a request by its name or its chosen subrequest.
        for req, _ in picks:
            if req.main in listed or (req.sub is not None and req.name in listed):
                out.append({**body, "requests": list(listed)})
    return out


def _config_body(cfg: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in cfg.items() if k not in ("requests", "source")}


def _node_selector(chosen: Sequence[pools.Device]) -> dict[str, Any] | None:
    fields: list[Any] = []
    exprs: list[Any] = []
    for dev in chosen:
        if dev.node_name:
            return {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": [dev.node_name]},
                        ]
                    }
                ]
            }
        terms = (dev.node_selector or {}).get("nodeSelectorTerms") or []
        if len(terms) == 1:
            for req in terms[0].get("matchFields") or ():
                if req not in fields:
                    fields.append(req)
            for req in terms[0].get("matchExpressions") or ():
                if req not in exprs:
                    exprs.append(req)
    term: dict[str, Any] = {}
    if fields:
        term["matchFields"] = fields
    if exprs:
        term["matchExpressions"] = exprs
    return {"nodeSelectorTerms": [term]} if term else None
