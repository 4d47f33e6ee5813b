"""The ResourceClaims ``dra-driver claim`` writes: N GPUs, best NVLink placement the node has.

Why it exists: kube-scheduler takes the first devices that fit, so *how a claim is written*
decides what it gets. With the GPU-set devices our slices publish (docs/topology.md) the claim
that gets the best free N GPUs on any node is a ``firstAvailable`` ladder:

1. one device of class ``gpu-set.nvidia.com`` with ``gpuCount == N``: sets are published best
   first, so the first free one is the best free N GPUs the node has;
2. else ``count: N`` whole GPUs (class ``gpu.nvidia.com``): reached when no published set is
   free, e.g. when exactly N GPUs are free (then it takes all of them, the only choice) or on
   a node that publishes no sets.

The same claim works on every node of a mixed cluster; it uses only the shipped classes.
``--nvlink island`` writes N GPUs sharing an NVLink island (``matchAttribute``), ``any`` plain
``count: N``.
"""

from __future__ import annotations

from typing import Any

DEFAULT_DRIVER_NAME = "gpu.nvidia.com"
GPU_CLASS = "gpu.nvidia.com"
SET_CLASS = "gpu-set.nvidia.com"
MODES = ("best", "island", "any")
REQUEST = "gpus"


class ClaimGenError(ValueError):
    """Arguments that cannot make a claim (the message says which and why)."""


def spec(
    gpus: int, *, nvlink: str = "best", driver_name: str = DEFAULT_DRIVER_NAME
) -> dict[str, Any]:
    """The ``ResourceClaimSpec`` for ``gpus`` GPUs in the given NVLink mode."""
    if gpus < 1 or gpus > 32:
        raise ClaimGenError(
            f"--gpus must be between 1 and 32 (a claim holds 32 devices), not {gpus}"
        )
    if nvlink not in MODES:
        raise ClaimGenError(f"--nvlink must be one of {', '.join(MODES)}, not {nvlink!r}")
    plain = {"deviceClassName": GPU_CLASS, "allocationMode": "ExactCount", "count": gpus}
    if gpus == 1 or nvlink == "any":
        return {"devices": {"requests": [{"name": REQUEST, "exactly": plain}]}}
    if nvlink == "island":
        return {
            "devices": {
                "requests": [{"name": REQUEST, "exactly": plain}],
                "constraints": [{"matchAttribute": f"{driver_name}/nvlinkIsland"}],
            }
        }
    expression = f'device.attributes["{driver_name}"].gpuCount == {gpus}'
    return {
        "devices": {
            "requests": [
                {
                    "name": REQUEST,
                    "firstAvailable": [
                        {
                            "name": "nvlinked",
                            "deviceClassName": SET_CLASS,
                            "allocationMode": "ExactCount",
                            "count": 1,
                            "selectors": [{"cel": {"expression": expression}}],
                        },
                        {"name": "any", **plain},
                    ],
                }
            ]
        }
    }


def claim(
    gpus: int,
    *,
    nvlink: str = "best",
    template: bool = False,
    name: str | None = None,
    namespace: str | None = None,
    driver_name: str = DEFAULT_DRIVER_NAME,
) -> dict[str, Any]:
    """A ResourceClaim (or ResourceClaimTemplate) asking for ``gpus`` GPUs."""
    body = spec(gpus, nvlink=nvlink, driver_name=driver_name)
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
