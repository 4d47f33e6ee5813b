"""The test kit's kubelet for Pods (:class:`~dra_driver.testing.podrunner.PodKubelet`): it runs
the Pods bound to its node and reports on them as a kubelet does — Ready when the exec probe
passes, Failed with the exit code and output tail, hostPath types checked, the process ended
when the Pod is deleted — and leaves other nodes' Pods alone."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.kube.objects import PODS
from dra_driver.testing.fakeapi import memory
from dra_driver.testing.podrunner import PodKubelet
from dra_driver.testing.polling import poll


@pytest.fixture
def mem() -> memory.InMemoryApi:
    api = memory.InMemoryApi(use_default_cel=False)
    api.put_node("n1", uid=str(uuid.uuid4()))
    return api


@pytest.fixture
def kubelet(mem: memory.InMemoryApi, tmp_path: Path) -> Iterator[PodKubelet]:
    with PodKubelet(mem.objects, node_name="n1", base=tmp_path / "pods") as running:
        yield running


def pod(name: str, script: str, *, node: str = "n1", **extra: Any) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": "busybox",
        "command": ["sh", "-c", script],
        "env": [
            {"name": "GREETING", "value": "hello"},
            {"name": "ME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
        **extra.pop("container", {}),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [container],
            **extra,
        },
    }


def status(mem: memory.InMemoryApi, name: str) -> dict[str, Any]:
    return mem.objects.get(PODS, name, namespace="ns").get("status") or {}


def ready(mem: memory.InMemoryApi, name: str) -> bool:
    conditions = status(mem, name).get("conditions") or []
    return {c["type"]: c["status"] for c in conditions}.get("Ready") == "True"


def test_a_pod_runs_gets_ready_by_its_probe_and_ends_when_deleted(
    mem: memory.InMemoryApi, kubelet: PodKubelet, tmp_path: Path
) -> None:
    flag = tmp_path / "ready"
    probe = {"exec": {"command": ["test", "-e", str(flag)]}, "periodSeconds": 1}
    out = tmp_path / "env"
    script = f'echo "$GREETING $ME" > {out}; exec sleep 60'
    mem.objects.create(PODS, pod("p", script, container={"readinessProbe": probe}))
    assert poll(lambda: status(mem, "p").get("phase") == "Running")
    assert poll(lambda: out.exists() and out.read_text() == "hello p\n")
    time.sleep(0.3)
    assert not ready(mem, "p")  # the probe fails until the file exists
    flag.touch()
    assert poll(lambda: ready(mem, "p"))
    running = kubelet.running()["p"]
    mem.objects.delete(PODS, "p", namespace="ns")
    assert poll(lambda: kubelet.running() == {})
    # running() drops the Pod once it is marked deleted; its process is stopped (and recorded
    # in ``ended``) just after, in the kubelet's own thread: wait for that, never bet on it.
    assert poll(lambda: bool(kubelet.ended))
    assert running.proc is not None and running.proc.poll() is not None
    assert [(n, p) for n, _, p in kubelet.ended] == [("p", running.pid)]


def test_an_exit_ends_the_pod_with_its_code_and_output(
    mem: memory.InMemoryApi, kubelet: PodKubelet
) -> None:
    mem.objects.create(PODS, pod("bad", "echo 'no /dev/nvidiactl' >&2; exit 3"))
    assert poll(lambda: status(mem, "bad").get("phase") == "Failed")
    (container,) = status(mem, "bad")["containerStatuses"]
    ended = container["state"]["terminated"]
    assert (ended["exitCode"], ended["reason"]) == (3, "Error")
    assert "no /dev/nvidiactl" in ended["message"]
    mem.objects.create(PODS, pod("good", "exit 0"))
    assert poll(lambda: status(mem, "good").get("phase") == "Succeeded")


def test_host_paths_are_checked_and_other_nodes_pods_left_alone(
    mem: memory.InMemoryApi, kubelet: PodKubelet, tmp_path: Path
) -> None:
    missing = {"name": "d", "hostPath": {"path": str(tmp_path / "nope"), "type": "Directory"}}
    mount = {"name": "d", "mountPath": "/data"}
    mem.objects.create(
        PODS, pod("nodir", "sleep 60", volumes=[missing], container={"volumeMounts": [mount]})
    )
    assert poll(lambda: bool(status(mem, "nodir").get("containerStatuses")))
    (container,) = status(mem, "nodir")["containerStatuses"]
    assert container["state"]["waiting"]["reason"] == "CreateContainerConfigError"
    assert "is not a directory" in container["state"]["waiting"]["message"]
    made = tmp_path / "made"
    create = {"name": "d", "hostPath": {"path": str(made), "type": "DirectoryOrCreate"}}
    mem.objects.create(
        PODS, pod("mkdir", "sleep 60", volumes=[create], container={"volumeMounts": [mount]})
    )
    assert poll(lambda: "mkdir" in kubelet.running())
    assert made.is_dir()
    assert kubelet.running()["mkdir"].unmounted == [f"{made} -> /data"]  # said, not pretended
    mem.objects.create(PODS, pod("elsewhere", "sleep 60", node="n2"))
    time.sleep(0.5)
    assert "elsewhere" not in kubelet.running() and not status(mem, "elsewhere")


def test_running_is_read_whole_while_the_watch_adds_a_pod(
    mem: memory.InMemoryApi, tmp_path: Path
) -> None:
    """The watch thread adds Pods while a test reads ``running()``: the read must not break.

    Made deterministic: the first Pod's ``poll()`` (called while ``running()`` walks the table)
    is where the "watch" adds the second Pod. Without the table's lock and snapshot, this
    raised ``RuntimeError: dictionary changed size during iteration`` (a CI failure)."""
    kubelet = PodKubelet(mem.objects, node_name="n1", base=tmp_path / "pods")
    kubelet.base.mkdir(parents=True)
    first = mem.objects.create(PODS, pod("first", "sleep 30"))
    second = mem.objects.create(PODS, pod("second", "sleep 30"))
    try:
        kubelet._sync([first])
        assert kubelet.wait(lambda: set(kubelet.running()) == {"first"})
        running = kubelet.pods[first["metadata"]["uid"]]
        real = running.proc
        added: list[bool] = []

        class WatchAddsAPodMeanwhile:
            def __getattr__(self, name: str) -> Any:
                return getattr(real, name)

            def poll(self) -> int | None:
                if not added:
                    added.append(True)
                    kubelet._sync([first, second])
                return real.poll() if real is not None else None

        running.proc = WatchAddsAPodMeanwhile()  # type: ignore[assignment]
        assert set(kubelet.running()) == {"first"}  # the table as it was when read
        assert added == [True]
        running.proc = real
        assert kubelet.wait(lambda: set(kubelet.running()) == {"first", "second"})
    finally:
        for p in list(kubelet.pods.values()):
            p.kill()
