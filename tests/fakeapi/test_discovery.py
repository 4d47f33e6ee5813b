"""The fake API server answers what ``dra-driver doctor`` asks as a real server does: group
discovery of ``resource.k8s.io``, ``/version``, dry-run creates that store nothing, and
self-subject access reviews (plain HTTP, no client of ours)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from dra_driver.testing.fakeapi import discovery, fakeserver, resthandler

Obj = dict[str, Any]
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def _call(
    server: fakeserver.FakeApiServer, method: str, path: str, body: Obj | None = None
) -> tuple[int, Obj]:
    request = urllib.request.Request(
        server.url + path,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method=method,
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _slice(name: str = "probe", **device: Any) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": "n1",
            "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", **device}],
        },
    }


def test_group_discovery_lists_the_served_versions_preferred_first() -> None:
    with fakeserver.FakeApiServer() as server:
        assert _call(server, "GET", "/apis/resource.k8s.io") == (
            200,
            {
                "kind": "APIGroup",
                "apiVersion": "v1",
                "name": "resource.k8s.io",
                "versions": [{"groupVersion": "resource.k8s.io/v1", "version": "v1"}],
                "preferredVersion": {"groupVersion": "resource.k8s.io/v1", "version": "v1"},
            },
        )
        assert _call(server, "GET", "/version") == (200, resthandler.VERSION)
    with fakeserver.FakeApiServer(served_versions=("v1beta1", "v1beta2")) as server:
        status, group = _call(server, "GET", "/apis/resource.k8s.io/")
        assert status == 200
        assert [v["version"] for v in group["versions"]] == ["v1beta2", "v1beta1"]
        assert group["preferredVersion"]["version"] == "v1beta2"
        # v1 is not served: its paths are not there.
        status, body = _call(server, "GET", SLICES)
        assert status == 404 and body["reason"] == "NotFound"
    with fakeserver.FakeApiServer(served_versions=()) as server:
        assert _call(server, "GET", "/apis/resource.k8s.io")[0] == 404
    with pytest.raises(ValueError, match=r"cannot serve resource\.k8s\.io v2"):
        discovery.Served.of(["v1", "v2"], ())


def test_dry_run_create_answers_the_would_be_object_and_stores_nothing() -> None:
    taint = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}
    with fakeserver.FakeApiServer(disabled_gates={"DRADeviceTaints"}) as server:
        rv = server.api.resource_version
        status, body = _call(server, "POST", f"{SLICES}?dryRun=All", _slice(taints=[taint]))
        assert status == 201
        assert "taints" not in body["spec"]["devices"][0]  # dropped as on a real create
        meta = body["metadata"]
        assert meta["name"] == "probe" and meta["uid"] and meta["generation"] == 1
        assert "resourceVersion" not in meta
        assert server.api.all_resource_slices() == [] and server.api.resource_version == rv
        assert server.api.writes == 0
        # Invalid objects are refused as on a real create.
        status, body = _call(server, "POST", f"{SLICES}?dryRun=All", _slice(name="Bad_Name"))
        assert status == 422 and body["reason"] == "Invalid"
        # A name that exists: 409, as the real server's dry run checks the store.
        server.api.put_resource_slice(_slice())
        status, body = _call(server, "POST", f"{SLICES}?dryRun=All", _slice())
        assert status == 409 and "already exists" in body["message"]
        assert len(server.api.all_resource_slices()) == 1


def test_dry_run_values_and_places_the_fake_does_not_honour_are_refused() -> None:
    with fakeserver.FakeApiServer() as server:
        status, body = _call(server, "POST", f"{SLICES}?dryRun=Some", _slice())
        assert status == 400 and 'Unsupported value: "Some"' in body["message"]
        server.api.put_resource_slice(_slice())
        status, body = _call(server, "PUT", f"{SLICES}/probe?dryRun=All", _slice())
        assert status == 400 and "ResourceSlice create only" in body["message"]
        status, _ = _call(server, "DELETE", f"{SLICES}/probe?dryRun=All")
        assert status == 400 and server.api.get_resource_slice("probe")


def test_self_subject_access_reviews() -> None:
    path = discovery.REVIEW_PATH
    review = {
        "kind": "SelfSubjectAccessReview",
        "apiVersion": "authorization.k8s.io/v1",
        "spec": {"resourceAttributes": {"verb": "patch", "group": "", "resource": "nodes"}},
    }
    with fakeserver.FakeApiServer(denied={("patch", "nodes")}) as server:
        status, body = _call(server, "POST", path, review)
        assert status == 201 and body["status"]["allowed"] is False
        assert body["spec"]["resourceAttributes"]["resource"] == "nodes"
        review["spec"]["resourceAttributes"]["verb"] = "get"  # type: ignore[index]
        status, body = _call(server, "POST", path, review)
        assert status == 201 and body["status"]["allowed"] is True
        status, body = _call(server, "POST", path, {"spec": {}})
        assert status == 422 and "resourceAttributes" in body["message"]
    with fakeserver.FakeApiServer(access_reviews=False) as server:
        assert _call(server, "POST", path, review)[0] == 404


def test_kubectl_discovery_documents_list_what_is_served() -> None:
    """``/api``, ``/apis`` and the resource lists kubectl reads before ``kubectl get``."""
    with fakeserver.FakeApiServer() as server:
        status, versions = _call(server, "GET", "/api")
        assert (status, versions["kind"], versions["versions"]) == (200, "APIVersions", ["v1"])
        status, groups = _call(server, "GET", "/apis")
        assert status == 200 and groups["kind"] == "APIGroupList"
        named = {g["name"]: g["preferredVersion"]["groupVersion"] for g in groups["groups"]}
        assert named["resource.k8s.io"] == "resource.k8s.io/v1"
        assert named["coordination.k8s.io"] == "coordination.k8s.io/v1"
        status, listed = _call(server, "GET", "/apis/resource.k8s.io/v1")
        assert status == 200 and listed["groupVersion"] == "resource.k8s.io/v1"
        by_name = {r["name"]: r for r in listed["resources"]}
        assert by_name["resourceslices"]["kind"] == "ResourceSlice"
        assert by_name["resourceslices"]["namespaced"] is False
        assert {"list", "watch", "get"} <= set(by_name["resourceslices"]["verbs"])
        assert by_name["resourceclaims"]["namespaced"] is True
        assert "resourceclaimtemplates" in by_name
        status, core = _call(server, "GET", "/api/v1")
        assert status == 200 and core["groupVersion"] == "v1"
        assert {r["name"] for r in core["resources"]} == {"nodes", "pods"}
        # Every resource a list names answers a LIST where it says so (no list of a 404).
        for resource in by_name.values():
            if "list" in resource["verbs"] and not resource["namespaced"]:
                assert (
                    _call(server, "GET", f"/apis/resource.k8s.io/v1/{resource['name']}")[0] == 200
                )
        assert _call(server, "GET", "/apis/resource.k8s.io/v1beta1")[0] == 404
        assert _call(server, "GET", "/apis/example.com/v1")[0] == 404
    with fakeserver.FakeApiServer(served_versions=()) as server:
        _, groups = _call(server, "GET", "/apis")
        assert "resource.k8s.io" not in {g["name"] for g in groups["groups"]}
        assert _call(server, "GET", "/apis/resource.k8s.io/v1")[0] == 404


def test_resource_slices_print_as_a_table_when_kubectl_asks() -> None:
    accept = (
        "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;"
        "g=meta.k8s.io,application/json"
    )
    with fakeserver.FakeApiServer() as server:
        server.api.create_resource_slice(_slice("s1"))
        request = urllib.request.Request(server.url + SLICES, headers={"Accept": accept})
        with urllib.request.urlopen(request, timeout=10) as answer:
            table = json.loads(answer.read())
        assert table["kind"] == "Table" and table["apiVersion"] == "meta.k8s.io/v1"
        assert [c["name"] for c in table["columnDefinitions"]] == [
            "Name",
            "Node",
            "Driver",
            "Pool",
            "Age",
        ]
        (row,) = table["rows"]
        assert row["cells"][:4] == ["s1", "n1", "gpu.nvidia.com", "n1"]
        assert row["cells"][4].endswith("s")
        assert row["object"]["metadata"]["name"] == "s1"
        plain = _call(server, "GET", SLICES)[1]  # no Table asked: the list, as before
        assert plain["kind"] == "ResourceSliceList"
