"""The plugin as the kubelet meets it: a subprocess, real unix sockets, API over loopback HTTP."""

from __future__ import annotations

import json
import signal
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.driver import claims
from dra_driver.testing.fakeapi import fakeserver
from dra_driver.testing.kubeletsim import KubeletSim, PluginProcess, RegistrationRefused

from .claimkit import put_claim


@pytest.fixture
def plugin(short_dir: Path, apiserver: fakeserver.FakeApiServer) -> Iterator[PluginProcess]:
    kubeconfig = apiserver.write_kubeconfig(short_dir / "kubeconfig")
    proc = PluginProcess(base=short_dir, kubeconfig=kubeconfig)
    # A stale socket from a "crashed" earlier run must not stop the new one.
    proc.registry_dir.mkdir(parents=True)
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(proc.registration_socket))
    stale.close()
    proc.start()
    yield proc
    proc.kill()


def test_register_prepare_unprepare_both_versions_then_sigterm(
    plugin: PluginProcess, apiserver: fakeserver.FakeApiServer
) -> None:
    kubelet = KubeletSim(plugin.registry_dir)
    plugin.wait_ready()
    status, body = plugin.http_get("/readyz")  # publishing is off: registration is all it needs
    assert (status, json.loads(body)["conditions"]) == (503, {"registered": False})
    assert plugin.http_get("/healthz")[0] == 200
    info = kubelet.register("gpu.nvidia.com")
    assert plugin.http_get("/readyz")[0] == 200
    assert (info.type, info.name, info.endpoint) == (
        "DRAPlugin",
        "gpu.nvidia.com",
        str(plugin.dra_socket),
    )
    assert list(info.supported_versions) == [
        "v1.DRAPlugin",
        "v1beta1.DRAPlugin",
        "v1.DRAResourceHealth",
        "v1alpha1.DRAResourceHealth",
    ]
    assert kubelet.version == "v1.DRAPlugin"

    a = put_claim(apiserver, "a", ["gpu-0", "gpu-1"], request="gpu/h100")
    b = put_claim(apiserver, "b", ["gpu-2"])
    bogus = claims.ClaimRef(uid=str(uuid.uuid4()), namespace="team", name="nope")
    for version in ("v1.DRAPlugin", "v1beta1.DRAPlugin"):
        response = kubelet.prepare([a, b, bogus], version=version)
        assert set(response.claims) == {a.uid, b.uid, bogus.uid}
        got = response.claims[a.uid]
        assert got.error == ""
        assert [
            (list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids))
            for d in got.devices
        ] == [
            (["gpu"], "n1", "gpu-0", [f"k8s.gpu.nvidia.com/claim={a.uid}-gpu-0"]),
            (["gpu"], "n1", "gpu-1", [f"k8s.gpu.nvidia.com/claim={a.uid}-gpu-1"]),
        ]
        assert "not found in the API server" in response.claims[bogus.uid].error
        spec = json.loads((plugin.cdi_root / f"k8s.gpu.nvidia.com-claim_{a.uid}.json").read_text())
        assert [d["name"] for d in spec["devices"]] == [f"{a.uid}-gpu-0", f"{a.uid}-gpu-1"]
        response = kubelet.unprepare([a, b, bogus], version=version)
        assert {uid: c.error for uid, c in response.claims.items()} == {
            a.uid: "",
            b.uid: "",
            bogus.uid: "",
        }
        assert list(plugin.cdi_root.iterdir()) == []

    _, text = plugin.http_get("/metrics")
    samples = metric_samples(text)
    # two calls of three claims each: a, b ok; the bogus one fails to prepare, unprepares fine
    assert samples['dra_driver_requests_total{operation="prepare",result="success"}'] == 4
    assert samples['dra_driver_requests_total{operation="prepare",result="error"}'] == 2
    assert samples['dra_driver_requests_total{operation="unprepare",result="success"}'] == 6
    assert samples['dra_driver_request_duration_seconds_count{operation="prepare"}'] == 6
    assert samples["dra_driver_prepared_claims"] == 0
    assert samples['dra_driver_requests_in_flight{operation="prepare"}'] == 0

    kubelet.close()
    plugin.signal(signal.SIGTERM)
    assert plugin.wait() == 0
    assert not plugin.registration_socket.exists() and not plugin.dra_socket.exists()
    log = plugin.log()
    assert "removed a stale socket" in log
    assert "kubelet registered the plugin" in log
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    about_a = [x for x in lines if x.get("claim_uid") == a.uid]
    assert about_a and all(
        x["claim_namespace"] == "team" and x["claim_name"] == "a" for x in about_a
    )
    # exactly one summary event per claim and operation, with devices, duration and result
    prepared = [x for x in about_a if x["event"] == "claim prepared"]
    unprepared = [x for x in about_a if x["event"] == "claim unprepared"]
    assert len(prepared) == 2 and len(unprepared) == 2
    assert prepared[0]["devices"] == ["gpu-0", "gpu-1"] and prepared[0]["result"] == "success"
    assert prepared[0]["duration_ms"] >= 0 and prepared[0]["level"] == "info"
    failed = [x for x in lines if x.get("claim_uid") == bogus.uid and x["event"].endswith("failed")]
    assert len(failed) == 2 and failed[0]["result"] == "error"
    assert "not found in the API server" in failed[0]["error"]


