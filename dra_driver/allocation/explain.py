"""Why a claim cannot be allocated on a node, in words a user can act on.

Why it exists: a pod stuck Pending on a DRA claim is the most common complaint about DRA, and
the scheduler only says "cannot allocate all claims". This module walks each request (and each
``firstAvailable`` alternative) and says, per device, which selector or condition ruled it out
and the attribute values involved ("gpu-3: selectors[1] false: productName is 'NVIDIA L4'"),
then which constraint could not be met ("no 4 devices share gpu.nvidia.com/nvlinkIsland
(largest group: 2)") or that the requests only fail together.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Sequence

from dra_driver.allocation import claim, migexplain, pools, selection

_REF = re.compile(
    r"device\.(attributes|capacity)\[\s*([\"'])([^\"']+)\2\s*\]"
    r"\s*(?:\.\??\s*([A-Za-z_][A-Za-z0-9_]*)|\[\s*([\"'])([^\"']+)\5\s*\])"
)  # .name, .?name (optional) or ["name"]
_PACKED_RANKS = "setRanks"  # slices.gpusets.PACKED_ATTRIBUTE: one digit per set size
_MAX_NAMES = 8  # device names listed per reason


def _display(device: pools.Device, domain: str, ident: str) -> str:
    return ident if domain == device.driver else f"{domain}/{ident}"


def _value_text(device: pools.Device, kind: str, domain: str, ident: str) -> str:
    name = _display(device, domain, ident)
    if kind == "attributes":
        attr = pools.lookup_attribute(device, f"{domain}/{ident}")
        key = pools.attribute_key(attr)
        if key is None:
            return f"{name} is not set"
        value = key[1]
        if ident == _PACKED_RANKS and key[0] == "int" and isinstance(value, int):
            digits = " ".join(str(value // 10**n % 10) for n in range(len(str(value))))
            return f"{name} is {value} (ranks for 1, 2, ... GPUs: {digits})"
        return (
            f"{name} is {value!r}"
            if isinstance(value, str) and key[0] == "string"
            else (f"{name} is {value}")
        )
    caps = device.data.get("capacity") or {}
    cap = caps.get(f"{domain}/{ident}")
    if cap is None and domain == device.driver:
        cap = caps.get(ident)
    if not isinstance(cap, dict) or "value" not in cap:
        return f"{name} capacity is not set"
    return f"{name} is {cap['value']}"


def selector_reason(device: pools.Device, failure: selection.Failure) -> str:
    """``selectors[1] false: productName is 'NVIDIA L4'`` for one device."""
    if failure.error is not None:
        return f"{failure.where} error: {failure.error}"
    facts: list[str] = []
    for m in _REF.finditer(failure.expression):
        kind, domain, ident = m.group(1), m.group(3), m.group(4) or m.group(6)
        text = _value_text(device, kind, domain, ident)
        if text not in facts:
            facts.append(text)
    if "device.driver" in failure.expression:
        facts.append(f"driver is {device.driver!r}")
    detail = ", ".join(facts) if facts else f"({failure.expression})"
    return f"{failure.where} false: {detail}"


def device_reason(
    sel: selection.Selection,
    req: claim.Request,
    pos: int,
    pool_list: Sequence[pools.Pool] = (),
) -> str | None:
    """Why device ``pos`` cannot serve ``req`` (``None`` when it can); ``pool_list`` lets a
    dynamic MIG device's blocked counters be told in MIG terms (:mod:`.migexplain`)."""
    device = sel.devices[pos]
    failure = sel.check(req, pos)
    if failure is not None:
        return selector_reason(device, failure)
    if sel.in_use[pos] and not req.admin_access:
        return "allocated to another claim"
    if pos in sel.blocked:
        return migexplain.blocked_reason(sel, pos, pool_list) or _blocked_reason(sel, pos)
    taint = sel.taint_blocks(req, pos)
    if taint is not None:
        return (
            f"tainted {taint.get('key')}={taint.get('value', '')}:{taint.get('effect')} "
            "and the request does not tolerate it"
        )
    fit = sel.capacity_fit(req, pos)
    return None if fit.ok else fit.reason


def _blocked_reason(sel: selection.Selection, pos: int) -> str:
    """Why a device's shared counters are used up: a device holding its GPU, or shares of it."""
    device = sel.devices[pos]
    mine = {(s, c) for s, used in device.consumes for c, _ in used}
    sharers = [
        d.name
        for d in sel.devices
        if sel.consumed.has(d.id)
        and (d.driver, d.pool) == (device.driver, device.pool)
        and mine & {(s, c) for s, used in d.consumes for c, _ in used}
    ]
    if sharers:
        return (
            f"uses a GPU that allocated shares hold ({', '.join(sharers)}; its shared counter "
            "is used up while any share exists)"
        )
    return "uses a GPU that an allocated device holds (its shared counter is used up)"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _request_lines(
    sel: selection.Selection,
    req: claim.Request,
    label: str,
    pool_list: Sequence[pools.Pool] = (),
) -> list[str]:
    n = len(sel.devices)
    usable = [p for p in range(n) if sel.usable(req, p)]
    in_class = sum(not _other_class(sel, req, p) for p in range(n))
    cls = req.class_name
    if req.mode == claim.ALL:
        matching = [p for p in range(n) if sel.matches(req, p)]
        head = (
            f"{label}: wants all devices of class {cls} matching its selectors: "
            f"{len(matching)} match, {len(usable)} of them usable"
        )
    else:
        head = (
            f"{label}: needs {_plural(req.count, 'device')} of class {cls}; "
            f"{len(usable)} of {in_class} usable"
        )
    lines = [head]
    # Devices of another type than every device of the class (MIG devices next to
    # a class of whole GPUs) are not listed: the class is not about them.
    kinds = {_kind(sel, p) for p in range(n) if not _other_class(sel, req, p)}
    listed = [
        p
        for p in range(n)
        if not (kinds and _other_class(sel, req, p) and _kind(sel, p) not in kinds)
    ]
    reasons = [(p, device_reason(sel, req, p, pool_list)) for p in listed]
    if req.mode == claim.ALL:  # non-matching devices are simply not part of "all"
        reasons = [(p, r) for p, r in reasons if not _plain_mismatch(sel, req, p)]
    grouped: dict[str, list[str]] = {}
    for pos, reason in reasons:
        if reason is not None:
            grouped.setdefault(reason, []).append(sel.devices[pos].name)
    for reason, names in grouped.items():
        if len(names) > _MAX_NAMES:
            shown = [*names[:_MAX_NAMES], f"... ({len(names)} devices)"]
        else:
            shown = names
        lines.append(f"  {', '.join(shown)}: {reason}")
    return lines


