"""The real client adapter over real HTTP (the fake API server on loopback)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.kube import api, client
from dra_driver.testing.fakeapi import fakeserver, memory

SliceFactory = Callable[..., dict[str, Any]]


@pytest.fixture
def server() -> Iterator[fakeserver.FakeApiServer]:
    with fakeserver.FakeApiServer(memory.InMemoryApi(), token="s3cret") as srv:
        yield srv


@pytest.fixture(params=[True, False], ids=["lean-http", "library-http"])
def kube(
    server: fakeserver.FakeApiServer, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[client.KubeClient]:
    """Both HTTP paths: our lean transport, and the library's (used with proxies)."""
    kc = client.KubeClient.connect(
        server.write_kubeconfig(tmp_path / "kubeconfig"), lean=request.param
    )
    yield kc
    kc.close()


def claim(name: str) -> dict[str, object]:
    return {
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {
            "devices": {
                "requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]
            }
        },
    }


def test_get_claim_and_node(server: fakeserver.FakeApiServer, kube: client.KubeClient) -> None:
    server.api.put_resource_claim(claim("c1"))
    server.api.put_node("n1", uid="uid-n1")
    got = kube.get_resource_claim("ns", "c1")
    assert got["metadata"]["name"] == "c1"
    assert got["spec"]["devices"]["requests"][0]["exactly"]["count"] == 1
    assert kube.get_node("n1")["metadata"]["uid"] == "uid-n1"
    with pytest.raises(api.NotFound, match='"c2" not found'):
        kube.get_resource_claim("ns", "c2")
    with pytest.raises(api.NotFound):
        kube.get_node("n2")


def test_patch_node_is_a_merge_patch(
    server: fakeserver.FakeApiServer, kube: client.KubeClient
) -> None:
    server.api.put_node("n1", labels={"team": "a", "old": "x"})
    node = kube.patch_node(
        "n1", {"metadata": {"labels": {"nvidia.com/gpu.count": "8", "old": None}}}
    )
    assert node["metadata"]["labels"] == {"team": "a", "nvidia.com/gpu.count": "8"}
    assert server.api.get_node("n1")["metadata"]["labels"] == node["metadata"]["labels"]
    with pytest.raises(api.Invalid, match=r'Node "n1" is invalid: metadata\.labels') as bad:
        kube.patch_node("n1", {"metadata": {"labels": {"nvidia.com/x": "not valid!"}}})
    assert bad.value.status == 422 and not bad.value.retriable
    with pytest.raises(api.NotFound, match='nodes "n2" not found'):
        kube.patch_node("n2", {"metadata": {"labels": {"a": "b"}}})
    rv = node["metadata"]["resourceVersion"]
    kube.patch_node("n1", {"metadata": {"labels": {"x": "1"}}})
    with pytest.raises(api.Conflict):
        kube.patch_node("n1", {"metadata": {"resourceVersion": rv, "labels": {"x": "2"}}})


def test_writes_and_their_errors(
    server: fakeserver.FakeApiServer, kube: client.KubeClient, make_slice: SliceFactory
) -> None:
    created = kube.create_resource_slice(make_slice())
    with pytest.raises(api.Conflict) as exists:
        kube.create_resource_slice(make_slice())
    assert exists.value.reason == "AlreadyExists"
    changed = make_slice(devices=["gpu-0", "gpu-1"])
    changed["metadata"]["resourceVersion"] = created["metadata"]["resourceVersion"]
    updated = kube.update_resource_slice(changed)
    assert updated["metadata"]["generation"] == 2
    with pytest.raises(api.Conflict, match="has been modified"):
        kube.update_resource_slice(changed)
    bad = make_slice(devices=["GPU-0"])
    with pytest.raises(api.Invalid) as invalid:
        kube.create_resource_slice(bad)
    assert invalid.value.status == 422 and "spec.devices[0].name" in str(invalid.value)
    unknown = make_slice("other")
    unknown["spec"]["devices"][0]["basic"] = {}
    with pytest.raises(api.Invalid) as undecodable:
        kube.create_resource_slice(unknown)
    assert undecodable.value.status == 400
    with pytest.raises(api.Conflict, match="Precondition failed"):
        kube.delete_resource_slice("n1-gpu.nvidia.com-0", resource_version="1")
    kube.delete_resource_slice(
        "n1-gpu.nvidia.com-0", resource_version=updated["metadata"]["resourceVersion"]
    )
    with pytest.raises(api.NotFound):
        kube.delete_resource_slice("n1-gpu.nvidia.com-0")
    assert server.api.all_resource_slices() == []