def wait_for_sample(proc: PluginProcess, name: str, timeout_s: float = 10) -> dict[str, float]:
    """The plugin's metrics once ``name`` is positive."""
    deadline = time.monotonic() + timeout_s
    while True:
        samples = metric_samples(proc.http_get("/metrics")[1])
        if samples.get(name, 0) > 0 or time.monotonic() > deadline:
            assert samples.get(name, 0) > 0, f"{name} stayed 0"
            return samples
        time.sleep(0.05)


def metric_samples(text: str) -> dict[str, float]:
    """Prometheus text format → {name{labels}: value} (comments skipped)."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_a_refused_registration_is_an_error_the_operator_sees(plugin: PluginProcess) -> None:
    kubelet = KubeletSim(plugin.registry_dir)
    plugin.wait_ready()
    with pytest.raises(RegistrationRefused):
        kubelet.register("gpu.nvidia.com", accept=False)
    assert plugin.http_get("/readyz")[0] == 503
    kubelet.register("gpu.nvidia.com")
    assert plugin.http_get("/readyz")[0] == 200
    with pytest.raises(RegistrationRefused):  # the kubelet dropped us: not ready again
        kubelet.register("gpu.nvidia.com", accept=False)
    assert plugin.http_get("/readyz")[0] == 503
    kubelet.close()
    plugin.signal(signal.SIGTERM)
    plugin.wait()
    refused = [json.loads(x) for x in plugin.log().splitlines() if "REFUSED" in x]
    assert refused and refused[0]["level"] == "error"
    assert refused[0]["reason"] == "refused by the test"


def test_a_kubelet_without_v1_picks_v1beta1(
    plugin: PluginProcess, apiserver: fakeserver.FakeApiServer
) -> None:
    kubelet = KubeletSim(plugin.registry_dir, supported=["v1beta1.DRAPlugin"])
    plugin.wait_ready()
    kubelet.register("gpu.nvidia.com")
    assert kubelet.version == "v1beta1.DRAPlugin"
    ref = put_claim(apiserver, "c", ["gpu-7"])
    assert kubelet.prepare([ref]).claims[ref.uid].devices[0].device_name == "gpu-7"
    kubelet.close()


def test_the_node_agent_also_publishes_its_resource_slices(
    short_dir: Path, apiserver: fakeserver.FakeApiServer
) -> None:
    apiserver.api.put_node("n1")
    proc = PluginProcess(
        base=short_dir, kubeconfig=apiserver.write_kubeconfig(short_dir / "kubeconfig")
    )
    proc.argv.remove("--no-publish")
    proc.start()
    try:
        proc.wait_ready()
        deadline = time.monotonic() + 15
        while not apiserver.api.all_resource_slices() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert apiserver.api.all_resource_slices(), proc.log()
        samples = wait_for_sample(proc, 'dra_driver_resourceslice_publish_total{result="success"}')
        # After a successful pass the whole pool is there (counter slice and device slices).
        assert samples["dra_driver_resourceslices"] == len(apiserver.api.all_resource_slices())
        # published, but not registered with the kubelet yet: not ready
        status, body = proc.http_get("/readyz")
        assert status == 503
        assert json.loads(body)["conditions"] == {"registered": False, "slices_published": True}
        kubelet = KubeletSim(proc.registry_dir)
        kubelet.register("gpu.nvidia.com")
        kubelet.close()
        assert proc.http_get("/readyz")[0] == 200
        slices = apiserver.api.all_resource_slices()
        names = {d["name"] for s in slices for d in s["spec"].get("devices") or []}
        assert {f"gpu-{i}" for i in range(8)} <= names
        assert {s["spec"]["pool"]["name"] for s in slices} == {"n1"}
        proc.signal(signal.SIGTERM)
        assert proc.wait() == 0
    finally:
        proc.kill()
