"""Events (events.k8s.io/v1) in the fake API server: created and listed as the real server does,
refused (422, 400) for what the real server refuses, over HTTP through the real client adapter."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.kube import api, client, objectclient
from dra_driver.kube.objects import EVENTS
from dra_driver.testing.fakeapi import fakeserver, memory


@pytest.fixture
def server() -> Iterator[fakeserver.FakeApiServer]:
    with fakeserver.FakeApiServer(memory.InMemoryApi(), token="s3cret") as srv:
        yield srv


@pytest.fixture
def kube(server: fakeserver.FakeApiServer, tmp_path: Path) -> Iterator[client.KubeClient]:
    kc = client.KubeClient.connect(server.write_kubeconfig(tmp_path / "kubeconfig"))
    yield kc
    kc.close()


def event(name: str = "c1.1", uid: str = "uid-c1", **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": "team"},
        "eventTime": "2026-12-02T05:00:00.123456Z",
        "type": "Warning",
        "reason": "GpuVanished",
        "action": "Rediscover",
        "reportingController": "gpu.nvidia.com",
        "reportingInstance": "n1",
        "regarding": {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "namespace": "team",
            "name": "c1",
            "uid": uid,
        },
        "note": "device gpu-3 lost its GPU",
    }
    base.update(fields)
    return {k: v for k, v in base.items() if v is not None}


def test_an_event_is_created_and_listed_by_what_it_regards(
    server: fakeserver.FakeApiServer, kube: client.KubeClient
) -> None:
    stored = kube.create_event("team", event())
    assert stored["metadata"]["uid"] and stored["metadata"]["resourceVersion"]
    kube.create_event("team", event("c2.1", uid="uid-c2"))
    listed = server.api.list_events("team", field_selector="regarding.uid=uid-c1")
    assert [e["metadata"]["name"] for e in listed] == ["c1.1"]
    assert listed[0]["reason"] == "GpuVanished" and listed[0]["type"] == "Warning"
    warnings = server.api.list_events("team", field_selector="type=Warning,reason=GpuVanished")
    assert len(warnings) == 2
    assert server.api.list_events("other") == []
    # Listed over HTTP too, as kubectl get events --field-selector does.
    objects = objectclient.ObjectClient(kube)
    items, _ = objects.list(EVENTS, namespace="team", field_selector="regarding.uid=uid-c2")
    assert [e["metadata"]["name"] for e in items] == ["c2.1"]
    with pytest.raises(api.Invalid, match="field label not supported") as bad:
        objects.list(EVENTS, namespace="team", field_selector="spec.foo=1")
    assert bad.value.status == 400


def test_the_same_name_twice_is_already_exists(kube: client.KubeClient) -> None:
    kube.create_event("team", event())
    with pytest.raises(api.Conflict) as second:
        kube.create_event("team", event())
    assert second.value.reason == "AlreadyExists"


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"reportingController": None}, "reportingController: Required value"),
        ({"reportingController": "not a name!"}, "reportingController: Invalid value"),
        ({"reportingInstance": None}, "reportingInstance: Required value"),
        ({"action": None}, "action: Required value"),
        ({"reason": None}, "reason: Required value"),
        ({"eventTime": None}, "eventTime: Required value"),
        ({"type": "Error"}, "type: Invalid value"),
        ({"reason": "x" * 129}, "reason: Invalid value"),
        ({"note": "x" * 1025}, "note: Invalid value"),
        ({"deprecatedCount": 3}, "deprecatedCount: Invalid value"),
        ({"metadata": {"name": "Not_A_Name", "namespace": "team"}}, "metadata.name"),
        ({"unknownField": 1}, "unknownField"),  # strict schema, as for every kind
    ],
)
def test_an_event_the_server_would_refuse_is_a_422(
    server: fakeserver.FakeApiServer, kube: client.KubeClient, fields: dict[str, Any], needle: str
) -> None:
    with pytest.raises(api.Invalid) as refused:
        kube.create_event("team", event(**fields))
    assert refused.value.status == 422 and needle in str(refused.value)
    assert 'Event.events.k8s.io "' in str(refused.value)
    assert server.api.list_events("team") == []


def test_an_event_must_name_the_namespace_of_what_it_regards(kube: client.KubeClient) -> None:
    regarding = copy.deepcopy(event()["regarding"])
    del regarding["namespace"]
    with pytest.raises(api.Invalid, match=r"regarding\.namespace.*does not match") as refused:
        kube.create_event("team", event(regarding=regarding))
    assert refused.value.status == 422
    # In "default" (cluster-scoped objects' events) it may be left out.
    kube.create_event("default", event(metadata={"name": "n.1"}, regarding=regarding))


def test_an_event_for_another_namespace_than_the_path_is_a_400(
    server: fakeserver.FakeApiServer, kube: client.KubeClient
) -> None:
    with pytest.raises(api.Invalid) as refused:
        kube.create_event("elsewhere", event())
    assert refused.value.status == 400 and "does not match the namespace" in str(refused.value)
    with pytest.raises(api.Invalid) as in_memory:  # the in-process fake says the same
        server.api.create_event("elsewhere", event())
    assert in_memory.value.status == 400
