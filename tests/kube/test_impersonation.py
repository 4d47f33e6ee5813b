"""Acting as the node over both HTTP paths (the lean transport and the library's): the
``Impersonate-User`` header reaches the server on lists and watches, the client it came from
sends none, and a node name is required."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.kube import api, client, impersonation
from dra_driver.kube.objectclient import ObjectClient
from dra_driver.kube.objects import PODS
from dra_driver.testing.fakeapi import fakeserver, memory


@pytest.fixture(params=[True, False], ids=["lean-http", "library-http"])
def kube(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[client.KubeClient]:
    mem = memory.InMemoryApi(use_default_cel=False)
    mem.put_namespace("team")
    mem.objects.create(
        PODS,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "mine", "namespace": "team"},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}]},
        },
    )
    # The token reads no Pod as itself outside the driver's namespace (the default chart).
    with fakeserver.FakeApiServer(
        mem, token="s3cret", bound_node="n1", pod_namespaces=("dra-driver",)
    ) as srv:
        kc = client.KubeClient.connect(
            srv.write_kubeconfig(tmp_path / "kubeconfig"), lean=request.param
        )
        yield kc
        kc.close()


def test_the_node_s_pods_are_read_as_the_node_and_only_so(kube: client.KubeClient) -> None:
    as_node = impersonation.as_node(kube, "n1")
    try:
        objects = ObjectClient(as_node)
        items, rv = objects.list(PODS, field_selector="spec.nodeName=n1")
        assert [p["metadata"]["name"] for p in items] == ["mine"]
        events = objects.watch(
            PODS, field_selector="spec.nodeName=n1", resource_version=rv, timeout_s=1
        )
        assert [e.type for e in events if e.type != "BOOKMARK"] == []  # allowed, ends quietly
        with pytest.raises(api.ApiError) as err:  # the header is on every request
            objects.list(PODS)
        assert err.value.status == 403
        with pytest.raises(api.ApiError) as err:  # ... and the original client sends none
            ObjectClient(kube).list(PODS, field_selector="spec.nodeName=n1")
        assert err.value.status == 403 and "cluster scope" in str(err.value)
    finally:
        as_node.close()


def test_a_node_name_is_required() -> None:
    with pytest.raises(ValueError, match="node name"):
        impersonation.node_headers("")
    assert impersonation.node_headers("n1") == (("Impersonate-User", "system:node:n1"),)
