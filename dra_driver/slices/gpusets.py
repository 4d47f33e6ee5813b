"""Set ranks on the GPU devices: how the slices tell kube-scheduler which free GPUs go together.

Why it exists: to let the stock scheduler pick NVLink-optimal sets of GPUs (docs/topology.md)
without publishing anything but one device per GPU. For every set size N the node can serve
(2 up to its full GPUs minus one), each full GPU's device carries an int attribute
``setRank<N>``: 1 when it belongs to the best free set of N GPUs, 2 when it belongs to the best
one left once rank 1 is taken, ... (:func:`dra_driver.devices.gpusets.ranked`), 0 when it
belongs to none (it is held by a claim, unhealthy, or left over). ``setRank1`` orders single
GPUs: 1 on the free GPU whose loss leaves the best sets, 2 on the next one, ...
(:func:`dra_driver.devices.gpusets.singles`). ``dra-driver claim --gpus N`` asks for N GPUs of
rank 1, else of rank 2, ..., else any N.

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

RANK_PREFIX = "setRank"
_STOP = ("NoSchedule", "NoExecute")

Obj = dict[str, Any]


def rank_attribute(size: int) -> str:
    """``setRank<size>``: the attribute holding a GPU's rank among the best sets of ``size``."""
    return f"{RANK_PREFIX}{size}"


def add_ranks(
    devices: model.NodeDevices, entries: Sequence[Obj], *, taken: Collection[str] = ()
) -> None:
    """Give every full GPU's entry its ``setRank<N>`` attributes (``entries`` change in place).

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
    rank_of = {  # by name: comparing Gpu objects field by field was most of a re-rank's time
        size: {g.name: i for i, s in enumerate(chain, 1) for g in s.gpus}
        for size, chain in ranks.items()
    }
    for gpu in whole:
        attrs = by_name[gpu.name]["attributes"]
        for size, members in rank_of.items():
            attrs[rank_attribute(size)] = {"int": members.get(gpu.name, 0)}
        by_name[gpu.name]["attributes"] = dict(sorted(attrs.items()))


def _keeps_off(entry: Mapping[str, Any]) -> bool:
    return any(t.get("effect") in _STOP for t in entry.get("taints") or ())
