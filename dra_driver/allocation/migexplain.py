"""Why a dynamic MIG device (or its full GPU) cannot be allocated, in MIG terms.

Why it exists: "its shared counters are used up" does not tell a user what to do; for a GPU
published for dynamic MIG (:mod:`dra_driver.slices.migslices`) the counters mean compute slices,
memory slices and engines, so the explanation can say it the way an operator thinks of MIG:
``gpu-0: 3 of 7 compute slices left, 3g.40gb needs 3 at placement 4, overlaps 1g.10gb at 4``.
When the GPU's MIG counters have room but the GPU is held whole (its full device consumes all
of its MIG counter set), it says that instead. The words come from the
published slices alone (counter names, the ``profile`` attribute, the memory slices a device
consumes), so this works on exported slices as well as on fake nodes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dra_driver.allocation import pools, selection

_SUFFIX = "-mig"
_SLICE = "memory-slice-"
_COMPUTE = "compute-slices"
_NANO = 1_000_000_000

Uses = dict[str, dict[str, int]]  # counter set -> counter -> nanos


def _uses(device: pools.Device) -> Uses:
    out: Uses = {}
    for set_name, used in device.consumes:
        for counter, nanos in used:
            out.setdefault(set_name, {})[counter] = out.get(set_name, {}).get(counter, 0) + nanos
    return out


def _mig_set(uses: Mapping[str, Mapping[str, int]]) -> str | None:
    return next((s for s, c in uses.items() if s.endswith(_SUFFIX) and _COMPUTE in c), None)


def _slices(counters: Mapping[str, int]) -> set[int]:
    return {int(k[len(_SLICE) :]) for k in counters if k.startswith(_SLICE)}


def _profile(device: pools.Device) -> str:
    attr = pools.lookup_attribute(device, f"{device.driver}/profile")
    value = attr.get("string") if attr else None
    return str(value) if value else ""


def _label(device: pools.Device, counters: Mapping[str, int]) -> str:
    profile = _profile(device)
    if not profile:
        return device.name
    return f"{profile} at {min(_slices(counters), default=0)}"


def reason(
    device: pools.Device,
    *,
    totals: Mapping[str, Mapping[str, int]],
    holders: Sequence[pools.Device],
) -> str | None:
    """The MIG explanation for ``device``, which does not fit; None when it is not a MIG one.

    ``totals`` are the pool's counter sets (nanos); ``holders`` the pool's devices that hold
    counters now (allocated to other claims, or picked for this one)."""
    wants = _uses(device)
    set_name = _mig_set(wants)
    if set_name is None:
        return _held_by_mig(wants, holders)
    mine = wants[set_name]
    total = totals.get(set_name, {})
    left = dict(total)
    held = [(h, _uses(h)) for h in holders]
    for _, uses in held:
        for counter, nanos in uses.get(set_name, {}).items():
            left[counter] = left.get(counter, 0) - nanos
    gpu = set_name[: -len(_SUFFIX)]
    whole = not _profile(device)
    compute = total.get(_COMPUTE, 0) // _NANO
    parts = [f"{gpu}: {max(left.get(_COMPUTE, 0), 0) // _NANO} of {compute} compute slices left"]
    if whole:
        parts.append(f"the full GPU needs all {compute}")
    else:
        start = min(_slices(mine), default=0)
        parts.append(
            f"{_profile(device)} needs {mine.get(_COMPUTE, 0) // _NANO} at placement {start}"
        )
    overlaps = sorted(
        {
            (min(_slices(uses[set_name]), default=-1), _label(h, uses[set_name]))
            for h, uses in held
            if set_name in uses and (whole or _slices(mine) & _slices(uses[set_name]))
        }
    )
    if overlaps:
        parts.append("overlaps " + ", ".join(label for _, label in overlaps))
        return ", ".join(parts)
    short = sorted(c for c, n in mine.items() if not c.startswith(_SLICE) and n > left.get(c, 0))
    if short:
        parts.append("not enough " + ", ".join(short) + " left")
        return ", ".join(parts)
    # The MIG counters have room: the GPU is held whole through another counter set.
    others = [
        h.name
        for h, uses in held
        if any(
            counter in uses.get(other, {})
            for other, counters in wants.items()
            if other != set_name
            for counter in counters
        )
    ]
    if others:
        parts.append(f"but the whole GPU is allocated ({', '.join(sorted(set(others)))})")
    return ", ".join(parts)


def _held_by_mig(wants: Uses, holders: Sequence[pools.Device]) -> str | None:
    """A full GPU blocked because MIG devices of it are allocated."""
    per_gpu: dict[str, list[tuple[int, str]]] = {}
    for holder in holders:
        uses = _uses(holder)
        mig = _mig_set(uses)
        shares = any(
            counter in uses.get(other, {})
            for other, counters in wants.items()
            for counter in counters
        )
        if mig is None or not shares:
            continue
        label = _label(holder, uses[mig])
        per_gpu.setdefault(mig[: -len(_SUFFIX)], []).append(
            (min(_slices(uses[mig]), default=-1), label)
        )
    if not per_gpu:
        return None
    return "; ".join(
        f"{gpu} has MIG devices allocated ({', '.join(label for _, label in sorted(found))})"
        for gpu, found in sorted(per_gpu.items())
    )


def blocked_reason(
    sel: selection.Selection, pos: int, pool_list: Sequence[pools.Pool], picked: Sequence[int] = ()
) -> str | None:
    """:func:`reason` for device ``pos`` of a selection, from the pools the devices came from:
    its pool's counter sets, and the pool's devices here in use (or in ``picked``) as holders."""
    device = sel.devices[pos]
    pool = next((p for p in pool_list if (p.driver, p.name) == (device.driver, device.pool)), None)
    if pool is None:
        return None
    holders = [
        d
        for i, d in enumerate(sel.devices)
        if (sel.in_use[i] or i in picked) and (d.driver, d.pool) == (device.driver, device.pool)
    ]
    return reason(device, totals=pool.counter_sets, holders=holders)
