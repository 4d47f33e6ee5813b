"""Feature discovery (:mod:`dra_driver.kube.features`) over real HTTP: the real client against
the fake API server on loopback, with DRA feature gates on and off."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.apimachinery import names
from dra_driver.kube import client, features
from dra_driver.slices import validate
from dra_driver.testing.fakeapi import fakeserver, resthandler

Connect = Callable[..., tuple[fakeserver.FakeApiServer, client.KubeClient]]
ALL_KEPT = {"device_taints": True, "shared_counters": True, "consumable_capacity": True}


@pytest.fixture(params=[True, False], ids=["lean-http", "library-http"])
def connect(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Connect]:
    """``connect(**FakeApiServer kwargs)``: a started fake server and a client for it."""
    opened: list[tuple[fakeserver.FakeApiServer, client.KubeClient]] = []

    def make(**kwargs: Any) -> tuple[fakeserver.FakeApiServer, client.KubeClient]:
        server = fakeserver.FakeApiServer(token="s3cret", **kwargs).start()
        path = server.write_kubeconfig(tmp_path / f"kubeconfig-{len(opened)}")
        kube = client.KubeClient.connect(path, lean=request.param)
        opened.append((server, kube))
        return server, kube

    yield make
    for server, kube in opened:
        kube.close()
        server.stop()


def _kept(found: features.Features) -> dict[str, bool | None]:
    return {key: getattr(found, key) for key in ALL_KEPT}


def test_all_gates_on_keeps_every_field(connect: Connect) -> None:
    _, kube = connect()
    found = features.probe(kube, "n1", "gpu.nvidia.com")
    assert _kept(found) == ALL_KEPT
    assert found.server_version == resthandler.VERSION["gitVersion"]
    assert found.served_versions == ("v1",) and found.preferred_version == "v1"
    assert found.v1_served and found.not_probed == ""


@pytest.mark.parametrize(
    ("gate", "feature"),
    [
        ("DRADeviceTaints", "device_taints"),
        ("DRAPartitionableDevices", "shared_counters"),
        ("DRAConsumableCapacity", "consumable_capacity"),
    ],
)
def test_a_gate_off_shows_its_fields_dropped_and_no_other(
    connect: Connect, gate: str, feature: str
) -> None:
    _, kube = connect(disabled_gates={gate})
    found = features.probe(kube, "n1", "gpu.nvidia.com")
    assert _kept(found) == {**ALL_KEPT, feature: False}


def test_every_gate_off_drops_all_and_gates_we_do_not_use_drop_nothing(connect: Connect) -> None:
    _, kube = connect(
        disabled_gates={"DRADeviceTaints", "DRAPartitionableDevices", "DRAConsumableCapacity"}
    )
    assert set(_kept(features.probe(kube, "n1", "d.example.com")).values()) == {False}
    # Binding conditions and list attributes: we publish neither, so nothing is lost.
    _, kube = connect(disabled_gates={"DRADeviceBindingConditions", "DRAListTypeAttributes"})
    assert _kept(features.probe(kube, "n1", "gpu.nvidia.com")) == ALL_KEPT


def test_the_probe_stores_nothing(connect: Connect, make_slice: Callable[..., Any]) -> None:
    server, kube = connect(disabled_gates={"DRADeviceTaints"})
    server.api.put_resource_slice(make_slice("n1-gpu.nvidia.com-0"))
    before = server.api.all_resource_slices()
    rv = server.api.resource_version
    features.probe(kube, "n1", "gpu.nvidia.com")
    features.probe(kube, "n1", "gpu.nvidia.com")  # twice: no name is taken either
    assert server.api.all_resource_slices() == before
    items, list_rv = kube.list_resource_slices(driver="", node_name="")
    assert [s["metadata"]["name"] for s in items] == ["n1-gpu.nvidia.com-0"]
    assert list_rv == rv == server.api.resource_version
    assert server.api.writes == 0
    dry = [c for c in server.api.calls if c.method == "dry_run_create_resource_slice"]
    assert len(dry) == 4 and {c.status for c in dry} == {201}
    assert all(c.name.startswith("n1-dra-driver-probe-") for c in dry)


def test_probe_slices_are_valid_and_named_apart_from_the_node_pool() -> None:
    for node in ("n1", "x" * 253, "a." * 100 + "b"):
        counters, devices = features.probe_slices(node, "gpu.nvidia.com")
        for obj in (counters, devices):
            assert validate.validate(obj) == []
            prefix = obj["metadata"]["generateName"]
            assert prefix.endswith("-dra-driver-probe-") and len(prefix) <= 58
            assert names.dns_subdomain(prefix + "abcde") == []
            assert obj["spec"]["nodeName"] == node
            assert obj["spec"]["pool"]["name"] != node
        assert "sharedCounters" in counters["spec"] and "devices" not in counters["spec"]
        device = devices["spec"]["devices"][0]
        assert {"taints", "consumesCounters", "allowMultipleAllocations"} <= set(device)


def test_versions_served_and_v1_missing(connect: Connect) -> None:
    _, kube = connect(served_versions=("v1beta1", "v1", "v1beta2"))
    found = features.probe(kube, "n1", "gpu.nvidia.com")
    assert found.served_versions == ("v1", "v1beta2", "v1beta1")
    assert found.preferred_version == "v1" and _kept(found) == ALL_KEPT
    server, kube = connect(served_versions=("v1beta2",))
    found = features.probe(kube, "n1", "gpu.nvidia.com")
    assert not found.v1_served and found.served_versions == ("v1beta2",)
    assert set(_kept(found).values()) == {None}
    assert found.not_probed == "resource.k8s.io/v1 not served"
    assert not any(c.method.startswith("dry_run") for c in server.api.calls)
    _, kube = connect(served_versions=())
    found = features.probe(kube, "n1", "gpu.nvidia.com")
    assert found.served_versions == () and found.preferred_version == ""


def test_a_refused_dry_run_leaves_the_fields_unknown(connect: Connect) -> None:
    server, kube = connect()
    server.api.fail_next("dry_run_create_resource_slice", 403, message="forbidden by RBAC")
    found = features.probe(kube, "n1", "gpu.nvidia.com")
    assert set(_kept(found).values()) == {None}
    assert found.not_probed == "the dry-run create was refused (HTTP 403): forbidden by RBAC"


def test_an_unreachable_server_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a loopback port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    path = fakeserver.write_kubeconfig(tmp_path / "kubeconfig", url)
    kube = client.KubeClient.connect(path)
    try:
        with pytest.raises(features.ProbeError) as err:
            features.probe(kube, "n1", "gpu.nvidia.com")
    finally:
        kube.close()
    assert str(err.value).startswith(f"cannot reach the API server {url}: ")
    assert "refused" in str(err.value) and err.value.server == url


def test_credentials_refused_is_a_clear_error(tmp_path: Path) -> None:
    with fakeserver.FakeApiServer(token="right") as server:
        path = fakeserver.write_kubeconfig(tmp_path / "kubeconfig", server.url, token="wrong")
        kube = client.KubeClient.connect(path)
        try:
            with pytest.raises(features.ProbeError, match=r"refused GET /version: HTTP 401"):
                features.probe(kube, "n1", "gpu.nvidia.com")
        finally:
            kube.close()


def test_rbac_as_the_server_reviews_it(connect: Connect) -> None:
    _, kube = connect()
    everything = features.rbac(kube)
    assert everything.complete and not everything.unknown
    assert [(r.resource, r.allowed, r.denied) for r in everything.rows] == [
        ("resourceslices", ("list", "watch", "create", "update", "delete"), ()),
        ("resourceclaims", ("get",), ()),
        ("nodes", ("get", "patch"), ()),
    ]
    _, kube = connect(denied={("patch", "nodes"), ("watch", "resourceslices")})
    partial = features.rbac(kube)
    assert not partial.complete
    assert {r.resource: r.denied for r in partial.rows} == {
        "resourceslices": ("watch",),
        "resourceclaims": (),
        "nodes": ("patch",),
    }
    _, kube = connect(access_reviews=False)
    unknown = features.rbac(kube)
    assert unknown.rows == () and not unknown.complete
    assert unknown.unknown.startswith("server did not answer: HTTP 404")
