"""Helpers for the ComputeDomain tests: an in-memory cluster with the CRD, domains, claims
allocated as the scheduler would, and a node driver per fake NVL node."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import structlog

from dra_driver import computedomain as cd
from dra_driver.computedomain import api as cdapi
from dra_driver.computedomain import cdslices, controller, manifests, nodedriver
from dra_driver.devices.fake import FakeBackend
from dra_driver.driver import cdi, claims
from dra_driver.kube.objects import COMPUTE_DOMAINS, RESOURCE_CLAIM_TEMPLATES
from dra_driver.testing import cdalloc
from dra_driver.testing.fakeapi import memory

NS = "team"
DRIVER_NS = "dra-driver"
LOG = structlog.get_logger()


def cluster() -> memory.InMemoryApi:
    mem = memory.InMemoryApi()
    cdapi.register(mem.objects)
    mem.put_namespace(NS)
    mem.put_namespace(DRIVER_NS)
    return mem


def domain(
    mem: memory.InMemoryApi, name: str = "job", *, num_nodes: int = 2, mode: str = ""
) -> dict[str, Any]:
    channel: dict[str, Any] = {"resourceClaimTemplate": {"name": f"{name}-channel"}}
    if mode:
        channel["allocationMode"] = mode
    obj = {
        "apiVersion": cd.API_VERSION,
        "kind": "ComputeDomain",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"numNodes": num_nodes, "channel": channel},
    }
    mem.objects.create(COMPUTE_DOMAINS, obj)
    reconcile(mem)
    return mem.objects.get(COMPUTE_DOMAINS, name, namespace=NS)


def control(mem: memory.InMemoryApi) -> controller.Controller:
    return controller.Controller(
        mem.objects, settings=manifests.Settings(namespace=DRIVER_NS), log=LOG
    )


def reconcile(mem: memory.InMemoryApi) -> None:
    control(mem).reconcile_all()


def claim(
    mem: memory.InMemoryApi, template: str, name: str, node: str, *, namespace: str = NS
) -> claims.ClaimRef:
    """A claim from ``template`` allocated on ``node`` (channel-0 or daemon-0)."""
    tmpl = mem.objects.get(RESOURCE_CLAIM_TEMPLATES, template, namespace=namespace)
    obj = cdalloc.allocate(mem, tmpl, name=name, node=node)
    meta = obj["metadata"]
    return claims.ClaimRef(uid=meta["uid"], namespace=meta["namespace"], name=meta["name"])


class Crash(BaseException):
    """The process "dies" here (nothing after it runs, no except clause catches it)."""


def node_driver(
    mem: memory.InMemoryApi,
    base: Path,
    node: str,
    *,
    clique_id: int = 32766,
    ip: str = "",
    crash_at: str = "",
    major: int | None = None,
) -> nodedriver.NodeDriver:
    if node not in {n["metadata"]["name"] for n in mem._nodes.values()}:
        mem.put_node(node, uid=str(uuid.uuid4()))
    devices = FakeBackend(cdalloc.nvl_profile(clique_id)).discover()
    clique = cdslices.clique_of(devices)
    published, _ = mem.list_resource_slices(driver=cd.DRIVER_NAME, node_name=node)
    if not published:  # what the agent's publisher would have done
        for obj in cdslices.desired(node, clique):
            mem.put_resource_slice(obj)

    def crash(step: str) -> None:
        if step == crash_at:
            raise Crash(step)

    return nodedriver.NodeDriver(
        kube=mem,
        objects=mem.objects,
        node_name=node,
        node_ip=ip or f"10.0.0.{abs(hash(node)) % 200 + 1}",
        clique=clique,
        plugin_dir=base / node / "plugin",
        specs=cdi.CdiSpecs(
            root=base / node / "cdi", driver_name=cd.DRIVER_NAME, host=cdi.HostDevices()
        ),
        imex_port=50000,
        channel_major=lambda: major,
        log=LOG,
        crash=crash,
    )


def label(mem: memory.InMemoryApi, node: str) -> str | None:
    value = mem.get_node(node)["metadata"].get("labels", {}).get(cd.NODE_LABEL)
    return str(value) if value is not None else None


def entries(mem: memory.InMemoryApi, name: str = "job") -> dict[str, str]:
    obj = mem.objects.get(COMPUTE_DOMAINS, name, namespace=NS)
    return {n.name: n.status for n in cdapi.Domain.from_obj(obj).nodes}
