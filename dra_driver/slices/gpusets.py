"""Set ranks on the GPU devices: how the slices tell kube-scheduler which free GPUs go together.

Why it exists: to let the stock scheduler pick NVLink-optimal sets of GPUs (docs/topology.md)
without publishing anything but one device per GPU. For every set size N the node can serve
(1 up to its full GPUs minus one), each full GPU has a rank: 1 when it belongs to the best free
set of N GPUs, 2 when it belongs to the best one left once rank 1 is taken, ...
(:func:`dra_driver.devices.gpusets.ranked`), 0 when it belongs to none (it is held by a claim,
unhealthy, or left over); for N = 1 the rank orders single GPUs: 1 on the free GPU whose loss
leaves the best sets, 2 on the next one, ... (:func:`dra_driver.devices.gpusets.singles`).
``dra-driver claim --gpus N`` asks for N GPUs of rank 1, else of rank 2, ..., else any N.

All sizes' ranks travel in **one** int attribute, ``setRanks``, one decimal digit per size:
digit N counted from the right (the ``10**(N-1)`` place) is the rank for N GPUs (:func:`pack`).
Ranks are 0..7 and sizes 1..15 (16 GPUs at most), so the value has at most 15 digits, below
10**15, far inside int64. One attribute instead of one per size keeps every GPU device small,
and the scheduler copies every attribute of a device each time it converts it or evaluates a
selector on it (docs/topology.md, "What it costs the scheduler").

The ranks describe the free GPUs as this agent sees them (the claims it prepared, the GPUs'
health), so they change as claims come and go and the agent re-publishes. They are a hint for
picking, never a lock: the scheduler still allocates GPU devices, each to one claim at a time,
so a rank that is stale for a moment can only cost a claim its best set, never give a GPU to two
claims. No shared counters are needed for this (counters make every node's scheduling read every
other node's pool in Kubernetes 1.36; only dynamic MIG still uses them, :mod:`.migslices`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from dra_driver.devices import gpusets, model

PACKED_ATTRIBUTE = "setRanks"
MAX_SIZE = 15  # devices.gpusets.MAX_GPUS - 1: the digits setRanks can hold
_STOP = ("NoSchedule", "NoExecute")

Obj = dict[str, Any]


def pack(ranks: Mapping[int, int]) -> int:
    """The ``setRanks`` value for ``{size: rank}``: rank N at the ``10**(N-1)`` digit."""
    value = 0
    for size, rank in ranks.items():
        if not 1 <= size <= MAX_SIZE or not 0 <= rank <= 9:
            raise ValueError(f"set rank {rank} for size {size} does not fit setRanks")
        value += rank * 10 ** (size - 1)
    return value


def unpack(value: int) -> dict[int, int]:
    """``{size: rank}`` for every size 1..15 from a ``setRanks`` value (0: in no ranked set)."""
    return {size: value // 10 ** (size - 1) % 10 for size in range(1, MAX_SIZE + 1)}


def rank_of(attributes: Mapping[str, Any], size: int) -> int:
    """A GPU's rank among the best sets of ``size`` from its device ``attributes`` (0 when it
    carries no ``setRanks``)."""
    packed = attributes.get(PACKED_ATTRIBUTE)
    return int(packed["int"]) // 10 ** (size - 1) % 10 if packed else 0


def add_ranks(
    devices: model.NodeDevices, entries: Sequence[Obj], *, taken: Collection[str] = ()
) -> None:
    """Give every full GPU's entry its ``setRanks`` attribute (``entries`` change in place).

    Free GPUs are those with an entry, not in ``taken`` (names) and without a taint that keeps
    claims off them (NoSchedule, NoExecute): a tainted GPU gets pods only by toleration, so a
    set holding it is not a set a plain claim can have.
    """
    by_name = {e["name"]: e for e in entries}
    whole = [g for g in gpusets.eligible(devices) if g.name in by_name]
    if not whole:
        return
    blocked = set(taken) | {g.name for g in whole if _keeps_off(by_name[g.name])}
    blocked |= {g.name for g in gpusets.eligible(devices) if g.name not in by_name}
    ranks = gpusets.ranked(devices, taken=blocked)
    position = {  # by name: comparing Gpu objects field by field was most of a re-rank's time
        size: {g.name: i for i, s in enumerate(chain, 1) for g in s.gpus}
        for size, chain in ranks.items()
    }
    for gpu in whole:
        attrs = by_name[gpu.name]["attributes"]
        mine = {size: members.get(gpu.name, 0) for size, members in position.items()}
        if mine:
            attrs[PACKED_ATTRIBUTE] = {"int": pack(mine)}
        by_name[gpu.name]["attributes"] = dict(sorted(attrs.items()))


def _keeps_off(entry: Mapping[str, Any]) -> bool:
    return any(t.get("effect") in _STOP for t in entry.get("taints") or ())
