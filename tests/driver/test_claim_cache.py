"""Prepare takes its claim from the allocation watch only when that copy is provably current
(dra_driver.slices.claimcache), and GETs it otherwise: a claim re-created under the same name
(new UID), deallocated and re-allocated for another pod, whose holder is leaving, or read before
a gap in the watch is read again, and the claim is prepared as the server has it now.

The watch is driven by hand here (no threads): the test decides exactly which pod events it has
seen and which claims it has read, so "the server changed, the watch has not seen it yet" is a
fixed state, not a race."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dra_driver import agentparts, logs
from dra_driver.devices import holdings
from dra_driver.kube import api, client
from dra_driver.kube.objects import PODS
from dra_driver.slices import allocwatch, claimcache
from dra_driver.testing.fakeapi import fakeserver
from dra_driver.testing.polling import poll

from .conftest import DRIVER, NODE, Node, build, claim_obj, ref_of


def pod(name: str, claim: str, **meta: Any) -> dict[str, Any]:
    """A pod of this node naming ``claim``."""
    return {
        "metadata": {"name": name, "namespace": "default", "uid": str(uuid.uuid4()), **meta},
        "spec": {"nodeName": NODE, "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}]},
        "status": {"phase": "Pending"},
    }


def reserved(obj: dict[str, Any], *pods: dict[str, Any]) -> dict[str, Any]:
    obj["status"]["reservedFor"] = [
        {"resource": "pods", "name": p["metadata"]["name"], "uid": p["metadata"]["uid"]}
        for p in pods
    ]
    return obj


class Objects:
    """The watch's Pod source: lists ``pods`` once, then every list and watch fails."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods, self.lists = pods, 0

    def list(self, kind: Any, **_: Any) -> tuple[list[dict[str, Any]], str]:
        self.lists += 1
        if self.lists > 1:
            raise api.ApiError(503, "unavailable")
        return self.pods, "1"

    def watch(self, kind: Any, **_: Any) -> Any:
        raise api.ApiError(500, "watch broke")


def watch_for(node: Node, pods: list[dict[str, Any]]) -> allocwatch.AllocationWatch:
    """A watch that has listed ``pods`` and read every claim they name (not started)."""
    w = allocwatch.AllocationWatch(
        objects=Objects(pods),  # type: ignore[arg-type]
        get_claim=node.api.get_resource_claim,
        node_name=NODE,
        driver_name=DRIVER,
        gpus_of=lambda device: (device,),
        allocated=holdings.HeldGpus(),
        log=logs.get("test"),
    )
    w._reset(pods)
    read_due(w)
    return w


def read_due(w: allocwatch.AllocationWatch) -> None:
    """Run the claim reads the watch has queued (what its reader thread does)."""
    while w._due:
        _, _, key, attempt = w._due.pop(0)
        w._read(key, attempt)


def use(node: Node, w: allocwatch.AllocationWatch) -> claimcache.ClaimCache:
    cache = claimcache.ClaimCache(watch=w, driver_name=DRIVER, pool=NODE)
    node.driver.state.cached_claim = cache.current
    return cache


def gets(node: Node, name: str) -> int:
    return sum(1 for c in node.api.calls if c.method == "get_resource_claim" and c.name == name)


def prepared(node: Node, obj: dict[str, Any]) -> list[str] | str:
    result = node.driver.prepare([ref_of(obj)])[obj["metadata"]["uid"]]
    return result.error or [d.device_name for d in result.devices]


def test_a_claim_the_watch_read_for_its_live_holder_is_prepared_without_a_get(node: Node) -> None:
    holder = pod("job", "c")
    obj = reserved(claim_obj(name="c", uid=str(uuid.uuid4()), devices=["gpu-0"]), holder)
    node.add(obj)
    cache = use(node, watch_for(node, [holder]))
    before = gets(node, "c")
    assert prepared(node, obj) == ["gpu-0"]
    assert gets(node, "c") == before  # no GET: the watch's copy
    assert (cache.hits, dict(cache.misses)) == (1, {})
    assert [p.name for p in node.cdi_root.glob("*.json")]  # really prepared: a CDI spec


def test_a_claim_re_created_under_the_same_name_is_read_again(node: Node) -> None:
    holder = pod("job", "c")
    old = reserved(claim_obj(name="c", uid=str(uuid.uuid4()), devices=["gpu-0"]), holder)
    node.add(old)
    cache = use(node, watch_for(node, [holder]))
    # Deleted and created again, allocated elsewhere: the watch still holds the old one.
    new = reserved(claim_obj(name="c", uid=str(uuid.uuid4()), devices=["gpu-1"]), holder)
    node.add(new)
    before = gets(node, "c")
    assert prepared(node, new) == ["gpu-1"]  # the kubelet names the new UID: a GET
    assert gets(node, "c") == before + 1
    assert cache.hits == 0 and cache.misses["not read"] == 1


