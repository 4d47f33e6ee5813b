"""Why a dynamic MIG device (or its full GPU) cannot be allocated, in MIG terms.

Why it exists: "its shared counters are used up" does not tell a user what to do; for a GPU
published for dynamic MIG (:mod:`dra_driver.slices.migslices`) the counters mean compute slices,
memory slices and engines, so the explanation can say it the way an operator thinks of MIG:
``gpu-0: 3 of 7 compute slices left, 3g.40gb needs 3 at placement 4, overlaps 1g.10gb at 4``.
The words come from the published slices alone (counter names, the ``profile`` attribute, the
memory slices a device consumes), so this works on exported slices as well as on fake nodes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dra_driver.apimachinery import quantity as qty

_SUFFIX = "-mig"
_SLICE = "memory-slice-"
_COMPUTE = "compute-slices"
_NANO = 1_000_000_000


def _nanos(value: Any) -> int:
    text = value.get("value") if isinstance(value, Mapping) else None
    try:
        return qty.parse_quantity(str(text)).nanos
    except qty.QuantityError:
        return 0


def mig_use(device: Mapping[str, Any]) -> tuple[str, dict[str, int]] | None:
    """(counter set, counter → nanos) of the MIG counter set a device consumes, if any."""
    for use in device.get("consumesCounters") or ():
        name = str(use.get("counterSet") or "")
        counters = use.get("counters") or {}
        if name.endswith(_SUFFIX) and _COMPUTE in counters:
            return name, {k: _nanos(v) for k, v in counters.items()}
    return None


def _slices(counters: Mapping[str, int]) -> list[int]:
    return sorted(int(k[len(_SLICE) :]) for k in counters if k.startswith(_SLICE))


def _label(device: Mapping[str, Any], counters: Mapping[str, int]) -> str:
    attr = (device.get("attributes") or {}).get("profile") or {}
    profile = attr.get("string") if isinstance(attr, Mapping) else None
    if not profile:
        return "the full GPU"
    start = min(_slices(counters), default=0)
    return f"{profile} at {start}"


def reason(
    device: Mapping[str, Any],
    *,
    totals: Mapping[str, Mapping[str, int]],
    left: Mapping[str, Mapping[str, int]],
    holders: Sequence[Mapping[str, Any]],
) -> str | None:
    """The MIG explanation for ``device``, which does not fit; None when it is not a MIG one.

    ``totals`` and ``left`` are the pool's counter sets (nanos) as published and as left by
    allocated devices (and the claim's own picks); ``holders`` are the devices holding counters.
    """
    use = mig_use(device)
    if use is None:
        return None
    set_name, wants = use
    gpu = set_name[: -len(_SUFFIX)]
    total = totals.get(set_name, {})
    free = left.get(set_name, {})
    whole = _COMPUTE in total and wants.get(_COMPUTE) == total[_COMPUTE] and not _profile(device)
    parts = [
        f"{gpu}: {free.get(_COMPUTE, 0) // _NANO} of {total.get(_COMPUTE, 0) // _NANO} "
        "compute slices left"
    ]
    if whole:
        parts.append(f"the full GPU needs all {total.get(_COMPUTE, 0) // _NANO}")
    else:
        start = min(_slices(wants), default=0)
        parts.append(
            f"{_profile(device)} needs {wants.get(_COMPUTE, 0) // _NANO} at placement {start}"
        )
    mine = set(_slices(wants))
    overlaps: list[str] = []
    for other in holders:
        held = mig_use(other)
        if held is None or held[0] != set_name:
            continue
        if mine & set(_slices(held[1])) or (whole and held[1]):
            overlaps.append(_label(other, held[1]))
    if overlaps:
        parts.append("overlaps " + ", ".join(sorted(set(overlaps), key=_start_key)))
    short = [
        counter
        for counter, amount in sorted(wants.items())
        if not counter.startswith(_SLICE) and counter != _COMPUTE and amount > free.get(counter, 0)
    ]
    if short and not overlaps:
        parts.append("not enough " + ", ".join(short) + " left")
    return ", ".join(parts)


def _profile(device: Mapping[str, Any]) -> str:
    attr = (device.get("attributes") or {}).get("profile") or {}
    value = attr.get("string") if isinstance(attr, Mapping) else None
    return str(value) if value else ""


def _start_key(label: str) -> tuple[int, str]:
    _, _, start = label.rpartition(" at ")
    return (int(start), label) if start.isdigit() else (-1, label)
