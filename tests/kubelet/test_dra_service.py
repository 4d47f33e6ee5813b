"""The DRA and registration services in-process over real unix sockets: the wire shape and
bad input (malformed bytes, odd claims, garbage configs) that must never stop the server."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from dra_driver import app, logs
from dra_driver.devices import fake
from dra_driver.driver import claims
from dra_driver.kubelet import server
from dra_driver.testing.fakeapi import memory
from dra_driver.testing.kubeletsim import KubeletSim

from . import agentready

PREPARE_V1 = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"


class Running:
    def __init__(self, base: Path) -> None:
        self.api = memory.InMemoryApi(use_default_cel=False)
        self.settings = app.PluginSettings(
            node_name="n1",
            registry_dir=base / "reg",
            plugins_dir=base / "plugins",
            cdi_root=base / "cdi",
            driver_root=base / "none",
            fake=True,
            boot_id_file=base / "boot",
            cleanup_interval_s=0,
            publish=False,
        )
        self.stop = threading.Event()
        self.done = threading.Event()
        self.code: int | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.code = app.run(
                self.settings,
                backend=fake.FakeBackend.from_name("dgx-h100"),
                api=self.api,
                stop=self.stop,
                log=logs.get("test"),
            )
        finally:
            self.done.set()

    def claim(
        self, name: str, results: list[dict[str, Any]], config: list[dict[str, Any]] | None = None
    ) -> claims.ClaimRef:
        uid = str(uuid.uuid4())
        self.api.put_resource_claim(
            {
                "metadata": {"name": name, "namespace": "ns", "uid": uid},
                "spec": {
                    "devices": {
                        "requests": [
                            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}
                        ]
                    }
                },
                "status": {"allocation": {"devices": {"results": results, "config": config or []}}},
            }
        )
        return claims.ClaimRef(uid=uid, namespace="ns", name=name)


def result(device: str, *, driver: str = "gpu.nvidia.com", pool: str = "n1") -> dict[str, Any]:
    return {"request": "gpu", "driver": driver, "pool": pool, "device": device}


@pytest.fixture
def running(short_dir: Path) -> Iterator[Running]:
    r = Running(short_dir)
    agentready.wait_ready(r.thread.start)  # its start-up lines stay in this set-up's capture
    yield r
    r.stop.set()
    r.done.wait(10)


def test_bad_input_gets_per_claim_errors_and_the_server_keeps_serving(running: Running) -> None:
    kubelet = KubeletSim(running.settings.registry_dir)
    kubelet.register("gpu.nvidia.com")
    pb, stub = kubelet.dra()
    channel = kubelet._dra_channel
    assert channel is not None

    raw = channel.unary_unary(PREPARE_V1)  # no serializers: raw bytes
    with pytest.raises(grpc.RpcError) as err:
        raw(b"\xff\xff\xff garbage", timeout=5)
    assert err.value.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)
    with pytest.raises(grpc.RpcError) as err:
        channel.unary_unary("/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/Nope")(b"", timeout=5)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED

    assert len(stub.NodePrepareResources(pb.NodePrepareResourcesRequest(), timeout=5).claims) == 0
    good = running.claim("good", [result("gpu-0")])
    other_driver = running.claim("nic", [result("eth0", driver="net.example.com")])
    other_pool = running.claim("far", [result("gpu-1", pool="n9")])
    garbage_cfg = running.claim(
        "cfg",
        [result("gpu-2")],
        config=[
            {
                "source": "FromClaim",
                "opaque": {
                    "driver": "gpu.nvidia.com",
                    "parameters": {
                        "apiVersion": "gpu.nvidia.com/v1",
                        "kind": "GpuConfig",
                        "sharing": "lots",
                    },
                },
            }
        ],
    )
    foreign_cfg = running.claim(
        "fcfg",
        [result("gpu-3")],
        config=[
            {"source": "FromClaim", "opaque": {"driver": "other.io", "parameters": {"x": [1]}}}
        ],
    )
    request = pb.NodePrepareResourcesRequest(
        claims=[
            pb.Claim(namespace=r.namespace, uid=r.uid, name=r.name)
            for r in (good, good, other_driver, other_pool, garbage_cfg, foreign_cfg)
        ]
        + [pb.Claim(), pb.Claim(namespace="ns", uid="not a uid!", name="x")]
    )
    response = stub.NodePrepareResources(request, timeout=10)
    errors = {uid: entry.error for uid, entry in response.claims.items()}
    assert errors[good.uid] == "" and errors[foreign_cfg.uid] == ""
    assert "has no devices of driver gpu.nvidia.com" in errors[other_driver.uid]
    assert "n9/gpu-1" in errors[other_pool.uid]
    assert "ns/cfg" in errors[garbage_cfg.uid] and "field sharing" in errors[garbage_cfg.uid]
    assert "invalid claim uid ''" in errors[""]
    assert "invalid claim uid 'not a uid!'" in errors["not a uid!"]
    assert len(response.claims) == 7

    unprep = stub.NodeUnprepareResources(
        pb.NodeUnprepareResourcesRequest(
            claims=[pb.Claim(namespace="ns", uid=good.uid, name="good"), pb.Claim()]
        ),
        timeout=5,
    )
    assert unprep.claims[good.uid].error == "" and "invalid claim uid" in unprep.claims[""].error
    again = running.claim("again", [result("gpu-0")])
    assert kubelet.prepare([again]).claims[again.uid].error == ""
    kubelet.close()


def test_share_id_only_on_v1(running: Running) -> None:
    share = "33333333-3333-4333-8333-333333333333"
    ref = running.claim("s", [{**result("gpu-4"), "shareID": share}])
    kubelet = KubeletSim(running.settings.registry_dir)
    kubelet.register("gpu.nvidia.com")
    (dev,) = kubelet.prepare([ref], version="v1.DRAPlugin").claims[ref.uid].devices
    assert dev.HasField("share_id") and dev.share_id == share
    (old,) = kubelet.prepare([ref], version="v1beta1.DRAPlugin").claims[ref.uid].devices
    assert old.device_name == "gpu-4" and not hasattr(old, "share_id")
    plain = running.claim("p", [result("gpu-5")])
    (dev,) = kubelet.prepare([plain]).claims[plain.uid].devices
    assert not dev.HasField("share_id")
    kubelet.close()


def test_two_shares_of_one_gpu_each_answered_with_its_share_id(running: Running) -> None:
    """Each claim holding a share gets its own share_id back (kubelet keys devices by it)."""
    shares = ["44444444-4444-4444-8444-444444444444", "55555555-5555-4555-8555-555555555555"]
    refs = [
        running.claim(
            f"share-{i}",
            [
                {
                    **result("gpu-6"),
                    "shareID": share,
                    "consumedCapacity": {"memory": "8Gi", "computeShare": "20"},
                }
            ],
        )
        for i, share in enumerate(shares)
    ]
    kubelet = KubeletSim(running.settings.registry_dir)
    kubelet.register("gpu.nvidia.com")
    try:
        answer = kubelet.prepare(refs, version="v1.DRAPlugin")
        got = [answer.claims[r.uid].devices[0].share_id for r in refs]
        assert [answer.claims[r.uid].error for r in refs] == ["", ""]
        assert got == shares
        assert {c.error for c in kubelet.unprepare(refs).claims.values()} == {""}
    finally:
        kubelet.close()
        daemons = running.settings.plugin_dir / "mps" / "daemons"
        assert not list(daemons.glob("*.json"))  # the last share stopped the GPU's daemon


def test_stop_removes_sockets_and_refuses_foreign_files(running: Running, short_dir: Path) -> None:
    KubeletSim(running.settings.registry_dir).register("gpu.nvidia.com")
    running.stop.set()
    assert running.done.wait(10) and running.code == 0
    assert not running.settings.registration_socket.exists()
    assert not running.settings.dra_socket.exists()
    occupied = short_dir / "not-a-socket"
    occupied.write_text("precious")
    with pytest.raises(server.SocketError, match="is not a socket"):
        server.remove_stale_socket(occupied)
    assert occupied.read_text() == "precious"
    too_long = server.UnixServer(path=short_dir / ("x" * 120), services=[], log=logs.get("t"))
    with pytest.raises(server.SocketError, match="longer than 107 bytes"):
        too_long.start()


@pytest.mark.parametrize("length", [105, 106, 107])
def test_a_socket_path_up_to_the_limit_is_served(short_dir: Path, length: int) -> None:
    """grpc refuses ``unix://`` addresses of 106 and 107 bytes; the ``unix:`` form binds them."""
    name = "s" * (length - len(os.fsencode(short_dir.absolute())) - 1)
    path = short_dir.absolute() / name
    assert len(os.fsencode(path)) == length
    unix = server.UnixServer(path=path, services=[], log=logs.get("t"))
    unix.start()
    try:
        assert path.is_socket()
        with grpc.insecure_channel(f"unix:{path}") as channel:
            grpc.channel_ready_future(channel).result(timeout=5)
    finally:
        unix.stop(grace_s=0)
    assert not path.exists()
