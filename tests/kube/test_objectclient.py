"""Generic objects (Pods, Leases, custom kinds) through the real client over real HTTP, against
the in-memory server's generic store: the server semantics their owners rely on."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.kube import api, client
from dra_driver.kube.objectclient import ObjectClient
from dra_driver.kube.objects import COMPUTE_DOMAINS, LEASES, PODS, owner_reference
from dra_driver.testing.fakeapi import fakeserver, memory


@pytest.fixture
def mem() -> memory.InMemoryApi:
    return memory.InMemoryApi()


@pytest.fixture
def objs(mem: memory.InMemoryApi, tmp_path: Path) -> Iterator[ObjectClient]:
    with fakeserver.FakeApiServer(mem) as srv:
        kc = client.KubeClient.connect(srv.write_kubeconfig(tmp_path / "kubeconfig"))
        yield ObjectClient(kc)
        kc.close()


def pod(name: str = "", node: str = "n1", **labels: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": "ns", "labels": labels or {"app": "mps"}}
    meta["name" if name else "generateName"] = name or "mps-"
    return {
        "metadata": meta,
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
        "status": {"phase": "Running"},
    }


def test_create_get_and_already_exists(objs: ObjectClient) -> None:
    made = objs.create(PODS, pod())
    meta = made["metadata"]
    assert meta["name"].startswith("mps-") and len(meta["name"]) == 9
    assert meta["uid"] and meta["resourceVersion"] and made["kind"] == "Pod"
    assert "status" not in made  # a create does not set status
    got = objs.get(PODS, meta["name"], namespace="ns")
    assert got["metadata"]["uid"] == meta["uid"]
    with pytest.raises(api.Conflict) as exc:
        objs.create(PODS, pod(meta["name"]))
    assert exc.value.reason == "AlreadyExists"
    assert f'pods "{meta["name"]}" already exists' in str(exc.value)
    with pytest.raises(api.NotFound, match='pods "nope" not found'):
        objs.get(PODS, "nope", namespace="ns")


def test_strict_schema_refuses_unknown_fields(objs: ObjectClient) -> None:
    bad = pod("p")
    bad["spec"]["nodeNme"] = "n1"
    with pytest.raises(api.Invalid, match='Pod "p" is invalid'):
        objs.create(PODS, bad)
    with pytest.raises(api.NotFound):
        objs.get(PODS, "p", namespace="ns")


def test_selectors_filter_and_bad_field_label_is_400(objs: ObjectClient) -> None:
    objs.create(PODS, pod("a", "n1", app="mps", gpu="0"))
    objs.create(PODS, pod("b", "n2", app="mps", gpu="1"))
    objs.create(PODS, pod("c", "n1", app="other"))
    names = lambda **kw: [o["metadata"]["name"] for o in objs.list(PODS, **kw)[0]]  # noqa: E731
    assert names(namespace="ns", label_selector="app=mps") == ["a", "b"]
    assert names(label_selector="app=mps,gpu in (1,2)") == ["b"]
    assert names(namespace="ns", field_selector="spec.nodeName=n1") == ["a", "c"]
    assert names(namespace="ns", label_selector="!gpu") == ["c"]
    with pytest.raises(api.Invalid, match=r'field label not supported: "spec\.image"'):
        objs.list(PODS, namespace="ns", field_selector="spec.image=x")


def test_update_needs_current_version_and_keeps_status(
    objs: ObjectClient, mem: memory.InMemoryApi
) -> None:
    made = objs.create(PODS, pod("p"))
    ready = {**made, "status": {"phase": "Running"}}
    with_status = objs.update_status(PODS, ready)
    assert with_status["status"] == {"phase": "Running"}
    stale = {**made, "metadata": {**made["metadata"], "labels": {"x": "y"}}}
    with pytest.raises(api.Conflict, match="the object has been modified"):
        objs.update(PODS, stale)
    fresh = {**with_status, "metadata": {**with_status["metadata"], "labels": {"x": "y"}}}
    fresh["status"] = {"phase": "Failed"}  # ignored on the main resource
    updated = objs.update(PODS, fresh)
    assert updated["metadata"]["labels"] == {"x": "y"}
    assert updated["status"] == {"phase": "Running"}
    patched = objs.patch(PODS, "p", {"metadata": {"labels": {"x": None, "z": "1"}}}, namespace="ns")
    assert patched["metadata"]["labels"] == {"z": "1"}
    before = mem.resource_version
    assert objs.patch(PODS, "p", {"metadata": {"labels": {"z": "1"}}}, namespace="ns")
    assert mem.resource_version == before  # a no-op write changes nothing


def test_delete_uid_precondition(objs: ObjectClient) -> None:
    made = objs.create(PODS, pod("p"))
    with pytest.raises(api.Conflict, match="Precondition failed: UID in precondition: other"):
        objs.delete(PODS, "p", namespace="ns", uid="other")
    objs.delete(PODS, "p", namespace="ns", uid=made["metadata"]["uid"])
    with pytest.raises(api.NotFound):
        objs.delete(PODS, "p", namespace="ns")


def test_finalizers_hold_deletion_until_removed(objs: ObjectClient) -> None:
    domain = {
        "metadata": {"name": "d", "namespace": "ns", "finalizers": ["x/cleanup"]},
        "spec": {"numNodes": 2},
    }
    made = objs.create(COMPUTE_DOMAINS, domain)
    objs.delete(COMPUTE_DOMAINS, "d", namespace="ns")
    marked = objs.get(COMPUTE_DOMAINS, "d", namespace="ns")
    assert marked["metadata"]["deletionTimestamp"]
    marked["metadata"]["finalizers"] = []
    objs.update(COMPUTE_DOMAINS, marked)
    with pytest.raises(api.NotFound):
        objs.get(COMPUTE_DOMAINS, "d", namespace="ns")
    assert made["metadata"]["uid"]


def test_owner_gone_collects_dependents(objs: ObjectClient, mem: memory.InMemoryApi) -> None:
    node = mem.put_node("n1")
    lease = objs.create(
        LEASES, {"metadata": {"name": "l", "namespace": "ns"}, "spec": {"holderIdentity": "a"}}
    )
    owned_by_lease = pod("p1")
    owned_by_lease["metadata"]["ownerReferences"] = [owner_reference(lease)]
    objs.create(PODS, owned_by_lease)
    owned_by_node = pod("p2")
    owned_by_node["metadata"]["ownerReferences"] = [owner_reference(node)]
    objs.create(PODS, owned_by_node)
    objs.delete(LEASES, "l", namespace="ns")
    assert [o["metadata"]["name"] for o in objs.list(PODS, namespace="ns")[0]] == ["p2"]
    mem.delete_node("n1")
    assert objs.list(PODS, namespace="ns")[0] == []


def test_watch_from_list_version(objs: ObjectClient) -> None:
    objs.create(PODS, pod("a"))
    _, rv = objs.list(PODS, namespace="ns")
    seen: list[tuple[str, str]] = []

    def follow() -> None:
        for event in objs.watch(
            PODS, namespace="ns", label_selector="app=mps", resource_version=rv, timeout_s=2
        ):
            seen.append((event.type, event.object["metadata"]["name"]))

    thread = threading.Thread(target=follow)
    thread.start()
    objs.create(PODS, pod("b"))
    objs.create(PODS, pod("c", app="other"))
    objs.delete(PODS, "b", namespace="ns")
    thread.join(5)
    assert seen == [("ADDED", "b"), ("DELETED", "b")]


def test_injected_failure_and_dry_run(objs: ObjectClient, mem: memory.InMemoryApi) -> None:
    mem.fail_next("create_pods", 500, message="etcd down")
    with pytest.raises(api.ApiError, match="etcd down") as exc:
        objs.create(PODS, pod("p"))
    assert exc.value.status == 500
    assert mem.objects.create(PODS, {"apiVersion": "v1", "kind": "Pod", **pod("q")}, dry_run=True)
    assert mem.objects.all(PODS) == []
