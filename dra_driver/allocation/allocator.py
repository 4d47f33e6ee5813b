"""One node's structured-parameters allocation for a ResourceClaim, topology-aware.

Why it exists: it is what ``dra-driver simulate`` and the demo run to answer "would the
scheduler place this claim on this node, and on which GPUs?". The yes/no answer is the
scheduler's (same pools, selectors, constraints, in-use devices, ``firstAvailable`` order and
error aborts); where the scheduler would take the first devices that fit, we take the best
NVLink/NUMA/PCIe placement among all that fit. The result has the shape of a claim's
``status.allocation``; a claim that cannot be allocated comes back with an explanation.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dra_driver.allocation import (
    capacity,
    claim,
    explain,
    firstfit,
    placement,
    pools,
    selection,
    solver,
)
from dra_driver.devices import model, topology

NUMA_ATTRIBUTE = "resource.kubernetes.io/numaNode"
PCIE_ROOT_ATTRIBUTE = "resource.kubernetes.io/pcieRoot"


@dataclasses.dataclass(frozen=True, slots=True)
class Outcome:
    """What allocating one claim on one node gave."""

    claim_name: str
    allocation: Mapping[str, Any] | None  # status.allocation; None when not allocatable
    score: placement.Score | None = None  # (links, same-NUMA pairs, same-root pairs)
    explanation: tuple[str, ...] = ()  # why not, when allocation is None
    notes: tuple[str, ...] = ()  # remarks about an allocation (e.g. search cut short)
    scheduler_error: str | None = None  # the scheduler would stop with this error

    @property
    def allocated(self) -> bool:
        return self.allocation is not None


def allocate(
    claim_obj: Mapping[str, Any],
    *,
    slices: Sequence[Mapping[str, Any]],
    classes: Iterable[Mapping[str, Any]],
    node_name: str,
    allocated: Iterable[pools.DeviceId] = (),
    node_devices: model.NodeDevices | None = None,
    node_labels: Mapping[str, str] | None = None,
    ledger: capacity.Ledger | None = None,
    share_rng: random.Random | None = None,
) -> Outcome:
    """Allocate ``claim_obj`` (a v1 ResourceClaim or ResourceClaimTemplate) on ``node_name``.

    ``node_devices`` (when known) gives exact NVLink link counts for scoring; otherwise the
    ``nvlinkIsland``, NUMA node and PCIe root attributes of the devices are used. ``ledger``:
    what earlier claims consume of shared devices; ``share_rng`` makes shareIDs reproducible.
    Raises
    :class:`claim.ClaimError` for a malformed claim or class or a selector that does not
    compile, and :class:`pools.SliceError` for a malformed slice.
    """
    parsed = claim.parse_claim(claim_obj)
    class_map = {c.name: c for c in (claim.parse_class(obj) for obj in classes)}
    pool_list = pools.gather(slices, node_name=node_name, node_labels=node_labels)
    bad_pools = [p for p in pool_list if p.incomplete or p.invalid]
    devices = [d for p in pool_list if not (p.incomplete or p.invalid) for d in p.devices]
    sel = selection.Selection(
        devices=devices, classes=class_map, in_use=set(allocated), ledger=ledger
    )
    try:
        sel.compile_all(parsed)
    except selection.UnknownClassError as err:
        return Outcome(parsed.name, None, explanation=(str(err),), scheduler_error=str(err))

    notes: list[str] = []
    if _errors_possible(parsed, sel, bad_pools):
        verdict = firstfit.emulate(parsed, sel, bad_pools=bad_pools)
        if verdict.status == "error":
            lines = (
                f"the scheduler stops with an error: {verdict.message}",
                *explain.explain(parsed, sel, pool_list),
            )
            return Outcome(parsed.name, None, explanation=lines, scheduler_error=verdict.message)
        if verdict.status == "unsatisfiable":
            return Outcome(parsed.name, None, explanation=explain.explain(parsed, sel, pool_list))
        if verdict.status == "undecided":
            notes.append(
                "selectors fail to evaluate on some devices; the scheduler may stop "
                f"with an error before it finds this allocation ({verdict.message})"
            )

    weights = weights_for(devices, node_devices=node_devices)
    plan = solver.Solver(parsed, sel, weights=weights, pools_ok=not bad_pools).solve()
    if plan is None:
        return Outcome(parsed.name, None, explanation=explain.explain(parsed, sel, pool_list))
    if not plan.optimal:
        notes.append("placement search stopped at its node limit; the choice may not be optimal")
    return Outcome(
        parsed.name,
        allocation_result(parsed, plan, sel, share_rng=share_rng),
        score=plan.score,
        notes=tuple(notes),
    )


def _errors_possible(
    parsed: claim.Claim, sel: selection.Selection, bad_pools: Sequence[pools.Pool]
) -> bool:
    """Whether the scheduler's search order can matter for the verdict (see firstfit)."""
    for group in parsed.groups:
        for req in group.alternatives:
            if req.mode == claim.ALL and (
                bad_pools or any(c.applies(req) for c in parsed.constraints)
            ):
                return True
            if any(sel.errors(req, pos) for pos in range(len(sel.devices))):
                return True
    return False


