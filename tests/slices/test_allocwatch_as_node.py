"""The allocation watch acting as its node (the default, ``--allocation-source=node``), over real
HTTP against the fake API server, which refuses what kube-apiserver 1.36 refuses an agent that
impersonates its associated node: any other node, any Pod read without the node's field
selector, and anything but Pod list/watch. Ranks still follow allocations through it, the
claims read are kept for lookup by UID, and a server that refuses the impersonation is reported
once as an error naming what the cluster lacks."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog.testing

from dra_driver import agentparts, logs
from dra_driver.devices import holdings
from dra_driver.kube import api, client, impersonation, objectclient
from dra_driver.kube.objectclient import ObjectClient
from dra_driver.kube.objects import PODS
from dra_driver.pluginsettings import PluginSettings
from dra_driver.slices import allocwatch
from dra_driver.slices.pubtypes import Backoff
from dra_driver.testing.fakeapi import fakeserver, memory
from dra_driver.testing.polling import poll

from .test_allocwatch import DRIVER, bind_pod, gpus_of, held, put_claim, result


@pytest.fixture
def mem() -> memory.InMemoryApi:
    return memory.InMemoryApi(use_default_cel=False)


def connect(mem: memory.InMemoryApi, tmp_path: Path, bound: str) -> Iterator[client.KubeClient]:
    with fakeserver.FakeApiServer(mem, token="agent-token", bound_node=bound) as srv:
        kube = client.KubeClient.connect(srv.write_kubeconfig(tmp_path / "kubeconfig"))
        yield kube
        kube.close()


@pytest.fixture
def kc(mem: memory.InMemoryApi, tmp_path: Path) -> Iterator[client.KubeClient]:
    yield from connect(mem, tmp_path, "n1")


def start_watch(
    kc: client.KubeClient,
    node: str = "n1",
    log: structlog.typing.FilteringBoundLogger | None = None,
) -> allocwatch.AllocationWatch:
    as_node = impersonation.as_node(kc, node)
    w = allocwatch.AllocationWatch(
        objects=ObjectClient(as_node),
        get_claim=kc.get_resource_claim,  # the agent's own identity, as prepare's GET
        node_name=node,
        driver_name=DRIVER,
        gpus_of=gpus_of,
        allocated=holdings.HeldGpus(),
        log=log or logs.get("test"),
        watch_timeout_s=5.0,
        backoff=Backoff(initial_s=0.01, max_s=0.05),
        retry_s=0.02,
        acting_as_node=True,
    )
    w.start()
    return w


def test_ranks_follow_allocations_through_the_node_s_identity(
    mem: memory.InMemoryApi, kc: client.KubeClient
) -> None:
    watch = start_watch(kc)
    try:
        uid = put_claim(mem, "pair", [result("gpu-0"), result("gpu-1")])
        put_claim(mem, "elsewhere", [result("gpu-5", pool="n2")])
        assert poll(lambda: watch.relists == 1)
        bind_pod(mem, "job-0", {"gpus": "pair"})
        bind_pod(mem, "job-1", {"gpus": "elsewhere"}, node="n2")
        assert poll(lambda: held(watch) == {"gpu-0", "gpu-1"})
        found = watch.claim(uid)
        assert found is not None
        assert found.claim["metadata"]["uid"] == uid
        assert (
            found.resource_version
            == mem.get_resource_claim("team", "pair")["metadata"]["resourceVersion"]
        )
        assert watch.failures == 0
        mem.objects.delete(PODS, "job-0", namespace="team")
        assert poll(lambda: held(watch) == frozenset())
        assert watch.claim(uid) is None
    finally:
        watch.stop()


def test_acting_as_the_node_reads_only_the_node_s_pods(
    mem: memory.InMemoryApi, kc: client.KubeClient
) -> None:
    bind_pod(mem, "mine", {})
    bind_pod(mem, "theirs", {}, node="n2")
    objects = ObjectClient(impersonation.as_node(kc, "n1"))
    items, _ = objects.list(PODS, field_selector="spec.nodeName=n1")
    assert [p["metadata"]["name"] for p in items] == ["mine"]
    refused = [
        lambda: objects.list(PODS),  # kubectl get pods -A
        lambda: objects.list(PODS, namespace="team"),
        lambda: objects.list(PODS, field_selector="spec.nodeName=n2"),
        lambda: objects.get(PODS, "theirs", namespace="team"),
        lambda: objects.get(PODS, "mine", namespace="team"),  # get is not granted either
        lambda: ObjectClient(impersonation.as_node(kc, "n2")).list(
            PODS, field_selector="spec.nodeName=n2"
        ),  # another node than the token's
    ]
    for call in refused:
        with pytest.raises(api.ApiError) as err:
            call()
        assert err.value.status == 403
    with pytest.raises(api.ApiError) as err:  # nothing else is granted to the impersonation
        impersonation.as_node(kc, "n1").get_resource_claim("team", "x")
    assert err.value.status == 403
    with pytest.raises(api.ApiError) as err:
        next(iter(objects.watch(PODS, resource_version="", timeout_s=1)))
    assert err.value.status == 403


def test_a_refused_impersonation_is_one_error_naming_what_is_missing(
    mem: memory.InMemoryApi, tmp_path: Path
) -> None:
    connection = connect(mem, tmp_path, "another-node")  # kept: its end closes the server
    kc = next(connection)
    with structlog.testing.capture_logs() as captured:
        watch = start_watch(kc, log=structlog.get_logger())
        try:
            put_claim(mem, "pair", [result("gpu-0"), result("gpu-1")])
            bind_pod(mem, "job-0", {"gpus": "pair"})
            assert poll(lambda: watch.failures >= 5)
            assert held(watch) == frozenset()
        finally:
            watch.stop()
            connection.close()
    errors = [e for e in captured if e["log_level"] == "error"]
    assert len(errors) == 1, captured
    assert "1.36" in errors[0]["hint"] and "allocationSource=pods" in errors[0]["hint"]
    assert "associated-node" in errors[0]["error"]


@pytest.mark.parametrize("source", ["node", "pods"])
def test_the_agent_reads_pods_with_the_identity_its_source_names(
    mem: memory.InMemoryApi, tmp_path: Path, source: str
) -> None:
    """Against a server whose RBAC is the default chart's (the token reads no Pod outside the
    driver's namespace), the agent's default source reads its node's Pods and ``pods`` (the
    agent's own identity) is refused; a server that grants ``pods`` lets that one through."""
    bind_pod(mem, "mine", {})
    settings = PluginSettings(node_name="n1", allocation_source=source)
    for chart_rbac in (True, False):
        with fakeserver.FakeApiServer(
            mem, bound_node="n1", pod_namespaces=("dra-driver",) if chart_rbac else None
        ) as srv:
            kube = client.KubeClient.connect(srv.write_kubeconfig(tmp_path / "kubeconfig"))
            try:
                objects = objectclient.objects_for(agentparts._pod_reader(settings, kube))
                if source == "pods" and chart_rbac:
                    with pytest.raises(api.ApiError) as err:
                        objects.list(PODS, field_selector="spec.nodeName=n1")
                    assert err.value.status == 403
                else:
                    items, _ = objects.list(PODS, field_selector="spec.nodeName=n1")
                    assert [p["metadata"]["name"] for p in items] == ["mine"]
            finally:
                kube.close()
    with pytest.raises(ValueError, match="unknown allocation source"):
        agentparts._pod_reader(PluginSettings(node_name="n1", allocation_source="x"), kube)
