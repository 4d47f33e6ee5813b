"""Regressions of issue 16 at the kubelet edge: a claim listed twice (defect 3), health streams
that starved NodePrepareResources (5), raw grpc tracebacks in the JSON log (12), and readiness
that ignored publishing (8)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from dra_driver import grpcstreams, health_server
from dra_driver.testing.fakeapi import fakeserver, faultproxy
from dra_driver.testing.kubeletsim import KubeletSim, PluginProcess

from .claimkit import put_claim
from .test_dra_service import PREPARE_V1, Running, result


@pytest.fixture
def running(short_dir: Path) -> Iterator[Running]:
    r = Running(short_dir)
    r.thread.start()
    yield r
    r.stop.set()
    r.done.wait(10)


def wait_for(condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_a_claim_listed_twice_gets_each_device_once(running: Running) -> None:
    kubelet = KubeletSim(running.settings.registry_dir)
    kubelet.register("gpu.nvidia.com")
    ref = running.claim("twice", [result("gpu-0"), result("gpu-1")])
    for version in ("v1.DRAPlugin", "v1beta1.DRAPlugin"):
        pb, stub = kubelet.dra(version)
        claim = pb.Claim(namespace=ref.namespace, uid=ref.uid, name=ref.name)
        response = stub.NodePrepareResources(
            pb.NodePrepareResourcesRequest(claims=[claim, claim, claim]), timeout=10
        )
        entry = response.claims[ref.uid]
        assert entry.error == ""
        assert [d.device_name for d in entry.devices] == ["gpu-0", "gpu-1"]
        unprepared = stub.NodeUnprepareResources(
            pb.NodeUnprepareResourcesRequest(claims=[claim, claim]), timeout=10
        )
        assert set(unprepared.claims) == {ref.uid}
    kubelet.close()


def test_open_health_streams_never_block_prepare(running: Running) -> None:
    kubelet = KubeletSim(running.settings.registry_dir)
    kubelet.register("gpu.nvidia.com")
    streams = [kubelet.watch_health(timeout_s=60) for _ in range(16)]
    outcomes = []
    for stream in streams:
        try:
            next(stream)
            outcomes.append("open")
        except grpc.RpcError as exc:
            outcomes.append(exc.code().name)
    refs = [running.claim(f"c{i}", [result(f"gpu-{i}")]) for i in range(8)]
    pb, stub = kubelet.dra()
    request = pb.NodePrepareResourcesRequest(
        claims=[pb.Claim(namespace=r.namespace, uid=r.uid, name=r.name) for r in refs]
    )
    response = stub.NodePrepareResources(request, timeout=20)
    assert {c.error for c in response.claims.values()} == {""}
    assert outcomes.count("open") == grpcstreams.STREAM_SLOTS
    assert outcomes.count("RESOURCE_EXHAUSTED") == 16 - grpcstreams.STREAM_SLOTS
    assert kubelet.unprepare(refs).claims[refs[0].uid].error == ""
    for stream in streams:
        stream.cancel()
    kubelet.close()


def test_undecodable_requests_leave_one_json_object_per_log_line(
    short_dir: Path, apiserver: fakeserver.FakeApiServer
) -> None:
    plugin = PluginProcess(base=short_dir, kubeconfig=apiserver.write_kubeconfig(short_dir / "kc"))
    plugin.start()
    try:
        plugin.wait_ready()
        kubelet = KubeletSim(plugin.registry_dir)
        kubelet.register("gpu.nvidia.com")
        kubelet.dra()
        assert kubelet._dra_channel is not None
        raw = kubelet._dra_channel.unary_unary(PREPARE_V1)
        for garbage in (b"\xff\xff\xff garbage", b"\x0a\xff\xff\xff\xff\x0f", b"\x12" * 64):
            with pytest.raises(grpc.RpcError) as err:
                raw(garbage, timeout=5)
            assert err.value.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)
        ref = put_claim(apiserver, "after", ["gpu-0"])
        assert kubelet.prepare([ref]).claims[ref.uid].error == ""  # still serving
        kubelet.close()
    finally:
        plugin.kill()
    lines = [line for line in plugin.log().splitlines() if line.strip()]
    not_json = []
    for line in lines:
        try:
            json.loads(line)
        except ValueError:
            not_json.append(line)
    assert not_json == []
    events = [json.loads(line) for line in lines]
    decode = [e for e in events if "deserializing" in e.get("event", "")]
    assert decode and all(e["level"] == "error" and "DecodeError" in e["error"] for e in decode)
    assert all("Traceback" not in json.dumps(e) for e in decode)


def test_readiness_follows_publishing_through_an_api_outage(
    short_dir: Path, apiserver: fakeserver.FakeApiServer
) -> None:
    apiserver.api.put_node("n1")
    host, port = apiserver.url.removeprefix("http://").split(":")
    with faultproxy.FaultProxy((host, int(port))) as proxy:
        kubeconfig = fakeserver.write_kubeconfig(short_dir / "kc", proxy.url)
        plugin = PluginProcess(
            base=short_dir, kubeconfig=kubeconfig, publish=True, extra=["--publish-grace", "1"]
        )
        plugin.start()
        try:
            plugin.wait_ready()
            KubeletSim(plugin.registry_dir).register("gpu.nvidia.com")
            wait_for(lambda: plugin.http_get("/readyz")[0] == 200)
            count = len(apiserver.api.all_resource_slices())
            proxy.outage()  # refused connections, open ones reset
            apiserver.api.remove_resource_slice(
                apiserver.api.all_resource_slices()[0]["metadata"]["name"]
            )
            wait_for(lambda: plugin.http_get("/readyz")[0] == 503)
            status = json.loads(plugin.http_get("/readyz")[1])
            assert status == {
                "ready": False,
                "conditions": {"registered": True, "slices_published": False},
            }
            proxy.restore()
            wait_for(lambda: plugin.http_get("/readyz")[0] == 200)
            wait_for(lambda: len(apiserver.api.all_resource_slices()) == count)
        finally:
            plugin.kill()


def test_publish_grace_rides_out_short_failures() -> None:
    now = [100.0]
    grace = health_server.Grace(5.0, clock=lambda: now[0])
    readiness = health_server.Readiness(conditions=["slices_published"])
    readiness.set_check("slices_published", grace)
    assert readiness.snapshot() == {"slices_published": False}  # nothing published yet
    grace.failed()
    assert not readiness.is_ready()
    grace.ok()
    assert readiness.is_ready()
    grace.failed()
    now[0] += 5.0
    grace.failed()  # a run of failures keeps its start
    assert readiness.is_ready() and grace.failing_for() == 5.0
    now[0] += 0.1
    assert readiness.snapshot() == {"slices_published": False}
    grace.ok()
    assert readiness.is_ready() and grace.failing_for() is None
