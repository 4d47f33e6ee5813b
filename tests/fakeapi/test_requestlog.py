"""The fake API server counts requests by verb and resource, dry-run apart, with their bytes."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dra_driver.kube import client, transport
from dra_driver.testing.fakeapi import fakeserver, requestlog


@pytest.mark.parametrize(
    ("method", "path", "query", "expected"),
    [
        ("GET", "/apis/resource.k8s.io/v1/resourceslices", {}, ("list", "resourceslices")),
        (
            "GET",
            "/apis/resource.k8s.io/v1/resourceslices",
            {"watch": "1"},
            ("watch", "resourceslices"),
        ),
        ("PUT", "/apis/resource.k8s.io/v1/resourceslices/a", {}, ("update", "resourceslices")),
        ("GET", "/api/v1/nodes/n1", {}, ("get", "nodes")),
        ("PATCH", "/api/v1/nodes/n1", {}, ("patch", "nodes")),
        (
            "PATCH",
            "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status",
            {},
            ("patch", "resourceclaims/status"),
        ),
        ("GET", "/version", {}, ("get", "/version")),
    ],
)
def test_classify_names_verbs_and_resources_as_the_server_does(
    method: str, path: str, query: dict[str, str], expected: tuple[str, str]
) -> None:
    assert requestlog.classify(method, path, query) == expected


def test_requests_are_counted_over_http_and_across_a_restart(
    tmp_path: Path, make_slice: Callable[..., dict[str, Any]]
) -> None:
    server = fakeserver.FakeApiServer().start()
    server.api.put_node("n1")
    kube = client.KubeClient.connect(server.write_kubeconfig(tmp_path / "kc"))
    try:
        kube.list_resource_slices(driver="gpu.nvidia.com", node_name="n1")
        created = kube.create_resource_slice(make_slice(name="s1", node="n1"))
        kube.dry_run_create_resource_slice(make_slice(name="s2", node="n1"))
        events = kube.watch_resource_slices(
            driver="gpu.nvidia.com",
            node_name="n1",
            resource_version="",
            timeout_s=1,
        )
        assert [e.type for e in events] == ["ADDED"]
        port = int(server.url.rsplit(":", 1)[1])
        log = server.requests
        server.stop()
        server = fakeserver.FakeApiServer(server.api, port=port, requests=log).start()
        kube.get_node("n1")
        http = transport.Transport(transport.Endpoint(host="127.0.0.1", port=port))
        rows = json.loads(http.request("GET", "/fakeapi/requests").body)["requests"]
        http.close()
    finally:
        kube.close()
        server.stop()
    counted = {(r["verb"], r["resource"], r["dryRun"]): r for r in rows}
    assert set(counted) == {
        ("list", "resourceslices", False),
        ("create", "resourceslices", False),
        ("create", "resourceslices", True),
        ("watch", "resourceslices", False),
        ("get", "nodes", False),
    }
    assert all(r["requests"] == 1 for r in rows)
    create = counted[("create", "resourceslices", False)]
    assert create["bytesIn"] > 100
    assert create["bytesOut"] == len(json.dumps(created))
    assert counted[("watch", "resourceslices", False)]["bytesOut"] > len(json.dumps(created))