def _constraint_lines(
    parsed: claim.Claim, sel: selection.Selection, alts: Sequence[claim.Request]
) -> list[str]:
    lines: list[str] = []
    for con in parsed.constraints:
        covered = [a for a in alts if con.applies(a)]
        if not covered:
            continue
        needed = sum(a.count for a in covered if a.mode == claim.EXACT_COUNT)
        needed += sum(
            sum(sel.matches(a, p) for p in range(len(sel.devices)))
            for a in covered
            if a.mode == claim.ALL
        )
        groups: dict[tuple[str, object], set[int]] = collections.defaultdict(set)
        missing: list[str] = []
        seen: set[int] = set()
        for a in covered:
            for pos in range(len(sel.devices)):
                if not (sel.usable(a, pos) or (a.mode == claim.ALL and sel.matches(a, pos))):
                    continue
                seen.add(pos)
                key = pools.attribute_key(pools.lookup_attribute(sel.devices[pos], con.attribute))
                if key is None:
                    missing.append(sel.devices[pos].name)
                else:
                    groups[key].add(pos)
        largest = max((len(v) for v in groups.values()), default=0)
        if largest >= needed or len(seen) < needed:
            continue  # met, or already explained by too few usable devices
        names = ", ".join(a.name for a in covered)
        best = [str(k[1]) for k, v in groups.items() if len(v) == largest]
        label = "value" if len(best) == 1 else "values"
        why = (
            f"largest group: {largest}, {label} {', '.join(best)}"
            if groups
            else "no usable device has the attribute"
        )
        lines.append(
            f"constraint {con.index} (matchAttribute over {names}): no "
            f"{needed} devices share {con.attribute} ({why})"
        )
        if missing:
            lines.append(f"  {', '.join(dict.fromkeys(missing))}: has no {con.attribute}")
    return lines


def explain(
    parsed: claim.Claim, sel: selection.Selection, pool_list: Sequence[pools.Pool]
) -> tuple[str, ...]:
    """The whole explanation for a claim that cannot be allocated."""
    lines: list[str] = []
    if not pool_list:
        lines.append("no ResourceSlice offers devices to this node")
    for pool in pool_list:
        if pool.incomplete:
            lines.append(
                f"pool {pool.driver}/{pool.name} is incomplete (being updated): "
                "its devices are not used"
            )
        elif pool.invalid:
            lines.append(
                f"pool {pool.driver}/{pool.name} is invalid ({pool.invalid}): "
                "its devices are not used"
            )
    first_alts: list[claim.Request] = []
    individually_ok = True
    for group in parsed.groups:
        chosen = None
        for i, req in enumerate(group.alternatives):
            label = f"request {req.name}"
            if group.first_available:
                label += f" (alternative {i + 1} of {len(group.alternatives)})"
            try:
                sel.class_of(req)
            except selection.UnknownClassError as err:
                lines.append(str(err))
                continue
            req_lines = _request_lines(sel, req, label, pool_list)
            usable = sum(sel.usable(req, p) for p in range(len(sel.devices)))
            ok = usable >= req.count if req.mode == claim.EXACT_COUNT else _all_ok(sel, req)
            if ok and chosen is None:
                chosen = req
            lines.extend(req_lines if not ok or not group.first_available else req_lines[:1])
        if chosen is None:
            individually_ok = False
            chosen = group.alternatives[0]
        first_alts.append(chosen)
    con_lines = _constraint_lines(parsed, sel, first_alts)
    lines.extend(con_lines)
    if individually_ok and not con_lines:
        total = sum(a.count for a in first_alts if a.mode == claim.EXACT_COUNT)
        lines.append(
            "each request could be served on its own, but no set of distinct devices "
            f"serves all of them at once (together at least {total} devices) while "
            "meeting every constraint"
        )
    return tuple(lines)


def _all_ok(sel: selection.Selection, req: claim.Request) -> bool:
    matching = [p for p in range(len(sel.devices)) if sel.matches(req, p)]
    return bool(matching) and all(sel.usable(req, p) for p in matching)


def _kind(sel: selection.Selection, pos: int) -> object:
    return pools.attribute_key(
        pools.lookup_attribute(sel.devices[pos], f"{sel.devices[pos].driver}/type")
    )


def _other_class(sel: selection.Selection, req: claim.Request, pos: int) -> bool:
    """The device is not of the request's class at all (a class selector is plainly false)."""
    failure = sel.check(req, pos)
    return failure is not None and failure.class_name is not None and failure.error is None


def _plain_mismatch(sel: selection.Selection, req: claim.Request, pos: int) -> bool:
    failure = sel.check(req, pos)
    return failure is not None and failure.error is None
