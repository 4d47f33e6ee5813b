"""MPS control daemons in Pods of their own, with the real agent process: the fake API server over
HTTP, the test kubelet for the plugin sockets (:class:`KubeletSim`) and one for the Pods
(:class:`PodKubelet`). A share prepared → its GPU's daemon Pod (spec checked); the agent
SIGKILLed and started again → the same Pod adopted (same UID, no create), the share's CDI spec
unchanged; the Pod deleted behind the agent's back → recreated, logged and counted; the last
share unprepared → the Pod deleted and the compute mode restored. Two agents at once (a
seamless upgrade) never run two daemons for one GPU."""

from __future__ import annotations

import collections
import concurrent.futures
import json
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.driver import claims
from dra_driver.driver.mps import mpspodspec
from dra_driver.kube.objects import PODS
from dra_driver.testing import polling
from dra_driver.testing.fakeapi import fakeserver
from dra_driver.testing.kubeletsim import KubeletSim, PluginProcess
from dra_driver.testing.podrunner import PodKubelet

DRIVER, NODE, NAMESPACE = "gpu.nvidia.com", "n1", "gpu-driver"
IMAGE = "registry.example/dra-driver:v2"
UID_A, UID_B = str(uuid.uuid4()), str(uuid.uuid4())


@pytest.fixture
def node_uid(apiserver: fakeserver.FakeApiServer) -> str:
    uid = str(uuid.uuid4())
    apiserver.api.put_node(NODE, uid=uid)
    apiserver.api.put_namespace(NAMESPACE)
    return uid


@pytest.fixture
def pods(
    short_dir: Path, apiserver: fakeserver.FakeApiServer, node_uid: str
) -> Iterator[PodKubelet]:
    kubelet = PodKubelet(apiserver.api.objects, node_name=NODE, base=short_dir / "pods").start()
    yield kubelet
    kubelet.stop(kill=True)


def agent(base: Path, kubeconfig: Path, pod_uid: str = "") -> PluginProcess:
    return PluginProcess(
        base=base,
        kubeconfig=kubeconfig,
        pod_uid=pod_uid,
        extra=[
            "--mps-daemon-image",
            IMAGE,
            "--pod-namespace",
            NAMESPACE,
            "--mps-check-interval",
            "0.2",
        ],
    ).start()


def share_claim(server: fakeserver.FakeApiServer, name: str, device: str) -> claims.ClaimRef:
    uid = str(uuid.uuid4())
    result = {
        "request": "gpu",
        "driver": DRIVER,
        "pool": NODE,
        "device": device,
        "shareID": str(uuid.uuid4()),
        "consumedCapacity": {"memory": "4Gi", "computeShare": "10"},
    }
    request = {
        "name": "gpu",
        "exactly": {"deviceClassName": DRIVER, "capacity": {"requests": {"memory": "4Gi"}}},
    }
    server.api.put_resource_claim(
        {
            "metadata": {"name": name, "namespace": "team", "uid": uid},
            "spec": {"devices": {"requests": [request]}},
            "status": {"allocation": {"devices": {"results": [result]}}},
        }
    )
    return claims.ClaimRef(uid=uid, namespace="team", name=name)


def wait_for(condition: Any, timeout_s: float = 30.0) -> bool:
    return polling.poll(condition, timeout_s)


def all_pods(server: fakeserver.FakeApiServer) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in server.api.objects.all(PODS)}


def ready(pod: dict[str, Any]) -> bool:
    return mpspodspec.state(pod).ready


def events(plugin: PluginProcess, name: str) -> list[dict[str, Any]]:
    lines = [json.loads(x) for x in plugin.log().splitlines() if x.startswith("{")]
    return [e for e in lines if e.get("event") == name]


def modes(plugin: PluginProcess) -> dict[str, str]:
    path = plugin.plugins_dir / DRIVER / "fake-gpu-control.json"
    return {u: s["computeMode"] for u, s in json.loads(path.read_text()).items()}


