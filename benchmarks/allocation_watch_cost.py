"""What learning of allocations costs the API server: a watch of each node's Pods against a
cluster-wide watch of ResourceClaims, per allocation, at N nodes.

Why it exists: the node agent must learn of claims allocated on its node before the kubelet
prepares them (docs/topology.md). Two ways: (a) every agent watches the Pods bound to its node
(``fieldSelector=spec.nodeName=<node>``, filtered by the server) and GETs each claim they name;
(b) every agent watches all ResourceClaims (claims have no field selector for the node they are
allocated on) and keeps those naming its pool. This replays one pod lifecycle per allocation on
the in-memory API — the claim created, allocated and reserved (the scheduler), the pod bound,
the claim's device status applied (the driver), the pod running, then deleted, the claim
deallocated and deleted — with ``--nodes`` agents watching, and counts what each watch delivers
(events and JSON bytes, summed over all agents) and the requests agents make. (b) is computed
from the claim writes of the same run (the fake API server keeps no watch history of claims):
every claim write is one event to every agent.

Run: ``python benchmarks/allocation_watch_cost.py [--nodes 10 100 1000] [--allocations 50]``.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dra_driver.kube.objects import PODS  # noqa: E402
from dra_driver.slices import allocwatch  # noqa: E402
from dra_driver.testing.fakeapi import memory  # noqa: E402

DRIVER = "gpu.nvidia.com"
NAMESPACE = "bench"


def lifecycle(
    mem: memory.InMemoryApi, i: int, node: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One pod with one 4-GPU claim through its life; returns (claim versions written, pod
    versions written), as a watch would deliver them."""
    name = f"job-{i}"
    uid = str(uuid.uuid4())
    claim: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": uid},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpus",
                        "exactly": {"deviceClassName": DRIVER, "count": 4},
                    }
                ]
            }
        },
    }
    claims = [mem.put_resource_claim(claim)]
    results = [
        {"request": "gpus", "driver": DRIVER, "pool": node, "device": f"gpu-{g}"} for g in range(4)
    ]
    allocated = copy.deepcopy(claim)
    allocated["status"] = {
        "allocation": {"devices": {"results": results}},
        "reservedFor": [{"resource": "pods", "name": name, "uid": str(uuid.uuid4())}],
    }
    claims.append(mem.put_resource_claim(allocated))  # PreBind: allocation + reservedFor
    pods = [
        mem.objects.create(
            PODS,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": NAMESPACE},
                "spec": {
                    "nodeName": node,
                    "containers": [{"name": "c", "image": "busybox"}],
                    "resourceClaims": [{"name": "gpus", "resourceClaimName": name}],
                },
            },
        )
    ]
    status = copy.deepcopy(allocated)
    status["status"]["devices"] = [
        {"driver": DRIVER, "pool": node, "device": r["device"], "data": {"uuid": "GPU-x"}}
        for r in results
    ]
    claims.append(mem.put_resource_claim(status))  # the driver's device status
    running = mem.objects.get(PODS, name, namespace=NAMESPACE)
    running["status"] = {"phase": "Running"}
    pods.append(mem.objects.update_status(PODS, running))
    mem.objects.delete(PODS, name, namespace=NAMESPACE)
    pods.append(running)  # the DELETED event carries the last state
    freed = copy.deepcopy(claim)
    claims.append(mem.put_resource_claim(freed))  # reservedFor emptied, deallocated
    mem.delete_resource_claim(NAMESPACE, name)
    claims.append(freed)  # the DELETED event
    return claims, pods


def run(nodes: int, allocations: int) -> dict[str, float]:
    mem = memory.InMemoryApi(use_default_cel=False)
    mem.put_namespace(NAMESPACE)
    claim_events = claim_bytes = pod_events = pod_bytes = 0
    for i in range(allocations):
        claims, pods = lifecycle(mem, i, f"node-{i % nodes}")
        claim_events += len(claims)
        claim_bytes += sum(len(json.dumps({"type": "MODIFIED", "object": c})) for c in claims)
        pod_events += len(pods)
        pod_bytes += sum(len(json.dumps({"type": "MODIFIED", "object": p})) for p in pods)
        assert allocwatch.claims_of(pods[0]) == ((NAMESPACE, f"job-{i}"),)
    return {
        # (a): each pod event goes to its node's agent only; one claim GET per allocation
        "pods_events": pod_events / allocations,
        "pods_bytes": pod_bytes / allocations + claim_bytes / claim_events,
        "pods_requests": 1.0,
        # (b): each claim write goes to every agent
        "claims_events": claim_events * nodes / allocations,
        "claims_bytes": claim_bytes * nodes / allocations,
        "claims_requests": 0.0,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--allocations", type=int, default=50)
    args = parser.parse_args()
    print(f"# per allocation (one 4-GPU pod's lifecycle), {args.allocations} allocations")
    print(
        "| nodes | Pods watch (ours): events / bytes / requests | "
        "claims watch: events / bytes / requests |"
    )
    print("|---|---|---|")
    for nodes in args.nodes:
        r = run(nodes, args.allocations)
        print(
            f"| {nodes} | {r['pods_events']:.0f} / {r['pods_bytes'] / 1024:.1f} KiB / "
            f"{r['pods_requests']:.0f} GET | {r['claims_events']:.0f} / "
            f"{r['claims_bytes'] / 1024:.1f} KiB / {r['claims_requests']:.0f} |",
            flush=True,
        )
    print("# both: one list + one watch per agent at start and every watch timeout (30 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