def test_a_claim_deallocated_and_re_allocated_for_another_pod_is_read_again(node: Node) -> None:
    first = pod("first", "c")
    uid = str(uuid.uuid4())
    node.add(reserved(claim_obj(name="c", uid=uid, devices=["gpu-0"]), first))
    w = watch_for(node, [first])
    cache = use(node, w)
    # On the server: the first pod goes, the claim is deallocated, then allocated again (another
    # GPU) for a second pod bound here. The watch has seen the pods, not read the claim again.
    second = pod("second", "c")
    again = reserved(claim_obj(name="c", uid=uid, devices=["gpu-2"]), second)
    node.add(again)
    w._set_pod(first["metadata"]["uid"], ())
    w._set_pod(second["metadata"]["uid"], allocwatch.claims_of(second))
    before = gets(node, "c")
    assert prepared(node, again) == ["gpu-2"]  # never gpu-0, the watch's stale copy
    assert gets(node, "c") == before + 1
    assert cache.misses["not read"] == 1


def test_a_claim_whose_holder_is_leaving_is_read_again(node: Node) -> None:
    holder, later = pod("job", "c"), pod("later", "c")
    uid = str(uuid.uuid4())
    node.add(reserved(claim_obj(name="c", uid=uid, devices=["gpu-3"]), holder))
    w = watch_for(node, [holder])
    cache = use(node, w)
    # The holder is being deleted (its claim may be released any moment); another pod names the
    # claim but was not reserved when the watch read it. The server moved on: deallocated.
    w._set_pod(holder["metadata"]["uid"], allocwatch.claims_of(holder), True)
    w._set_pod(later["metadata"]["uid"], allocwatch.claims_of(later))
    gone = claim_obj(name="c", uid=uid, allocated=False)
    node.add(gone)
    assert w.claim(uid) is not None  # still held: the claim is named by a live pod
    error = prepared(node, gone)
    assert isinstance(error, str) and "not allocated" in error  # the server's answer, via GET
    assert cache.misses["no holder"] == 1 and cache.hits == 0


def test_after_a_gap_in_the_watch_every_claim_is_read_again(node: Node) -> None:
    holder = pod("job", "c")
    uid = str(uuid.uuid4())
    node.add(reserved(claim_obj(name="c", uid=uid, devices=["gpu-4"]), holder))
    w = watch_for(node, [holder])
    cache = use(node, w)
    assert cache.current(ref_of(node.api.get_resource_claim("default", "c"))) is not None
    # The watch breaks (and cannot list again): anything may have changed since.
    thread_loop(w)
    again = claim_obj(name="c", uid=uid, devices=["gpu-5"])
    node.add(reserved(again, holder))
    assert prepared(node, again) == ["gpu-5"]
    assert cache.misses["not synced"] == 1


def thread_loop(w: allocwatch.AllocationWatch) -> None:
    """One failing turn of the watch loop (its watch call fails), then stop."""
    w._stop.clear()
    original = w._follow

    def follow(selector: str, rv: str) -> str | None:
        w._stop.set()
        return original(selector, rv)

    w._follow = follow  # type: ignore[method-assign]
    w._watch_loop()
    assert w.failures == 1


def test_a_silent_watch_is_not_trusted(node: Node) -> None:
    holder = pod("job", "c")
    obj = reserved(claim_obj(name="c", uid=str(uuid.uuid4()), devices=["gpu-6"]), holder)
    node.add(obj)
    w = watch_for(node, [holder])
    cache = use(node, w)
    assert cache.current(ref_of(obj)) is not None
    w._heard -= w.watch_timeout_s + claimcache.SILENCE_S + 1  # nothing heard for that long
    assert prepared(node, obj) == ["gpu-6"]
    assert cache.misses["not synced"] == 1


@pytest.mark.parametrize("source", ["node", "pods"])
def test_the_agent_s_watch_serves_prepare_with_either_allocation_source(
    node_factory: Callable[..., Node], tmp_path: Path, source: str
) -> None:
    """End to end over HTTP, as the agent wires it (``--allocation-source``): the watch reads
    the claim when its pod is bound, and the prepare that follows makes no GET of its own."""
    node = node_factory(allocation_source=source)
    mem = node.api
    with fakeserver.FakeApiServer(mem, bound_node=NODE) as srv:
        kube = client.KubeClient.connect(srv.write_kubeconfig(tmp_path / "kubeconfig"))
        driver = build(node.settings, kube)  # type: ignore[arg-type]
        settings = dataclasses.replace(node.settings, publish=True)
        w = agentparts.start_allocation_watch(settings, api=kube, driver=driver, log=logs.get("t"))
        assert w is not None
        try:
            spec = pod("job", "c")["spec"] | {"containers": [{"name": "c", "image": "busybox"}]}
            meta = {"name": "job", "namespace": "default"}
            mem.objects.create(
                PODS, {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
            )
            bound = mem.objects.get(PODS, "job", namespace="default")
            obj = reserved(claim_obj(name="c", uid=str(uuid.uuid4()), devices=["gpu-7"]), bound)
            mem.put_resource_claim(obj)
            assert poll(lambda: w.claim(obj["metadata"]["uid"]) is not None)
            before = gets(node, "c")
            result = driver.prepare([ref_of(obj)])[obj["metadata"]["uid"]]
            assert [d.device_name for d in result.devices] == ["gpu-7"], result.error
            assert gets(node, "c") == before
        finally:
            w.stop()
            driver.close()
            kube.close()