def test_a_daemon_pod_outlives_a_killed_agent_and_goes_with_the_last_share(
    short_dir: Path, apiserver: fakeserver.FakeApiServer, pods: PodKubelet, node_uid: str
) -> None:
    kubeconfig = apiserver.write_kubeconfig(short_dir / "kubeconfig")
    s0, s1 = share_claim(apiserver, "s0", "gpu-0"), share_claim(apiserver, "s1", "gpu-0")
    name = mpspodspec.pod_name(DRIVER, NODE, "gpu-0")
    first = agent(short_dir, kubeconfig, UID_A)  # its own log and sockets
    second: PluginProcess | None = None
    try:
        first.wait_ready()
        kubelet = KubeletSim(first.registry_dir)
        kubelet.register(DRIVER, socket=first.registration_socket)
        assert kubelet.prepare([s0]).claims[s0.uid].error == ""
        kubelet.close()

        (pod,) = all_pods(apiserver).values()
        meta, spec = pod["metadata"], pod["spec"]
        assert meta["name"] == name and meta["namespace"] == NAMESPACE
        assert meta["ownerReferences"][0]["uid"] == node_uid
        assert spec["nodeName"] == NODE
        (container,) = spec["containers"]
        assert container["image"] == IMAGE
        mps_dir = first.plugins_dir / DRIVER / "mps" / "gpu-0"
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        hosts = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
        assert hosts[mounts[str(mps_dir / "pipe")]] == str(mps_dir / "pipe")
        assert hosts[mounts[str(mps_dir / "log")]] == str(mps_dir / "log")
        assert hosts[mounts["/dev/shm"]] == str(mps_dir / "shm")
        assert "get_server_list" in container["readinessProbe"]["exec"]["command"][2]
        assert ready(pod) and set(pods.running()) == {name}
        daemon_pid = pods.running()[name].pid
        cdi_spec = next(first.cdi_root.glob(f"*{s0.uid}.json")).read_bytes()
        assert str(mps_dir / "pipe") in cdi_spec.decode()

        first.signal(signal.SIGKILL)
        first.wait()
        apiserver.api.reset_calls()
        second = agent(short_dir, kubeconfig, UID_B)
        second.wait_ready()
        assert [c for c in apiserver.api.calls if c.method in ("create_pods", "delete_pods")] == []
        (adopted,) = events(second, "adopted a running MPS daemon")
        assert (adopted["pod"], adopted["pod_uid"]) == (name, meta["uid"])
        assert {n: p["metadata"]["uid"] for n, p in all_pods(apiserver).items()} == {
            name: meta["uid"]
        }
        assert pods.running()[name].pid == daemon_pid  # the same daemon, never restarted
        assert next(second.cdi_root.glob(f"*{s0.uid}.json")).read_bytes() == cdi_spec

        kubelet = KubeletSim(second.registry_dir)
        kubelet.register(DRIVER, socket=second.registration_socket)
        assert kubelet.prepare([s1]).claims[s1.uid].error == ""  # joins the adopted daemon
        assert [p["metadata"]["uid"] for p in all_pods(apiserver).values()] == [meta["uid"]]

        # Deleted behind the agent's back while two shares use it: back, and reported.
        apiserver.api.objects.delete(PODS, name, namespace=NAMESPACE)
        assert wait_for(
            lambda: (
                [
                    p["metadata"]["uid"] != meta["uid"] and ready(p)
                    for p in all_pods(apiserver).values()
                ]
                == [True]
            )
        )
        (died,) = events(second, "MPS daemon died; restarting it")
        assert (died["reason"], died["lost_clients"]) == ("deleted", 2)
        assert sorted(died["claims"]) == sorted([s0.uid, s1.uid])
        _, text = second.http_get("/metrics")
        assert 'dra_driver_mps_daemon_restarts_total{reason="deleted",runner="pod"} 1.0' in text
        assert 'dra_driver_mps_lost_clients_total{runner="pod"} 2.0' in text

        answer = kubelet.unprepare([s0, s1])
        assert {c.error for c in answer.claims.values()} == {""}
        assert all_pods(apiserver) == {}
        assert set(modes(second).values()) == {"Default"}
        assert wait_for(lambda: pods.running() == {})
        kubelet.close()
        second.signal(signal.SIGTERM)
        assert second.wait() == 0
    finally:
        first.kill()
        if second is not None:
            second.kill()


def test_two_agents_at_once_never_run_two_daemons_for_one_gpu(
    short_dir: Path, apiserver: fakeserver.FakeApiServer, pods: PodKubelet
) -> None:
    kubeconfig = apiserver.write_kubeconfig(short_dir / "kubeconfig")
    a, b = agent(short_dir, kubeconfig, UID_A), agent(short_dir, kubeconfig, UID_B)
    refs = [share_claim(apiserver, f"s{i}", f"gpu-{i % 2}") for i in range(6)]
    most: collections.Counter[str] = collections.Counter()
    stop = threading.Event()
    sampling_errors: list[BaseException] = []

    def sample() -> None:  # at every moment: daemons running and Pods per GPU
        try:
            sample_until_stopped()
        except BaseException as e:  # a dead sampler must fail the test by name, not by counts
            sampling_errors.append(e)

    def sample_until_stopped() -> None:
        while not stop.is_set():
            per_gpu: collections.Counter[str] = collections.Counter()
            for pod in apiserver.api.objects.all(PODS):
                for dev in mpspodspec.devices_of(pod):
                    per_gpu[f"pods {dev.name}"] += 1
            for running in pods.running().values():
                env = {e["name"]: e.get("value") for e in running.container["env"]}
                per_gpu[f"daemons {env['CUDA_VISIBLE_DEVICES']}"] += 1
            for key, count in per_gpu.items():
                most[key] = max(most[key], count)
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    try:
        a.wait_ready()
        b.wait_ready()
        ka, kb = KubeletSim(a.registry_dir), KubeletSim(b.registry_dir)
        ka.register(DRIVER, socket=a.registration_socket)
        kb.register(DRIVER, socket=b.registration_socket)
        sampler.start()
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(lambda i: (ka, kb)[i % 2].prepare([refs[i]]), range(len(refs))))
        assert [r.claims[refs[i].uid].error for i, r in enumerate(answers)] == [""] * 6
        assert len(all_pods(apiserver)) == 2
        made = [c for c in apiserver.api.calls if c.method == "create_pods" and c.status == 201]
        assert len(made) == 2  # one Pod per GPU, whichever agent got there first
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            gone = list(pool.map(lambda i: (kb, ka)[i % 2].unprepare([refs[i]]), range(len(refs))))
        assert [r.claims[refs[i].uid].error for i, r in enumerate(gone)] == [""] * 6
        stop.set()
        sampler.join()
        assert sampling_errors == []
        assert all_pods(apiserver) == {}
        assert max(most.values()) == 1, most
        assert {k.split()[0] for k in most} == {"pods", "daemons"}
        assert set(modes(a).values()) == {"Default"}
        ka.close()
        kb.close()
    finally:
        stop.set()
        a.kill()
        b.kill()
