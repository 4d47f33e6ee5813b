"""How the node agent can learn of the claims allocated on its node without reading every Pod of
the cluster: what each way costs the API server and what it lets a GPU node read.

Why it exists: ranks that follow allocations (docs/topology.md) need, on each node, the claims
the scheduler allocated there before the kubelet prepares them. Issue 48 asked which source to
use once cluster-wide Pod reads are off the table (docs/security.md has the choice). This replays
one allocation's life on the in-memory API server with the real-shaped bodies of
``../shared/reference/real-wire/`` (a Pod and an allocated ResourceClaim read from a 1.36 server,
``managedFields`` and all): the claim created, its finalizer and allocation written by the
scheduler, its device status applied by the driver, the pod created, bound, started, deleted,
the claim freed and deleted. Every version the server stores is what a watch delivers for that
write; each option is then counted from them, summed over every watcher, per allocation:

* ``pods`` / ``node``: each agent watches its node's Pods (``fieldSelector=spec.nodeName``; the
  server sends a pod's events to its node's agent only) and GETs the claims they name; ``pods``
  with the agent's own identity (RBAC: every Pod of the cluster), ``node`` acting as the node
  (constrained impersonation, 1.36; the Node authorizer: that node's Pods only);
* ``metadata``: the same watch as ``PartialObjectMetadata`` (``Accept:
  ...;as=PartialObjectMetadata``): same verbs, so the same RBAC grant, and no
  ``spec.resourceClaims`` / ``status`` in what it carries: not enough;
* ``claims``: every agent lists and watches every ResourceClaim (no field selector names the
  node a claim is allocated on): each claim event goes to all N agents;
* ``fan-out``: one controller watches every claim once and writes a per-node object listing that
  node's allocations; each agent watches its own (``metadata.name=<node>``). Modelled: the object
  (one per node, carrying this and two other claims) is sized, not served;
* ``prepare``: no watch; the kubelet's NodePrepareResources tells the agent, 0.1-3 s after the
  pod is bound (docs/topology.md's "ranks follow prepares" rows): too late in a burst.

Run: ``python benchmarks/allocation_sources.py [--nodes 100 1000] [--allocations 20]``.
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

WIRE = REPO.parent / "shared" / "reference" / "real-wire"
NAMESPACE = "bench"
NOW = "2026-12-01T23:00:56Z"
Obj = dict[str, Any]


def event_bytes(kind: str, obj: Obj) -> int:
    """A watch event's JSON line as kube-apiserver writes it (compact)."""
    return len(json.dumps({"type": kind, "object": obj}, separators=(",", ":"))) + 1


def metadata_only(obj: Obj) -> Obj:
    """What a PartialObjectMetadata watch carries of ``obj``."""
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj["metadata"],
    }


def load(name: str) -> Obj:
    return json.loads((WIRE / name).read_text())  # type: ignore[no-any-return]