def weights_for(
    devices: Sequence[pools.Device], *, node_devices: model.NodeDevices | None
) -> placement.Weights:
    """Pairwise placement weights over the candidate devices (positions in ``devices``)."""
    if node_devices is not None:
        topo = topology.build(node_devices)
        by_uuid: dict[str, int] = {}
        for gpu in node_devices.gpus:
            by_uuid[gpu.uuid] = gpu.index
            for mig in gpu.mig_devices:
                by_uuid[mig.uuid] = gpu.index
        indices: list[int | None] = []
        for dev in devices:
            uuid = _string(dev, f"{dev.driver}/uuid")
            parent = _string(dev, f"{dev.driver}/parentUUID")
            indices.append(by_uuid.get(uuid or "", by_uuid.get(parent or "")))
        return placement.Weights.from_topology(topo, indices)
    keys = [
        (
            pools.attribute_key(pools.lookup_attribute(d, f"{d.driver}/nvlinkIsland")),
            pools.attribute_key(pools.lookup_attribute(d, NUMA_ATTRIBUTE)),
            pools.attribute_key(pools.lookup_attribute(d, PCIE_ROOT_ATTRIBUTE)),
        )
        for d in devices
    ]
    return placement.Weights.from_attributes(keys)


def _string(device: pools.Device, name: str) -> str | None:
    attr = pools.lookup_attribute(device, name)
    value = attr.get("string") if attr else None
    return value if isinstance(value, str) else None


def allocation_result(
    parsed: claim.Claim,
    plan: solver.Plan,
    sel: selection.Selection,
    *,
    share_rng: random.Random | None = None,
) -> dict[str, Any]:
    """``status.allocation`` as the scheduler writes it (results, config, nodeSelector); a
    share of a multi-allocatable device gets its ``shareID`` and ``consumedCapacity``."""
    results: list[dict[str, Any]] = []
    chosen: list[pools.Device] = []
    for req, positions in plan.picks:
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
            if capacity.multi_allocatable(dev):
                consumed = sel.capacity_fit(req, pos).consumed or {}
                entry["shareID"] = capacity.share_id(share_rng)
                entry["consumedCapacity"] = capacity.as_status(consumed, dev)
            results.append(entry)
    devices: dict[str, Any] = {"results": results}
    config = _configs(parsed, plan, sel)
    if config:
        devices["config"] = config
    out: dict[str, Any] = {"devices": devices}
    node_selector = _node_selector(chosen)
    if node_selector is not None:
        out["nodeSelector"] = node_selector
    return out


def _configs(
    parsed: claim.Claim, plan: solver.Plan, sel: selection.Selection
) -> list[dict[str, Any]]:
    """Class configs first (once per class, listing its requests), then the claim's own."""
    out: list[dict[str, Any]] = []
    by_class: dict[str, tuple[int, int]] = {}
    for req, _ in plan.picks:
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
        for req, _ in plan.picks:
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
