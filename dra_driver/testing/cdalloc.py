"""ComputeDomain test kit, part one: fake NVL nodes of any clique, and claims from templates
allocated as kube-scheduler would allocate them.

Why it exists: the tests and the demo need nodes in *different* NVLink cliques (the built-in
``gb200-nvl`` profile is one clique) and claims allocated against the ``compute-domain`` slices
the agents really published, with the shipped DeviceClasses' CEL — the structured-parameters
allocator (:mod:`dra_driver.allocation`) plays the scheduler, so a class that selected the
wrong device would fail here as it would in a cluster.
"""

from __future__ import annotations

import uuid
from typing import Any

import yaml

from dra_driver import computedomain as cd
from dra_driver.allocation import allocator, pools
from dra_driver.computedomain import deviceclasses
from dra_driver.devices.fake import profiles
from dra_driver.testing.fakeapi import memory

CLUSTER_UUID = "3f2a8c1e-5b7d-4e90-a1c2-6d8e9f0a1b2c"


class Unschedulable(Exception):
    """The allocator found no device for the claim on that node (the message says why)."""


def nvl_profile(clique_id: int) -> profiles.Profile:
    """The ``gb200-nvl`` profile with its GPUs in fabric clique ``clique_id``."""
    text = profiles.dump(profiles.load_builtin("gb200-nvl"))
    text["name"] = f"gb200-nvl-clique-{clique_id}"
    text["defaults"]["fabric"]["cliqueId"] = clique_id
    return profiles.parse(yaml.safe_dump(text), source=text["name"])


def clique_label(clique_id: int) -> str:
    return f"{CLUSTER_UUID}.{clique_id}"


def allocate(
    api: memory.InMemoryApi, template: dict[str, Any], *, name: str, node: str, pod: str = ""
) -> dict[str, Any]:
    """Create a claim from ``template`` in its namespace and allocate it on ``node`` (the
    node's compute-domain slice, devices no other claim holds); reserved for ``pod``."""
    namespace = template["metadata"]["namespace"]
    created = api.create_resource_claim(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": template["spec"]["spec"],
        }
    )
    slices, _ = api.list_resource_slices(driver=cd.DRIVER_NAME, node_name=node)
    with api._lock:
        used = pools.allocated_ids(
            [c for c in api._claims.values() if c["metadata"]["uid"] != created["metadata"]["uid"]]
        )
    outcome = allocator.allocate(
        created, slices=slices, classes=deviceclasses.load_all(), node_name=node, allocated=used
    )
    if outcome.allocation is None:
        api.delete_resource_claim(namespace, name)
        raise Unschedulable(
            f"claim {namespace}/{name} on {node}: " + "; ".join(outcome.explanation)
        )
    status = {
        "allocation": outcome.allocation,
        "reservedFor": [{"resource": "pods", "name": pod or name, "uid": str(uuid.uuid4())}],
    }
    return api.put_resource_claim({**created, "status": status})