def kubelet_status(phase: str, node: str, running: bool, terminated: bool = False) -> Obj:
    """A pod status of the shape the kubelet writes (conditions, IPs, one container)."""
    ready = "True" if running and not terminated else "False"
    conditions = [
        {"type": t, "status": s, "lastProbeTime": None, "lastTransitionTime": NOW}
        for t, s in (
            ("PodReadyToStartContainers", "True" if running else "False"),
            ("Initialized", "True"),
            ("Ready", ready),
            ("ContainersReady", ready),
            ("PodScheduled", "True"),
        )
    ]
    if terminated:
        state: Obj = {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": NOW}}
    elif running:
        state = {"running": {"startedAt": NOW}}
    else:
        state = {"waiting": {"reason": "ContainerCreating"}}
    return {
        "phase": phase,
        "conditions": conditions,
        "hostIP": "10.0.3.17",
        "hostIPs": [{"ip": "10.0.3.17"}],
        "podIP": "10.128.4.21",
        "podIPs": [{"ip": "10.128.4.21"}],
        "startTime": NOW,
        "containerStatuses": [
            {
                "name": "c",
                "state": state,
                "lastState": {},
                "ready": running and not terminated,
                "restartCount": 0,
                "image": "registry.invalid/none:never",
                "imageID": "registry.invalid/none@sha256:" + "0" * 64,
                "containerID": "cri-o://" + "a" * 64,
                "started": running and not terminated,
            }
        ],
        "qosClass": "BestEffort",
        "resourceClaimStatuses": [],
    }


def lifecycle(mem: memory.InMemoryApi, i: int, node: str) -> tuple[list[Obj], list[Obj], Obj]:
    """One pod with one claim through its life on ``mem``; returns (claim versions, pod versions
    its node's watch receives, the claim as the agent's GET reads it)."""
    name, pod_name = f"claim-{i}", f"pod-{i}"
    wire_claim, wire_pod = load("resourceclaim-allocated-get.json"), load("pod-with-claim-get.json")
    claim: Obj = copy.deepcopy(wire_claim)
    claim["metadata"].update(name=name, namespace=NAMESPACE, uid=str(uuid.uuid4()))
    for key in ("resourceVersion", "finalizers"):
        claim["metadata"].pop(key, None)
    allocated_status = claim.pop("status")
    for result in allocated_status["allocation"]["devices"]["results"]:
        result["pool"] = node
    claims = [mem.put_resource_claim(copy.deepcopy(claim))]  # created
    claim["metadata"]["finalizers"] = ["resource.kubernetes.io/delete-protection"]
    claims.append(mem.put_resource_claim(copy.deepcopy(claim)))  # scheduler: finalizer
    claim["status"] = copy.deepcopy(allocated_status)
    claims.append(mem.put_resource_claim(copy.deepcopy(claim)))  # PreBind: allocation, reservedFor
    read = mem.get_resource_claim(NAMESPACE, name)  # the agent's GET when the pod shows up
    claim["status"]["devices"] = [
        {"driver": r["driver"], "pool": r["pool"], "device": r["device"], "data": {"uuid": "GPU-x"}}
        for r in allocated_status["allocation"]["devices"]["results"]
    ]
    claims.append(mem.put_resource_claim(copy.deepcopy(claim)))  # the driver's device status
    pod: Obj = copy.deepcopy(wire_pod)
    pod["metadata"].update(name=pod_name, namespace=NAMESPACE)
    for key in ("resourceVersion", "uid"):
        pod["metadata"].pop(key, None)
    pod["spec"].pop("nodeName", None)
    pod["spec"]["resourceClaims"] = [{"name": "g", "resourceClaimName": name}]
    mem.objects.create(PODS, pod)  # unbound: no node's watch sees it
    stored = mem.objects.get(PODS, pod_name, namespace=NAMESPACE)
    stored["spec"]["nodeName"] = node
    pods = [mem.objects.update(PODS, stored)]  # bound: ADDED at the node's watch
    for status in (
        kubelet_status("Pending", node, running=False),
        kubelet_status("Running", node, running=True),
    ):
        current = mem.objects.get(PODS, pod_name, namespace=NAMESPACE)
        current["status"] = status
        pods.append(mem.objects.update_status(PODS, current))
    current = mem.objects.get(PODS, pod_name, namespace=NAMESPACE)
    current["metadata"]["deletionTimestamp"] = NOW  # graceful delete
    current["metadata"]["deletionGracePeriodSeconds"] = 30
    pods.append(mem.objects.update(PODS, current))
    current = mem.objects.get(PODS, pod_name, namespace=NAMESPACE)
    current["status"] = kubelet_status("Succeeded", node, running=True, terminated=True)
    pods.append(mem.objects.update_status(PODS, current))
    mem.objects.delete(PODS, pod_name, namespace=NAMESPACE)
    pods.append(pods[-1])  # DELETED carries the last state
    assert allocwatch.claims_of(pods[0]) == ((NAMESPACE, name),)
    assert allocwatch.claims_of(metadata_only(pods[0])) == ()  # metadata alone names no claim
    del claim["status"]
    claims.append(mem.put_resource_claim(copy.deepcopy(claim)))  # freed: reservedFor, allocation
    claim["metadata"].pop("finalizers")
    claims.append(mem.put_resource_claim(copy.deepcopy(claim)))  # finalizer removed
    mem.delete_resource_claim(NAMESPACE, name)
    claims.append(claims[-1])  # DELETED
    return claims, pods, read


def node_object(node: str, claims: int) -> Obj:
    """The fan-out's per-node object carrying ``claims`` allocations (4 GPUs each)."""
    return {
        "apiVersion": "gpu.nvidia.com/v1alpha1",
        "kind": "NodeAllocations",
        "metadata": {
            "name": node,
            "uid": str(uuid.uuid4()),
            "resourceVersion": "123456",
            "generation": 7,
            "creationTimestamp": NOW,
            "managedFields": [
                {
                    "manager": "dra-driver-controller",
                    "operation": "Apply",
                    "apiVersion": "gpu.nvidia.com/v1alpha1",
                    "time": NOW,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:status": {"f:claims": {}}},
                }
            ],
        },
        "status": {
            "claims": [
                {"uid": str(uuid.uuid4()), "devices": [f"gpu-{4 * c + g}" for g in range(4)]}
                for c in range(claims)
            ]
        },
    }


def measure(nodes: int, allocations: int) -> dict[str, tuple[float, float, str]]:
    """Per allocation, summed over all watchers: option → (events, bytes, requests/writes)."""
    mem = memory.InMemoryApi(use_default_cel=False)
    mem.put_namespace(NAMESPACE)
    c_events = c_bytes = p_events = p_bytes = m_bytes = get_bytes = 0
    for i in range(allocations):
        claims, pods, read = lifecycle(mem, i, f"node-{i % nodes}")
        kinds = ["ADDED", *["MODIFIED"] * (len(claims) - 2), "DELETED"]
        c_events += len(claims)
        c_bytes += sum(event_bytes(k, c) for k, c in zip(kinds, claims, strict=True))
        kinds = ["ADDED", *["MODIFIED"] * (len(pods) - 2), "DELETED"]
        p_events += len(pods)
        p_bytes += sum(event_bytes(k, p) for k, p in zip(kinds, pods, strict=True))
        m_bytes += sum(event_bytes(k, metadata_only(p)) for k, p in zip(kinds, pods, strict=True))
        get_bytes += len(json.dumps(read, separators=(",", ":")))
    n = float(allocations)
    fan_out = 2 * event_bytes("MODIFIED", node_object("node-0", 3))  # added, then removed
    return {
        "pods": (p_events / n, (p_bytes + get_bytes) / n, "1 claim GET"),
        "node": (p_events / n, (p_bytes + get_bytes) / n, "1 claim GET"),
        "metadata": (p_events / n, m_bytes / n, "— (names no claim)"),
        "claims": (c_events * nodes / n, c_bytes * nodes / n, "0"),
        "fan-out": (
            c_events / n + 2,
            c_bytes / n + fan_out,
            "2 writes (controller)",
        ),
        "prepare": (0.0, 0.0, "0 (learns 0.1-3 s late)"),
    }


READS = {
    "pods": "every Pod of the cluster (list/watch pods, own identity)",
    "node": "its node's Pods only, as its kubelet (constrained impersonation, 1.36)",
    "metadata": "every Pod of the cluster (same verbs as pods)",
    "claims": "every ResourceClaim of the cluster (list/watch resourceclaims)",
    "fan-out": "every node's allocation summary (get/list/watch on the per-node kind)",
    "prepare": "nothing more",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--allocations", type=int, default=20)
    args = parser.parse_args()
    rows = {nodes: measure(nodes, args.allocations) for nodes in args.nodes}
    print(f"# per allocation, summed over every watcher; {args.allocations} allocations")
    head = " | ".join(f"{n:,} nodes: events / KiB" for n in args.nodes)
    print(f"| source | what a compromised GPU node may read | {head} | requests |")
    print("|---|---|" + "---|" * len(args.nodes) + "---|")
    for option in READS:
        cells = " | ".join(
            f"{rows[n][option][0]:,.0f} / {rows[n][option][1] / 1024:,.1f}" for n in args.nodes
        )
        print(f"| {option} | {READS[option]} | {cells} | {rows[args.nodes[0]][option][2]} |")
    print("# plus, per watcher, one list and one watch at start and at every watch timeout")
    return 0


if __name__ == "__main__":
    sys.exit(main())
