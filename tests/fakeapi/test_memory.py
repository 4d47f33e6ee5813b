"""The in-memory API behaves like the API server where the driver depends on it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from dra_driver.kube import api
from dra_driver.testing.fakeapi import memory

SliceFactory = Callable[..., dict[str, Any]]


def test_resource_version_is_one_global_counter(
    mem: memory.InMemoryApi, make_slice: SliceFactory
) -> None:
    mem.put_node("n1")
    a = mem.create_resource_slice(make_slice("a"))
    b = mem.create_resource_slice(make_slice("b"))
    assert int(b["metadata"]["resourceVersion"]) == int(a["metadata"]["resourceVersion"]) + 1
    _, list_rv = mem.list_resource_slices(driver="gpu.nvidia.com", node_name="n1")
    assert list_rv == b["metadata"]["resourceVersion"] == mem.resource_version
    assert a["metadata"]["uid"] != b["metadata"]["uid"]
    assert a["metadata"]["generation"] == 1 and a["metadata"]["creationTimestamp"]


def test_create_of_an_existing_name_is_409_already_exists(
    mem: memory.InMemoryApi, make_slice: SliceFactory
) -> None:
    mem.create_resource_slice(make_slice())
    with pytest.raises(api.Conflict) as info:
        mem.create_resource_slice(make_slice())
    assert info.value.status == 409 and info.value.reason == "AlreadyExists"
    assert "already exists" in str(info.value)


def test_stale_update_is_409_and_current_one_bumps_generation_only_on_spec_change(
    mem: memory.InMemoryApi, make_slice: SliceFactory
) -> None:
    first = mem.create_resource_slice(make_slice())
    changed = make_slice(devices=["gpu-0", "gpu-1"])
    changed["metadata"]["resourceVersion"] = first["metadata"]["resourceVersion"]
    second = mem.update_resource_slice(changed)
    assert second["metadata"]["generation"] == 2
    assert second["metadata"]["uid"] == first["metadata"]["uid"]
    with pytest.raises(api.Conflict, match="the object has been modified"):
        mem.update_resource_slice(changed)  # still carries the first resourceVersion
    labelled = dict(second, metadata={**second["metadata"], "labels": {"a": "b"}})
    third = mem.update_resource_slice(labelled)
    assert third["metadata"]["generation"] == 2  # metadata only: no generation bump
    assert third["metadata"]["resourceVersion"] != second["metadata"]["resourceVersion"]


def test_update_that_changes_nothing_is_a_no_op(
    mem: memory.InMemoryApi, make_slice: SliceFactory
) -> None:
    first = mem.create_resource_slice(make_slice())
    again = mem.update_resource_slice(first)
    assert again["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    events = list(
        mem.watch_resource_slices(
            driver="",
            node_name="",
            resource_version=first["metadata"]["resourceVersion"],
            timeout_s=0.05,
        )
    )
    assert events == []


def test_immutable_fields_and_unknown_slices(
    mem: memory.InMemoryApi, make_slice: SliceFactory
) -> None:
    with pytest.raises(api.NotFound):
        mem.update_resource_slice(make_slice())
    with pytest.raises(api.NotFound):
        mem.delete_resource_slice("nope")
    mem.create_resource_slice(make_slice())
    moved = make_slice(node="n2")
    moved["spec"]["pool"]["name"] = "n1"
    with pytest.raises(
        api.Invalid, match=r"spec\.nodeName: Invalid value: \"n2\": field is immutable"
    ):
        mem.update_resource_slice(moved)


def test_delete_precondition(mem: memory.InMemoryApi, make_slice: SliceFactory) -> None:
    created = mem.create_resource_slice(make_slice())
    with pytest.raises(
        api.Conflict, match="Precondition failed: ResourceVersion in precondition: 999"
    ):
        mem.delete_resource_slice(created["metadata"]["name"], resource_version="999")
    mem.delete_resource_slice(
        created["metadata"]["name"], resource_version=created["metadata"]["resourceVersion"]
    )
    assert mem.all_resource_slices() == []


def test_generate_name(mem: memory.InMemoryApi, make_slice: SliceFactory) -> None:
    obj = make_slice()
    obj["metadata"] = {"generateName": "n1-gpu.nvidia.com-"}
    names = {mem.create_resource_slice(obj)["metadata"]["name"] for _ in range(20)}
    assert len(names) == 20
    assert all(
        n.startswith("n1-gpu.nvidia.com-") and len(n) == len("n1-gpu.nvidia.com-") + 5
        for n in names
    )


def test_list_uses_both_field_selectors(mem: memory.InMemoryApi, make_slice: SliceFactory) -> None:
    mem.create_resource_slice(make_slice("mine"))
    mem.create_resource_slice(make_slice("other-node", node="n2"))
    mem.create_resource_slice(make_slice("other-driver", driver="net.example.com"))
    items, _ = mem.list_resource_slices(driver="gpu.nvidia.com", node_name="n1")
    assert [s["metadata"]["name"] for s in items] == ["mine"]


def test_watch_delivers_every_change_after_a_resource_version(
    mem: memory.InMemoryApi, make_slice: SliceFactory
) -> None:
    start = mem.create_resource_slice(make_slice("a"))["metadata"]["resourceVersion"]
    stream = mem.watch_resource_slices(
        driver="gpu.nvidia.com", node_name="n1", resource_version=start, timeout_s=2.0
    )

    def writer() -> None:
        time.sleep(0.05)
        created = mem.create_resource_slice(make_slice("b"))
        mem.create_resource_slice(make_slice("elsewhere", node="n2"))  # filtered out
        changed = make_slice("b", devices=["gpu-1"])
        changed["metadata"]["resourceVersion"] = created["metadata"]["resourceVersion"]
        mem.update_resource_slice(changed)
        mem.delete_resource_slice("a")
        mem.end_watches()

    thread = threading.Thread(target=writer)
    thread.start()
    seen = [(e.type, e.object["metadata"]["name"]) for e in stream]
    thread.join()
    assert seen == [("ADDED", "b"), ("MODIFIED", "b"), ("DELETED", "a")]


def test_watch_from_zero_lists_first_and_ends_at_timeout(
    mem: memory.InMemoryApi, make_slice: SliceFactory
) -> None:
    mem.create_resource_slice(make_slice("a"))
    began = time.monotonic()
    events = list(
        mem.watch_resource_slices(
            driver="gpu.nvidia.com", node_name="n1", resource_version="", timeout_s=0.2
        )
    )
    assert [e.type for e in events] == ["ADDED"]
    assert 0.15 < time.monotonic() - began < 2.0


def test_watch_from_a_compacted_resource_version_is_410(make_slice: SliceFactory) -> None:
    mem = memory.InMemoryApi(history=3)
    first = mem.create_resource_slice(make_slice("a"))["metadata"]["resourceVersion"]
    for i in range(5):
        mem.create_resource_slice(make_slice(f"s{i}"))
    events = list(
        mem.watch_resource_slices(driver="", node_name="", resource_version=first, timeout_s=0.1)
    )
    assert [e.type for e in events] == ["ERROR"]
    assert events[0].object["code"] == 410 and events[0].object["reason"] == "Expired"


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (500, api.ApiError),
        (503, api.ApiError),
        (409, api.Conflict),
        (0, api.ApiError),
        (404, api.NotFound),
        (422, api.Invalid),
    ],
)
def test_injected_failures(
    mem: memory.InMemoryApi, make_slice: SliceFactory, status: int, error: type[api.ApiError]
) -> None:
    mem.fail_next("create_resource_slice", status, times=2)
    for _ in range(2):
        with pytest.raises(error) as info:
            mem.create_resource_slice(make_slice())
        assert info.value.status == status
    mem.create_resource_slice(make_slice())  # the third call goes through
    assert [c.status for c in mem.calls] == [status, status, 201]
    assert mem.writes == 3
    assert info.value.retriable == (status in (0, 409) or status >= 500)


def test_wildcard_failure_and_reads_are_not_writes(
    mem: memory.InMemoryApi, make_slice: SliceFactory
) -> None:
    mem.put_node("n1")
    mem.fail_next("*", 503)
    with pytest.raises(api.ApiError):
        mem.get_node("n1")
    mem.get_node("n1")
    mem.list_resource_slices(driver="gpu.nvidia.com", node_name="n1")
    assert mem.writes == 0
    mem.put_resource_slice(make_slice())  # a helper: another client's write, not counted
    assert mem.writes == 0 and len(mem.all_resource_slices()) == 1


def test_claims_nodes_and_namespaces(mem: memory.InMemoryApi, make_slice: SliceFactory) -> None:
    with pytest.raises(api.NotFound, match=r'resourceclaims\.resource\.k8s\.io "c" not found'):
        mem.get_resource_claim("default", "c")
    claim = mem.put_resource_claim(
        {
            "metadata": {"name": "c", "namespace": "ns1", "uid": "u-1"},
            "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "x"}}]}},
            "status": {"allocation": {"devices": {"results": []}}},
        }
    )
    got = mem.get_resource_claim("ns1", "c")
    assert got == claim and got["metadata"]["uid"] == "u-1"
    assert got["spec"]["devices"]["requests"][0]["exactly"]["count"] == 1
    with pytest.raises(api.NotFound, match='namespaces "nowhere" not found'):
        mem.create_resource_claim(
            {"metadata": {"name": "c", "namespace": "nowhere"}, "spec": {"devices": {}}}
        )
    with pytest.raises(api.NotFound, match='nodes "n1" not found'):
        mem.get_node("n1")


def test_deleting_the_node_collects_its_slices(
    mem: memory.InMemoryApi, make_slice: SliceFactory
) -> None:
    node = mem.put_node("n1", uid="node-uid-1")
    owned = make_slice("owned")
    owned["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": node["metadata"]["uid"]}
    ]
    mem.create_resource_slice(owned)
    mem.create_resource_slice(make_slice("unowned"))
    mem.delete_node("n1")
    assert [s["metadata"]["name"] for s in mem.all_resource_slices()] == ["unowned"]


def test_owner_references_are_validated(mem: memory.InMemoryApi, make_slice: SliceFactory) -> None:
    obj = make_slice()
    obj["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": "n1"}]
    with pytest.raises(api.Invalid, match=r"metadata\.ownerReferences\[0\]\.uid"):
        mem.create_resource_slice(obj)


def test_taints_get_time_added_and_keep_it(
    mem: memory.InMemoryApi, make_slice: SliceFactory
) -> None:
    obj = make_slice()
    obj["spec"]["devices"][0]["taints"] = [{"key": "gpu.nvidia.com/xid", "effect": "NoSchedule"}]
    created = mem.create_resource_slice(obj)
    stamp = created["spec"]["devices"][0]["taints"][0]["timeAdded"]
    assert stamp.endswith("Z")
    obj["metadata"]["resourceVersion"] = created["metadata"]["resourceVersion"]
    obj["metadata"]["labels"] = {"x": "y"}
    updated = mem.update_resource_slice(obj)
    assert updated["spec"]["devices"][0]["taints"][0]["timeAdded"] == stamp


def test_concurrent_writers_get_distinct_resource_versions(
    mem: memory.InMemoryApi, make_slice: SliceFactory
) -> None:
    versions: list[str] = []
    lock = threading.Lock()

    def writer(i: int) -> None:
        for j in range(25):
            rv = mem.create_resource_slice(make_slice(f"s-{i}-{j}"))["metadata"]["resourceVersion"]
            with lock:
                versions.append(rv)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(versions)) == 200 and len(mem.all_resource_slices()) == 200
