"""The ResourceClaims ``dra-driver claim`` writes: N GPUs, best NVLink placement the node has.

Why it exists: kube-scheduler takes the first devices that fit, so *how a claim is written*
decides what it gets. Our slices mark every GPU with its rank among the best free sets of N GPUs
(digit N of the int attribute ``setRanks``, docs/topology.md), so the claim that gets the best
free N GPUs on any node is a ``firstAvailable`` ladder over plain GPUs:

1. ``count: N`` GPUs of rank 1 for N: the best free set the node has;
2. else of rank 2, 3, ...: the best set once the better ones are taken (a burst of claims on
   one node gets what one-by-one allocation would give, before the agent re-ranks);
   for one GPU (digit 1) rank 1 is the free GPU whose loss leaves the node's best sets
   whole, rank 2 the next one, ...;
3. else ``count: N`` whole GPUs (class ``gpu.nvidia.com``): reached when no ranked set is free,
   e.g. on a node that publishes no ranks (other drivers, ``--gpu-sets=false``) or while ranks
   are out of date.

The rank subrequests name ``gpu-ranked.nvidia.com``, a class without selectors, and test the
driver in their own one selector (``device.driver == ... && <digit> == rank``): the scheduler
then evaluates one expression per device and subrequest instead of the class's and the rank's.
Where that class is not installed (chart ``deviceClasses.gpuRanked: false``),
``ranked_class=None`` writes the rank subrequests on ``gpu.nvidia.com`` with the digit alone.

The same claim works on every node of a mixed cluster; it uses only the shipped classes and
GPU devices, so whatever it gets, no GPU can go to two claims. ``--nvlink island`` writes N GPUs
sharing an NVLink island (``matchAttribute``), ``any`` plain ``count: N``.
"""

from __future__ import annotations

from typing import Any

DEFAULT_DRIVER_NAME = "gpu.nvidia.com"
GPU_CLASS = "gpu.nvidia.com"
RANKED_CLASS = "gpu-ranked.nvidia.com"  # no selectors: the rank subrequests test the driver
PACKED_ATTRIBUTE = "setRanks"  # slices.gpusets.PACKED_ATTRIBUTE (this module stays below slices)
MAX_RANKS = 7  # firstAvailable holds 8 alternatives: the ranks and "any"
NODE_GPUS = 8  # ranks asked for: those an 8-GPU node can have (8 // N)
MAX_SIZE = 15  # slices.gpusets.MAX_SIZE: the set sizes setRanks holds a digit for
MODES = ("best", "island", "any")
REQUEST = "gpus"


class ClaimGenError(ValueError):
    """Arguments that cannot make a claim (the message says which and why)."""


def spec(
    gpus: int,
    *,
    nvlink: str = "best",
    driver_name: str = DEFAULT_DRIVER_NAME,
    ranked_class: str | None = RANKED_CLASS,
) -> dict[str, Any]:
    """The ``ResourceClaimSpec`` for ``gpus`` GPUs in the given NVLink mode; the rank
    subrequests name ``ranked_class`` (a class without selectors), or with ``None`` the GPU
    class."""
    if gpus < 1 or gpus > 32:
        raise ClaimGenError(
            f"--gpus must be between 1 and 32 (a claim holds 32 devices), not {gpus}"
        )
    if nvlink not in MODES:
        raise ClaimGenError(f"--nvlink must be one of {', '.join(MODES)}, not {nvlink!r}")
    plain = {"deviceClassName": GPU_CLASS, "allocationMode": "ExactCount", "count": gpus}
    if nvlink == "any" or (nvlink == "best" and gpus > MAX_SIZE):
        # No node ranks sets of more than 15 GPUs (16 GPUs at most): any N it is.
        return {"devices": {"requests": [{"name": REQUEST, "exactly": plain}]}}
    if nvlink == "island":
        if gpus == 1:
            return {"devices": {"requests": [{"name": REQUEST, "exactly": plain}]}}
        return {
            "devices": {
                "requests": [{"name": REQUEST, "exactly": plain}],
                "constraints": [{"matchAttribute": f"{driver_name}/nvlinkIsland"}],
            }
        }
    ranked = [
        {
            "name": f"rank{rank}",
            **plain,
            **({"deviceClassName": ranked_class} if ranked_class else {}),
            "selectors": [
                {"cel": {"expression": rank_expression(gpus, rank, driver_name, ranked_class)}}
            ],
        }
        for rank in range(1, rank_count(gpus) + 1)
    ]
    return {
        "devices": {
            "requests": [{"name": REQUEST, "firstAvailable": [*ranked, {"name": "any", **plain}]}]
        }
    }


def rank_expression(gpus: int, rank: int, driver_name: str, ranked_class: str | None) -> str:
    """The CEL test "rank ``rank`` among the best sets of ``gpus``": digit ``gpus`` of
    ``setRanks``, and the driver's name when the class does not test it."""
    value = f'device.attributes["{driver_name}"].?{PACKED_ATTRIBUTE}.orValue(0)'
    digit = f"{value} % 10" if gpus == 1 else f"{value} / {10 ** (gpus - 1)} % 10"
    test = f"{digit} == {rank}"
    return f'device.driver == "{driver_name}" && {test}' if ranked_class else test


def rank_count(gpus: int) -> int:
    """How many ranks the claim for ``gpus`` GPUs asks for before "any": as many disjoint sets
    of that size as an 8-GPU node holds (1 from 5 GPUs up), at most :data:`MAX_RANKS`."""
    return max(1, min(MAX_RANKS, NODE_GPUS // gpus))


def claim(
    gpus: int,
    *,
    nvlink: str = "best",
    template: bool = False,
    name: str | None = None,
    namespace: str | None = None,
    driver_name: str = DEFAULT_DRIVER_NAME,
    ranked_class: str | None = RANKED_CLASS,
) -> dict[str, Any]:
    """A ResourceClaim (or ResourceClaimTemplate) asking for ``gpus`` GPUs."""
    body = spec(gpus, nvlink=nvlink, driver_name=driver_name, ranked_class=ranked_class)
    meta: dict[str, Any] = {
        "name": name or f"gpus-{gpus}" + ("" if nvlink == "best" else f"-{nvlink}")
    }
    if namespace:
        meta["namespace"] = namespace
    if template:
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": meta,
            "spec": {"spec": body},
        }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": meta,
        "spec": body,
    }
