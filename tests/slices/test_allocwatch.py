"""The allocation watch over real HTTP against the fake API server: a claim allocated on this
node counts from the moment its pod is bound (before any prepare), stops counting when the pod
is deleted or finishes, ignores other drivers, pools and admin access, follows template claims,
and survives 410 Gone, failing lists and failing claim reads."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver import logs
from dra_driver.devices import holdings
from dra_driver.kube import client
from dra_driver.kube.objectclient import ObjectClient
from dra_driver.kube.objects import PODS
from dra_driver.slices import allocwatch
from dra_driver.slices.pubtypes import Backoff
from dra_driver.testing.fakeapi import fakeserver, memory
from dra_driver.testing.polling import poll

DRIVER = "gpu.nvidia.com"


def gpus_of(device: str) -> tuple[str, ...]:
    """``gpu-3`` and its MIG devices ``gpu-3-mig-...`` hold ``gpu-3``."""
    parts = device.split("-")
    return (f"{parts[0]}-{parts[1]}",) if device.startswith("gpu-") else ()


@pytest.fixture
def mem() -> memory.InMemoryApi:
    return memory.InMemoryApi(use_default_cel=False)


@pytest.fixture
def kc(mem: memory.InMemoryApi, tmp_path: Path) -> Iterator[client.KubeClient]:
    with fakeserver.FakeApiServer(mem) as srv:
        kube = client.KubeClient.connect(srv.write_kubeconfig(tmp_path / "kubeconfig"))
        yield kube
        kube.close()


@pytest.fixture
def watch(kc: client.KubeClient) -> Iterator[allocwatch.AllocationWatch]:
    w = allocwatch.AllocationWatch(
        objects=ObjectClient(kc),
        get_claim=kc.get_resource_claim,
        node_name="n1",
        driver_name=DRIVER,
        gpus_of=gpus_of,
        allocated=holdings.HeldGpus(),
        log=logs.get("test"),
        watch_timeout_s=5.0,
        backoff=Backoff(initial_s=0.01, max_s=0.05),
        retry_s=0.02,
    )
    w.start()
    yield w
    w.stop()


def put_claim(
    mem: memory.InMemoryApi,
    name: str,
    results: list[dict[str, Any]] | None,
    namespace: str = "team",
) -> str:
    uid = str(uuid.uuid4())
    claim: dict[str, Any] = {
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": {"devices": {"requests": []}},
    }
    if results is not None:
        claim["status"] = {"allocation": {"devices": {"results": results}}}
    mem.put_resource_claim(claim)
    return uid


def result(device: str, *, driver: str = DRIVER, pool: str = "n1", **extra: Any) -> dict[str, Any]:
    return {"request": "gpus", "driver": driver, "pool": pool, "device": device, **extra}


def bind_pod(mem: memory.InMemoryApi, name: str, claims: dict[str, str], node: str = "n1") -> str:
    """A pod bound to ``node`` naming ``claims`` (entry name → claim name, or ``tmpl:<x>`` for
    a template); returns its name."""
    entries = [
        {"name": entry, "resourceClaimTemplateName": ref[5:]}
        if ref.startswith("tmpl:")
        else {"name": entry, "resourceClaimName": ref}
        for entry, ref in claims.items()
    ]
    mem.objects.create(
        PODS,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "team"},
            "spec": {
                "nodeName": node,
                "containers": [{"name": "c", "image": "busybox"}],
                "resourceClaims": entries,
            },
        },
    )
    return name


def set_pod_status(mem: memory.InMemoryApi, name: str, status: dict[str, Any]) -> None:
    pod = mem.objects.get(PODS, name, namespace="team")
    pod["status"] = status
    mem.objects.update_status(PODS, pod)


def held(w: allocwatch.AllocationWatch) -> frozenset[str]:
    return w.allocated.snapshot().held


def test_a_bound_pod_s_claim_counts_until_the_pod_is_deleted(
    mem: memory.InMemoryApi, watch: allocwatch.AllocationWatch
) -> None:
    uid = put_claim(mem, "quad", [result(f"gpu-{i}") for i in range(4)])
    assert poll(lambda: watch.relists == 1)
    bind_pod(mem, "job-0", {"gpus": "quad"})
    assert poll(lambda: held(watch) == {"gpu-0", "gpu-1", "gpu-2", "gpu-3"})
    assert watch.allocated.claims() == {uid: frozenset({"gpu-0", "gpu-1", "gpu-2", "gpu-3"})}
    mem.objects.delete(PODS, "job-0", namespace="team")
    assert poll(lambda: held(watch) == frozenset())


def test_a_finished_pod_frees_its_claims_and_other_nodes_pods_never_count(
    mem: memory.InMemoryApi, watch: allocwatch.AllocationWatch
) -> None:
    put_claim(mem, "pair", [result("gpu-4"), result("gpu-5")])
    put_claim(mem, "theirs", [result("gpu-0", pool="n2")])
    bind_pod(mem, "elsewhere", {"gpus": "theirs"}, node="n2")
    bind_pod(mem, "job", {"gpus": "pair"})
    assert poll(lambda: held(watch) == {"gpu-4", "gpu-5"})
    set_pod_status(mem, "job", {"phase": "Succeeded"})
    assert poll(lambda: held(watch) == frozenset())


def test_only_this_driver_s_devices_in_this_pool_count_and_admin_access_holds_nothing(
    mem: memory.InMemoryApi, watch: allocwatch.AllocationWatch
) -> None:
    put_claim(
        mem,
        "mixed",
        [
            result("gpu-1"),
            result("gpu-2-mig-1g-10gb-0"),
            result("gpu-3", driver="other.example.com"),
            result("gpu-4", pool="n1-other"),
            result("gpu-5", adminAccess=True),
        ],
    )
    bind_pod(mem, "job", {"gpus": "mixed"})
    assert poll(lambda: held(watch) == {"gpu-1", "gpu-2"})


def test_a_template_claim_counts_once_the_pod_status_names_it(
    mem: memory.InMemoryApi, watch: allocwatch.AllocationWatch
) -> None:
    put_claim(mem, "job-gpus-x7k2p", [result("gpu-6")])
    bind_pod(mem, "job", {"gpus": "tmpl:gpus-4"})
    assert poll(lambda: watch.relists == 1)
    assert not poll(lambda: held(watch), timeout_s=0.3)  # no claim name yet
    set_pod_status(
        mem,
        "job",
        {"resourceClaimStatuses": [{"name": "gpus", "resourceClaimName": "job-gpus-x7k2p"}]},
    )
    assert poll(lambda: held(watch) == {"gpu-6"})


def test_a_claim_read_before_its_allocation_is_read_again(
    mem: memory.InMemoryApi, watch: allocwatch.AllocationWatch
) -> None:
    put_claim(mem, "late", None)
    bind_pod(mem, "job", {"gpus": "late"})
    assert poll(lambda: mem.calls and any(c.method == "get_resource_claim" for c in mem.calls))
    put_claim(mem, "late", [result("gpu-7")])
    assert poll(lambda: held(watch) == {"gpu-7"})


def test_failing_claim_reads_are_retried(
    mem: memory.InMemoryApi, watch: allocwatch.AllocationWatch
) -> None:
    put_claim(mem, "flaky", [result("gpu-2")])
    assert poll(lambda: watch.relists == 1)
    mem.fail_next("get_resource_claim", 503, times=3)
    bind_pod(mem, "job", {"gpus": "flaky"})
    assert poll(lambda: held(watch) == {"gpu-2"})
    gets = [c.status for c in mem.calls if c.method == "get_resource_claim"]
    assert gets[:3] == [503, 503, 503] and gets[-1] == 200


def test_410_gone_relists_and_changes_during_the_gap_are_not_lost(
    mem: memory.InMemoryApi, watch: allocwatch.AllocationWatch
) -> None:
    put_claim(mem, "a", [result("gpu-0")])
    put_claim(mem, "b", [result("gpu-1")])
    bind_pod(mem, "pa", {"gpus": "a"})
    assert poll(lambda: held(watch) == {"gpu-0"})
    mem.fail_next("watch_pods", 410, times=1)
    mem.end_watches()  # the open watch ends; the next one is answered 410
    mem.objects.delete(PODS, "pa", namespace="team")
    bind_pod(mem, "pb", {"gpus": "b"})
    assert poll(lambda: held(watch) == {"gpu-1"})
    assert watch.relists >= 2
    assert 410 in [c.status for c in mem.calls if c.method == "watch_pods"]


def test_failing_lists_back_off_and_recover(
    mem: memory.InMemoryApi, watch: allocwatch.AllocationWatch
) -> None:
    put_claim(mem, "a", [result("gpu-3")])
    assert poll(lambda: watch.relists == 1)
    mem.fail_next("list_pods", 0, times=2)  # unreachable twice
    mem.fail_next("watch_pods", 500, times=1)
    mem.end_watches()
    bind_pod(mem, "pa", {"gpus": "a"})
    assert poll(lambda: held(watch) == {"gpu-3"})
    assert watch.failures >= 3


def test_claims_of_reads_direct_and_generated_names_and_skips_finished_pods() -> None:
    pod: dict[str, Any] = {
        "metadata": {"namespace": "ns"},
        "spec": {
            "resourceClaims": [
                {"name": "a", "resourceClaimName": "direct"},
                {"name": "b", "resourceClaimTemplateName": "t"},
                {"name": "c", "resourceClaimTemplateName": "t"},
            ]
        },
        "status": {
            "phase": "Running",
            "resourceClaimStatuses": [{"name": "b", "resourceClaimName": "made-b"}],
        },
    }
    assert allocwatch.claims_of(pod) == (("ns", "direct"), ("ns", "made-b"))
    pod["status"]["phase"] = "Failed"
    assert allocwatch.claims_of(pod) == ()


def test_a_claim_deallocated_while_its_pod_stays_is_freed_at_the_next_resync(
    mem: memory.InMemoryApi, kc: client.KubeClient
) -> None:
    w = allocwatch.AllocationWatch(
        objects=ObjectClient(kc),
        get_claim=kc.get_resource_claim,
        node_name="n1",
        driver_name=DRIVER,
        gpus_of=gpus_of,
        allocated=holdings.HeldGpus(),
        log=logs.get("test"),
        watch_timeout_s=0.3,
        retry_s=0.02,
        resync_s=0.5,
    )
    w.start()
    try:
        put_claim(mem, "quad", [result(f"gpu-{i}") for i in range(4)])
        bind_pod(mem, "job", {"gpus": "quad"})
        assert poll(lambda: len(held(w)) == 4)
        mem.delete_resource_claim("team", "quad")  # the pod stays, its claim is gone
        assert poll(lambda: held(w) == frozenset())
        assert w.relists >= 2
    finally:
        w.stop()
