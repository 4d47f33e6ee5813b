"""A cluster's worth of ResourceSlices and allocated ResourceClaims, for capacity tests and the
capacity benchmark.

Why it exists: ``dra-driver capacity`` reads a fleet; its tests and ``benchmarks/capacity.py``
need one that looks like what a real cluster serves: per node the slices the node agent
publishes (the real slice builder on a fake GPU profile, set ranks of the GPUs its prepared
claims leave free) and the claims holding GPUs, with ``status.allocation`` as the scheduler
writes it. Seeded: the same arguments give the same fleet.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from dra_driver import records
from dra_driver.allocation import claimgen
from dra_driver.devices import fake, model
from dra_driver.slices import build

DRIVER = build.DEFAULT_DRIVER_NAME
Obj = dict[str, Any]


@records.record
class Fleet:
    slices: list[Obj]
    claims: list[Obj]
    profile_of: dict[str, str]  # node -> fake profile
    devices: dict[str, model.NodeDevices]  # profile -> its devices
    held: dict[str, set[str]]  # node -> names of the GPUs its claims hold


def make(
    nodes: int,
    *,
    profiles: Sequence[str] = ("dgx-h100", "dgx-1-v100", "h100-nvl-pairs", "pcie-l4"),
    seed: int = 1,
    busy: float = 0.5,
    empty: float = 0.1,
    prefix: str = "node",
) -> Fleet:
    """``nodes`` nodes, profiles in turn; a node is empty with probability ``empty``, else each
    GPU is held with probability ``busy`` by claims of 1, 2 or 4 GPUs (one claim per group of
    held GPUs, in the profile's order)."""
    rng = random.Random(seed)
    devices = {p: fake.FakeBackend.from_name(p).discover() for p in profiles}
    width = len(str(nodes - 1))
    slices: list[Obj] = []
    claims: list[Obj] = []
    profile_of: dict[str, str] = {}
    held: dict[str, set[str]] = {}
    for i in range(nodes):
        profile = profiles[i % len(profiles)]
        node = f"{prefix}-{i:0{width}d}"
        names = [g.name for g in devices[profile].gpus if not g.mig_enabled]
        idle = rng.random() < empty
        taken = [n for n in names if rng.random() < busy and not idle]
        profile_of[node], held[node] = profile, set(taken)
        slices += build.build(
            devices[profile], node_name=node, driver_name=DRIVER, taken=set(taken)
        ).slices
        while taken:
            size = min(len(taken), rng.choice((1, 2, 4)))
            group, taken = taken[:size], taken[size:]
            claims.append(allocated_claim(f"{node}-c{len(claims)}", node, group))
    return Fleet(slices, claims, profile_of, devices, held)


def allocated_claim(name: str, node: str, gpus: Sequence[str], namespace: str = "default") -> Obj:
    """A ResourceClaim allocated to ``gpus`` of ``node``'s pool, as the scheduler writes it."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": claimgen.spec(len(gpus), nvlink="any"),
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpus", "driver": DRIVER, "pool": node, "device": g}
                        for g in gpus
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                },
            }
        },
    }