def test_list_sends_the_field_selectors(
    server: fakeserver.FakeApiServer, kube: client.KubeClient, make_slice: SliceFactory
) -> None:
    server.api.put_resource_slice(make_slice("mine"))
    server.api.put_resource_slice(make_slice("theirs", node="n2"))
    server.api.put_resource_slice(make_slice("other", driver="nic.example.com"))
    items, rv = kube.list_resource_slices(driver="gpu.nvidia.com", node_name="n1")
    assert [i["metadata"]["name"] for i in items] == ["mine"]
    assert rv == server.api.resource_version


def test_watch_streams_events_until_its_timeout(
    server: fakeserver.FakeApiServer, kube: client.KubeClient, make_slice: SliceFactory
) -> None:
    rv = server.api.put_resource_slice(make_slice("a"))["metadata"]["resourceVersion"]
    events = kube.watch_resource_slices(
        driver="gpu.nvidia.com", node_name="n1", resource_version=rv, timeout_s=1.0
    )

    def writer() -> None:
        time.sleep(0.1)
        server.api.put_resource_slice(make_slice("b"))
        server.api.put_resource_slice(make_slice("c", node="n2"))
        server.api.remove_resource_slice("a")

    thread = threading.Thread(target=writer)
    thread.start()
    began = time.monotonic()
    seen = [(e.type, e.object["metadata"]["name"]) for e in events]
    thread.join()
    assert seen == [("ADDED", "b"), ("DELETED", "a")]
    assert time.monotonic() - began < 5.0


def test_unreachable_server_is_status_zero(
    server: fakeserver.FakeApiServer, kube: client.KubeClient
) -> None:
    server.api.put_node("n1")
    server.api.fail_next("get_node", 0)  # the server drops the connection without a reply
    with pytest.raises(api.ApiError) as dropped:
        kube.get_node("n1")
    assert dropped.value.status == 0 and dropped.value.retriable
    assert kube.get_node("n1")["metadata"]["name"] == "n1"  # and the next call works
    server.api.fail_next("get_node", 503)
    with pytest.raises(api.ApiError) as unavailable:
        kube.get_node("n1")
    assert unavailable.value.status == 503
    server.stop()
    with pytest.raises(api.ApiError) as refused:
        kube.get_node("n1")
    assert refused.value.status == 0


def test_wrong_token_is_401(server: fakeserver.FakeApiServer, tmp_path: Path) -> None:
    path = fakeserver.write_kubeconfig(tmp_path / "kc", server.url, token="wrong")
    kube = client.KubeClient.connect(path)
    with pytest.raises(api.ApiError) as info:
        kube.get_node("n1")
    assert info.value.status == 401 and not info.value.retriable


def test_configuration_errors_are_clear(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(client.ConfigError, match="does not exist"):
        client.KubeClient.connect(tmp_path / "missing")
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config: kubectl's next stop
    with pytest.raises(client.ConfigError, match="in-cluster"):
        client.KubeClient.connect(None)
    kubeconfig = fakeserver.write_kubeconfig(tmp_path / "kc", "http://127.0.0.1:1")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    assert client.KubeClient.connect(None) is not None  # $KUBECONFIG is honoured
    assert os.environ["KUBECONFIG"] == str(kubeconfig)


def test_get_claim_latency_stays_sub_millisecond_scale(
    server: fakeserver.FakeApiServer, kube: client.KubeClient
) -> None:
    """Guards against per-request stalls (Nagle + delayed ACK cost ~40 ms each)."""
    server.api.put_resource_claim(claim("c1"))
    samples = []
    for _ in range(300):
        began = time.perf_counter()
        kube.get_resource_claim("ns", "c1")
        samples.append(time.perf_counter() - began)
    samples.sort()
    assert samples[len(samples) // 2] < 0.010, f"p50 {samples[150] * 1e3:.2f} ms"


def test_the_lean_transport_is_not_used_through_a_proxy(
    server: fakeserver.FakeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A proxy from the environment sends requests through the library (which speaks to
    proxies), unless NO_PROXY exempts the API server."""
    path = server.write_kubeconfig(tmp_path / "kubeconfig")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    direct = client.KubeClient.connect(path)
    assert direct._transport is not None
    server.api.put_node("n1")
    assert direct.get_node("n1")["metadata"]["name"] == "n1"
    monkeypatch.delenv("NO_PROXY")
    monkeypatch.delenv("no_proxy", raising=False)
    proxied = client.KubeClient.connect(path)
    assert proxied._transport is None
    with pytest.raises(api.ApiError) as unreachable:  # the proxy does not exist
        proxied.get_node("n1")
    assert unreachable.value.status == 0
