"""PATCH of a Node in the in-memory API, held to what kube-apiserver does with a merge patch."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from dra_driver.kube import api
from dra_driver.testing.fakeapi import fakeserver, memory, nodes


@pytest.fixture
def mem() -> memory.InMemoryApi:
    m = memory.InMemoryApi(use_default_cel=False)
    m.put_node("n1", uid="uid-n1", labels={"kubernetes.io/hostname": "n1", "team": "a"})
    return m


def labels_of(mem: memory.InMemoryApi, name: str = "n1") -> dict[str, str]:
    found: dict[str, str] = mem.get_node(name)["metadata"]["labels"]
    return found


def test_merge_patch_adds_changes_and_removes(mem: memory.InMemoryApi) -> None:
    before = mem.get_node("n1")["metadata"]["resourceVersion"]
    node = mem.patch_node(
        "n1",
        {
            "metadata": {
                "labels": {"nvidia.com/gpu.count": "8", "team": "b", "gone": None},
                "annotations": {"gpu.nvidia.com/node-labels": "nvidia.com/gpu.count"},
            }
        },
    )
    assert node["metadata"]["labels"] == {
        "kubernetes.io/hostname": "n1",
        "team": "b",
        "nvidia.com/gpu.count": "8",
    }
    assert node["metadata"]["annotations"] == {"gpu.nvidia.com/node-labels": "nvidia.com/gpu.count"}
    assert int(node["metadata"]["resourceVersion"]) > int(before)
    mem.patch_node("n1", {"metadata": {"labels": {"team": None}}})
    assert "team" not in labels_of(mem)


def test_a_patch_that_changes_nothing_keeps_the_resource_version(mem: memory.InMemoryApi) -> None:
    rv = mem.get_node("n1")["metadata"]["resourceVersion"]
    mem.patch_node("n1", {"metadata": {"labels": {"team": "a", "absent": None}}})
    assert mem.get_node("n1")["metadata"]["resourceVersion"] == rv
    assert [c.method for c in mem.calls].count("patch_node") == 1  # still one call answered


def test_preconditions_in_the_patch(mem: memory.InMemoryApi) -> None:
    rv = mem.get_node("n1")["metadata"]["resourceVersion"]
    mem.patch_node("n1", {"metadata": {"resourceVersion": rv, "labels": {"x": "1"}}})
    with pytest.raises(api.Conflict, match='on nodes "n1": the object has been modified'):
        mem.patch_node("n1", {"metadata": {"resourceVersion": rv, "labels": {"x": "2"}}})
    with pytest.raises(api.Conflict, match="UID in precondition: other"):
        mem.patch_node("n1", {"metadata": {"uid": "other"}})
    assert labels_of(mem)["x"] == "1"


def test_server_owned_fields_and_status_stay(mem: memory.InMemoryApi) -> None:
    old = mem.get_node("n1")
    mem.patch_node(
        "n1",
        {
            "metadata": {"creationTimestamp": "1999-01-01T00:00:00Z", "generation": 99},
            "status": {"capacity": {"nvidia.com/gpu": "100"}},
            "spec": {"unschedulable": True},
        },
    )
    new = mem.get_node("n1")
    assert new["metadata"]["creationTimestamp"] == old["metadata"]["creationTimestamp"]
    assert new["metadata"]["generation"] == old["metadata"]["generation"]
    assert "status" not in new  # a subresource: the main resource's patch cannot change it
    assert new["spec"] == {"unschedulable": True}


@pytest.mark.parametrize(
    ("patch", "status", "needle"),
    [
        (
            {"metadata": {"labels": {"nvidia.com/gpu.product": "NVIDIA TITAN X (Pascal)"}}},
            422,
            'Node "n1" is invalid: metadata.labels: Invalid value: "NVIDIA TITAN X (Pascal)": '
            "a valid label must be an empty string",
        ),
        (
            {"metadata": {"labels": {"nvidia.com/x": "y" * 64}}},
            422,
            "must be no more than 63 characters",
        ),
        (
            {"metadata": {"labels": {"nvidia.com/bad key": "1"}}},
            422,
            'metadata.labels: Invalid value: "nvidia.com/bad key": name part must consist',
        ),
        (
            {"metadata": {"annotations": {"-bad/x": "1"}}},
            422,
            'metadata.annotations: Invalid value: "-bad/x": prefix part',
        ),
        (
            {"metadata": {"annotations": {"big": "x" * (256 * 1024)}}},
            422,
            "metadata.annotations: Too long: must have at most 262144 bytes",
        ),
        (
            {"metadata": {"labels": {"nvidia.com/gpu.count": 8}}},
            400,
            "cannot unmarshal number into Go struct field ObjectMeta.metadata.labels of type "
            "string",
        ),
        ({"metadata": {"labels": ["a"]}}, 400, "cannot unmarshal array"),
        ({"metadata": {"name": "n2"}}, 400, "does not match the name on the URL (n1)"),
        (["not", "an", "object"], 400, "must be a JSON object"),
    ],
)
def test_what_the_server_refuses(
    mem: memory.InMemoryApi, patch: Any, status: int, needle: str
) -> None:
    rv = mem.get_node("n1")["metadata"]["resourceVersion"]
    with pytest.raises(api.ApiError) as refused:
        mem.patch_node("n1", patch)
    assert refused.value.status == status and needle in str(refused.value)
    assert mem.calls[-1].method == "patch_node" and mem.calls[-1].status == status
    assert mem.get_node("n1")["metadata"]["resourceVersion"] == rv  # nothing stored


def test_missing_node_and_injected_failures(mem: memory.InMemoryApi) -> None:
    with pytest.raises(api.NotFound, match='nodes "n9" not found'):
        mem.patch_node("n9", {})
    mem.fail_next("patch_node", 503)
    with pytest.raises(api.ApiError) as failed:
        mem.patch_node("n1", {"metadata": {"labels": {"x": "1"}}})
    assert failed.value.status == 503 and failed.value.retriable
    assert [(c.method, c.status) for c in mem.calls] == [("patch_node", 404), ("patch_node", 503)]


def test_label_node_helper_is_another_client(mem: memory.InMemoryApi) -> None:
    mem.label_node("n1", {"team": None, "nvidia.com/gpu.deploy.driver": "true"})
    assert labels_of(mem) == {
        "kubernetes.io/hostname": "n1",
        "nvidia.com/gpu.deploy.driver": "true",
    }
    assert [c.method for c in mem.calls] == ["get_node"]  # the patch is not the driver's


def test_merge_patch_is_rfc_7386() -> None:
    target = {"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]}
    patch = {"a": "z", "c": {"f": None}, "l": [3], "n": {"x": None}}
    assert nodes.merge_patch(target, patch) == {"a": "z", "c": {"d": "e"}, "l": [3], "n": {}}
    assert target["c"] == {"d": "e", "f": "g"}  # the input is not changed


def _patch(url: str, body: Any, content_type: str) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="PATCH", headers={"Content-Type": content_type}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_patch_media_types_over_http(mem: memory.InMemoryApi) -> None:
    with fakeserver.FakeApiServer(mem) as server:
        url = f"{server.url}/api/v1/nodes/n1"
        body = {"metadata": {"labels": {"a": "1"}}}
        assert _patch(url, body, "application/merge-patch+json")[0] == 200
        status, node = _patch(
            url, {"metadata": {"labels": {"b": "2"}}}, nodes.STRATEGIC_MERGE_PATCH
        )
        assert status == 200 and node["metadata"]["labels"]["b"] == "2"  # maps only: same thing
        status, answer = _patch(url, body, "application/json")
        assert (status, answer["reason"]) == (415, "UnsupportedMediaType")
        status, answer = _patch(
            url,
            {"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}},
            nodes.STRATEGIC_MERGE_PATCH,
        )
        assert status == 415  # strategic merge of lists is not the fake's to imitate
        status, answer = _patch(f"{server.url}/api/v1/nodes/n9", body, nodes.MERGE_PATCH)
        assert (status, answer["reason"], answer["message"]) == (
            404,
            "NotFound",
            'nodes "n9" not found',
        )
        status, answer = _patch(url, {"metadata": {"labels": {"x": "a b"}}}, nodes.MERGE_PATCH)
        assert (status, answer["reason"]) == (422, "Invalid")
