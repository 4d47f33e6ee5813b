"""MPS control daemons in Pods of their own (``--mps-daemon-image``), driven by the agent's core
against the in-memory API server, with the test kubelet running the Pods as processes: the Pod's
spec, start with the first share and deletion with the last, adoption after a restart (same
UID), restart of a Pod that died or was deleted while shares were prepared (logged and counted),
take-over of a Pod a crash left unrecorded, strays ended, and clear per-claim errors."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from dra_driver import metrics as metrics_mod
from dra_driver.devices.fake import fakemps
from dra_driver.driver.mps import mpspodspec
from dra_driver.kube import api as kube
from dra_driver.kube.objects import PODS
from dra_driver.testing.polling import poll

from . import podkit, sharekit
from .conftest import NODE, Node
from .sharekit import share, share_claim


@pytest.fixture
def pn(node_factory: Callable[..., Node], tmp_path: Path) -> Iterator[podkit.PodNode]:
    yield from podkit.pod_node(node_factory, tmp_path)


def _volumes(pod: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    """mountPath → (host path, hostPath type, volume name)."""
    by_name = {v["name"]: v["hostPath"] for v in pod["spec"]["volumes"] if "hostPath" in v}
    (container,) = pod["spec"]["containers"]
    return {
        m["mountPath"]: (by_name[m["name"]]["path"], by_name[m["name"]]["type"], m["name"])
        for m in container["volumeMounts"]
        if m["name"] in by_name
    }


def test_a_shared_gpu_runs_its_daemon_in_a_pod_from_first_to_last_share(
    pn: podkit.PodNode,
) -> None:
    node = pn.node
    gpu0 = sharekit.uuid_of(node, "gpu-0")
    a = node.add(share_claim("a", share("gpu-0", memory="20Gi", compute="25")))
    b = node.add(share_claim("b", share("gpu-0", memory="30Gi")))
    assert node.driver.prepare([a])[a.uid].error == ""

    pod = pn.pod_of("gpu-0")
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["name"] == mpspodspec.pod_name("gpu.nvidia.com", NODE, "gpu-0")
    assert meta["namespace"] == podkit.NAMESPACE
    assert meta["labels"] == {
        "app.kubernetes.io/component": "mps-control-daemon",
        "app.kubernetes.io/managed-by": "dra-driver",
        "gpu.nvidia.com/mps-driver": "gpu.nvidia.com",
        "gpu.nvidia.com/mps-node": NODE,
        "gpu.nvidia.com/mps-daemon": "gpu-0",
    }
    assert meta["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": pn.node_uid, "controller": True}
    ]
    assert spec["nodeName"] == NODE and spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False
    (container,) = spec["containers"]
    assert container["image"] == podkit.IMAGE
    # The agent's own program in the same image: the stand-in as a script (mpsprocess.program).
    assert container["command"][-4:] == ["-I", "-S", fakemps.__file__, "-f"]
    assert container["securityContext"]["privileged"] is False  # fake GPUs: no privileges
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    probe = container["readinessProbe"]["exec"]["command"]
    assert probe[:4] == ["sh", "-c", 'echo get_server_list | "$@" >/dev/null', "probe"]
    assert probe[4:] == container["command"][:-1]  # the client of the same program
    dirs = node.driver.state.mps.daemons.dirs("gpu-0")  # type: ignore[union-attr]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(dirs.pipe)
    assert env["CUDA_VISIBLE_DEVICES"] == gpu0
    assert _volumes(pod) == {
        str(dirs.pipe): (str(dirs.pipe), "Directory", "pipe"),
        str(dirs.log): (str(dirs.log), "Directory", "log"),
        "/dev/shm": (str(dirs.shm), "Directory", "shm"),
        "/dev/nvidia-uvm": ("/dev/null", "CharDevice", "dev-0"),  # fake GPUs: as in CDI specs
        "/dev/nvidia-uvm-tools": ("/dev/null", "CharDevice", "dev-1"),
        "/dev/nvidia0": ("/dev/null", "CharDevice", "dev-2"),
        "/dev/nvidiactl": ("/dev/null", "CharDevice", "dev-3"),
    }
    assert {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}} in (
        spec["volumes"]
    )
    # The record named the Pod (its UID once made); the container runs and answers.
    record = sharekit.daemon_records(node)["gpu-0"]
    assert (record["state"], record["pod"], record["podUid"]) == (
        "Running",
        meta["name"],
        meta["uid"],
    )
    assert record["pid"] is None
    assert pod["status"]["phase"] == "Running"
    assert {c["type"]: c["status"] for c in pod["status"]["conditions"]}["Ready"] == "True"
    assert set(pn.kubelet.running()) == {meta["name"]}
    assert (dirs.pipe / "control").is_socket()
    assert sharekit.exclusive_gpus(node) == {gpu0}
    assert sharekit.spec_mounts(node, a.uid, "gpu-0")["/tmp/nvidia-mps"] == str(dirs.pipe)

    assert node.driver.prepare([b])[b.uid].error == ""  # joins: no second Pod
    assert [p["metadata"]["uid"] for p in pn.pods().values()] == [meta["uid"]]
    assert len(pn.calls("create_pods")) == 1
    assert node.driver.unprepare([a]) == {a.uid: ""}
    assert set(pn.pods()) == {meta["name"]}
    assert node.driver.unprepare([b]) == {b.uid: ""}  # the last share: Pod gone
    assert pn.pods() == {}
    assert [c.status for c in pn.calls("delete_pods")] == [200]
    assert sharekit.compute_modes(node) == {gpu0: "Default"}
    assert sharekit.daemon_records(node) == {} and sharekit.daemon_dirs(node) == set()
    assert poll(lambda: pn.kubelet.running() == {})


def test_a_restarted_agent_adopts_the_daemon_pod(pn: podkit.PodNode) -> None:
    node = pn.node
    ref = node.add(share_claim("s", share("gpu-1", memory="8Gi")))
    assert node.driver.prepare([ref])[ref.uid].error == ""
    before = pn.pod_of("gpu-1")
    spec_file = node.cdi_root / f"k8s.gpu.nvidia.com-claim_{ref.uid}.json"
    spec = spec_file.read_bytes()
    pid = pn.kubelet.running()[before["metadata"]["name"]].pid
    node.api.reset_calls()
    with structlog.testing.capture_logs() as logged:
        node.restart()
    assert pn.pod_of("gpu-1")["metadata"]["uid"] == before["metadata"]["uid"]
    assert pn.calls("create_pods") == [] and pn.calls("delete_pods") == []
    assert {n: r.pid for n, r in pn.kubelet.running().items()} == {before["metadata"]["name"]: pid}
    assert spec_file.read_bytes() == spec
    [adopted] = [e for e in logged if e["event"] == "adopted a running MPS daemon"]
    assert adopted["pod"] == before["metadata"]["name"] and adopted["runner"] == "pod"
    assert node.driver.unprepare([ref]) == {ref.uid: ""}
    assert pn.pods() == {}


@pytest.mark.parametrize("how", ["deleted", "exited"])
def test_a_daemon_pod_lost_while_shares_are_prepared_is_recreated_and_reported(
    pn: podkit.PodNode, how: str
) -> None:
    node = pn.node
    refs = [node.add(share_claim(f"s{i}", share("gpu-2", memory="4Gi"))) for i in range(2)]
    assert {r.error for r in node.driver.prepare(refs).values()} == {""}
    mps_claims = node.driver.state.mps
    assert mps_claims is not None
    metrics = metrics_mod.new()
    mps_claims.daemons.metrics = metrics
    old = pn.pod_of("gpu-2")
    name = old["metadata"]["name"]
    if how == "deleted":
        node.api.objects.delete(PODS, name, namespace=podkit.NAMESPACE)
    else:
        pn.kubelet.running()[name].kill()
        assert poll(lambda: pn.pod_of("gpu-2")["status"]["phase"] == "Failed")
    with structlog.testing.capture_logs() as logged:
        mps_claims.check()
    new = pn.pod_of("gpu-2")
    assert new["metadata"]["uid"] != old["metadata"]["uid"] and new["metadata"]["name"] == name
    assert sharekit.daemon_records(node)["gpu-2"]["podUid"] == new["metadata"]["uid"]
    [died] = [e for e in logged if e["event"] == "MPS daemon died; restarting it"]
    assert died["reason"] == how and died["lost_clients"] == 2
    assert died["claims"] == sorted(r.uid for r in refs)
    assert died["pod_uid"] == old["metadata"]["uid"]
    registry = metrics.registry
    labels = {"runner": "pod", "reason": how}
    assert registry.get_sample_value("dra_driver_mps_daemon_restarts_total", labels) == 1
    lost = registry.get_sample_value("dra_driver_mps_lost_clients_total", {"runner": "pod"})
    assert lost == 2
    assert set(pn.kubelet.running()) == {name}
    assert mps_claims.daemons.supervise() == []  # healthy again
    assert node.driver.unprepare(refs) == {r.uid: "" for r in refs}
    assert pn.pods() == {}


def test_a_pod_a_crash_left_unrecorded_is_taken_over_not_doubled(pn: podkit.PodNode) -> None:
    """The create came back AlreadyExists: the Pod of this daemon (same devices, running) that
    a crash left before its UID was recorded is kept, not deleted or doubled."""
    node = pn.node
    first = node.add(share_claim("first", share("gpu-3", memory="4Gi")))
    assert node.driver.prepare([first])[first.uid].error == ""
    pod = pn.pod_of("gpu-3")
    record_path = sharekit.mps_root(node) / "daemons" / "gpu-3.json"
    record = json.loads(record_path.read_text())
    record_path.write_text(json.dumps({**record, "state": "Starting", "podUid": None}))
    daemons = node.driver.state.mps.daemons  # type: ignore[union-attr]
    node.api.reset_calls()
    with structlog.testing.capture_logs() as logged:
        daemons.ensure("gpu-3", daemons.records()["gpu-3"].devices)
    # The Starting record was stopped first (Pod deleted), then started afresh: one Pod.
    assert [p["metadata"]["name"] for p in pn.pods().values()] == [pod["metadata"]["name"]]
    assert len(pn.pods()) == 1
    assert [e["event"] for e in logged if e["log_level"] == "info"][-1] == (
        "started MPS control daemon"
    )
    # A leftover Pod for the same devices is adopted when the create meets it.
    runner = daemons.runner
    launch_record = daemons.records()["gpu-3"]
    current = pn.pod_of("gpu-3")
    from dra_driver.driver.mps.mpsrunner import Launch

    launch = Launch(daemon_id="gpu-3", devices=launch_record.devices, dirs=daemons.dirs("gpu-3"))
    with structlog.testing.capture_logs() as logged:
        again = runner.start(launch, runner.intent(launch_record))
    assert again.podUid == current["metadata"]["uid"]
    assert [e["event"] for e in logged] == ["took over the MPS daemon Pod already there"]
    assert len(pn.pods()) == 1
    assert node.driver.unprepare([first]) == {first.uid: ""}
    assert pn.pods() == {}


def test_a_pod_no_record_names_is_ended_and_its_gpu_put_back(pn: podkit.PodNode) -> None:
    node = pn.node
    gpu4 = sharekit.uuid_of(node, "gpu-4")
    ref = node.add(share_claim("s", share("gpu-4", memory="4Gi")))
    assert node.driver.prepare([ref])[ref.uid].error == ""
    name = pn.pod_of("gpu-4")["metadata"]["name"]
    # The claim and the daemon's record are gone (e.g. an unreadable record moved away).
    (node.claims_dir / f"{ref.uid}.json").unlink()
    (sharekit.mps_root(node) / "daemons" / "gpu-4.json").unlink()
    assert sharekit.exclusive_gpus(node) == {gpu4}
    with structlog.testing.capture_logs() as logged:
        node.restart()
    assert pn.pods() == {}
    assert sharekit.compute_modes(node)[gpu4] == "Default"  # from the Pod's device annotation
    [ended] = [e for e in logged if e["event"] == "ended an MPS daemon no record names"]
    assert (ended["name"], ended["daemon"], ended["devices"]) == (name, "gpu-4", ["gpu-4"])
    assert poll(lambda: pn.kubelet.running() == {})


def test_a_daemon_pod_that_never_gets_ready_fails_the_claim_naming_the_pod(
    node_factory: Callable[..., Node], tmp_path: Path
) -> None:
    gen = podkit.pod_node(node_factory, tmp_path, mps_ready_timeout_s=1.0)
    pn = next(gen)
    try:
        pn.kubelet.stop()  # no kubelet runs the Pod
        node = pn.node
        ref = node.add(share_claim("s", share("gpu-5", memory="4Gi")))
        error = node.driver.prepare([ref])[ref.uid].error
        name = mpspodspec.pod_name("gpu.nvidia.com", NODE, "gpu-5")
        assert error.startswith(
            f"{ref}: cannot start MPS control daemon gpu-5: Pod {podkit.NAMESPACE}/{name} not "
            "ready after 1s (phase Pending); daemon log: empty"
        ), error
        # Rolled back: no Pod, no record, the GPU in compute mode Default, no spec.
        assert pn.pods() == {} and sharekit.daemon_records(node) == {}
        assert sharekit.exclusive_gpus(node) == set() and node.spec_files() == []
    finally:
        gen.close()


def test_a_daemon_pod_that_exits_at_start_fails_the_claim_with_its_exit(
    pn: podkit.PodNode,
) -> None:
    node = pn.node
    daemons = node.driver.state.mps.daemons  # type: ignore[union-attr]
    daemons.runner.template = dataclass_replace(  # type: ignore[attr-defined]
        daemons.runner.template,  # type: ignore[attr-defined]
        command=("/bin/sh", "-c", "echo 'cannot open /dev/nvidiactl' >&2; exit 3", "x"),
    )
    ref = node.add(share_claim("s", share("gpu-6", memory="4Gi")))
    error = node.driver.prepare([ref])[ref.uid].error
    assert "cannot start MPS control daemon gpu-6: Pod gpu-driver/mps-n1-gpu-6-" in error
    assert "ended before it was ready (phase Failed; terminated (Error, exit code 3: " in error
    assert "cannot open /dev/nvidiactl" in error
    assert pn.pods() == {} and sharekit.exclusive_gpus(node) == set()


def test_an_unreachable_api_server_never_restarts_or_doubles_a_daemon(
    pn: podkit.PodNode,
) -> None:
    node = pn.node
    ref = node.add(share_claim("s", share("gpu-7", memory="4Gi")))
    assert node.driver.prepare([ref])[ref.uid].error == ""
    daemons = node.driver.state.mps.daemons  # type: ignore[union-attr]
    uid = pn.pod_of("gpu-7")["metadata"]["uid"]
    node.api.fail_next("get_pods", status=0, times=5)  # connection refused
    with structlog.testing.capture_logs() as logged:
        assert daemons.supervise() == []
    assert not [e for e in logged if e["log_level"] == "error"]
    assert [c.status for c in pn.calls("get_pods")][-1] == 0
    # A second share joins the daemon it cannot check rather than fail or restart it.
    node.api.clear_faults()
    other = node.add(share_claim("o", share("gpu-7", memory="4Gi")))
    node.api.fail_next("get_pods", status=503, times=1)
    assert node.driver.prepare([other])[other.uid].error == ""
    assert [p["metadata"]["uid"] for p in pn.pods().values()] == [uid]
    # Stopping while the server refuses keeps the record and the compute mode (retried later).
    assert node.driver.unprepare([ref]) == {ref.uid: ""}
    node.api.fail_next("delete_pods", status=0, times=1)
    assert node.driver.unprepare([other]) == {other.uid: ""}
    assert sharekit.daemon_records(node)["gpu-7"]["state"] == "Stopping"
    assert sharekit.exclusive_gpus(node) == {sharekit.uuid_of(node, "gpu-7")}
    node.driver.state.mps.check()  # type: ignore[union-attr]
    assert sharekit.daemon_records(node) == {} and pn.pods() == {}
    assert sharekit.exclusive_gpus(node) == set()


def test_without_the_api_server_a_pod_record_is_reported_not_touched(pn: podkit.PodNode) -> None:
    """An agent restarted without --mps-daemon-image cannot manage the Pods: it says so."""
    node = pn.node
    ref = node.add(share_claim("s", share("gpu-0", memory="4Gi")))
    assert node.driver.prepare([ref])[ref.uid].error == ""
    with structlog.testing.capture_logs() as logged:
        node.restart(mps_daemon_image="")
    problems = [e["problem"] for e in logged if e["event"] == "MPS daemons could not be recovered"]
    assert problems and "MPS daemon gpu-0 runs in Pod mps-n1-gpu-0-" in problems[0]
    assert "but this agent runs its daemons as processes (no --mps-daemon-image)" in problems[0]
    assert len(pn.pods()) == 1  # left alone
    node.restart(**podkit.POD_SETTINGS)
    assert node.driver.unprepare([ref]) == {ref.uid: ""}
    assert pn.pods() == {}


def test_pod_names_are_dns_labels_unique_per_driver_node_and_daemon() -> None:
    long_node = "gpu-node-" + "x" * 240
    names = {
        mpspodspec.pod_name(driver, node, daemon)
        for driver in ("gpu.nvidia.com", "gpu.example.com")
        for node in ("n1", "N2.example.com", long_node)
        for daemon in ("gpu-0", "claim-" + "0" * 36)
    }
    assert len(names) == 12
    for name in names:
        assert len(name) <= 63 and name == name.lower()
        assert name[0].isalnum() and name[-1].isalnum()
        assert set(name) <= set("abcdefghijklmnopqrstuvwxyz0123456789-")
    assert mpspodspec.label_value("n1") == "n1"
    assert mpspodspec.label_value(long_node).startswith("h-")
    assert len(mpspodspec.label_value(long_node)) <= 63


def test_pod_states_say_what_a_claim_error_needs() -> None:
    def pod(**status: Any) -> dict[str, Any]:
        return {"metadata": {"name": "p"}, "status": status}

    waiting = {"state": {"waiting": {"reason": "ImagePullBackOff", "message": "no such image"}}}
    found = mpspodspec.state(pod(phase="Pending", containerStatuses=[waiting]))
    assert found.problem == "ImagePullBackOff: no such image" and not found.ready
    assert found.summary == "phase Pending; waiting (ImagePullBackOff: no such image)"
    ended = {"state": {"terminated": {"exitCode": 1, "reason": "Error", "message": "boom"}}}
    found = mpspodspec.state(pod(phase="Failed", containerStatuses=[ended]))
    assert found.ended and found.summary == "phase Failed; terminated (Error, exit code 1: boom)"
    ready = [{"type": "Ready", "status": "True"}]
    assert mpspodspec.state(pod(phase="Running", conditions=ready)).ready
    assert not mpspodspec.state(pod(phase="Pending", conditions=ready)).ready
    gone = {"metadata": {"name": "p", "deletionTimestamp": "2026-01-01T00:00:00Z"}}
    assert mpspodspec.state(gone).deleting


def test_the_daemon_pod_passes_the_strict_pod_schema(pn: podkit.PodNode) -> None:
    daemons = pn.node.driver.state.mps.daemons  # type: ignore[union-attr]
    runner = daemons.runner
    from dra_driver.driver.mps.mpsrecords import DaemonDevice

    devices = [DaemonDevice(name="gpu-0", uuid="GPU-a", kind="gpu")]
    pod = mpspodspec.build(
        runner.template,  # type: ignore[attr-defined]
        "claim-" + "a" * 36,
        devices,
        daemons.dirs("claim-" + "a" * 36),
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": pn.node_uid, "controller": True},
    )
    made = pn.node.api.objects.create(PODS, pod, dry_run=True)  # strict 1.36 schema
    assert made["metadata"]["name"] == pod["metadata"]["name"]
    bad = json.loads(json.dumps(pod))
    bad["spec"]["containers"][0]["readinessProbe"]["exec"]["cmd"] = ["x"]
    with pytest.raises(kube.Invalid):
        pn.node.api.objects.create(PODS, bad, dry_run=True)


def dataclass_replace(obj: Any, **changes: Any) -> Any:
    import dataclasses

    return dataclasses.replace(obj, **changes)


def test_a_daemon_whose_restart_failed_at_start_up_is_started_by_the_next_check(
    pn: podkit.PodNode,
) -> None:
    node = pn.node
    ref = node.add(share_claim("s", share("gpu-3", memory="4Gi")))
    assert node.driver.prepare([ref])[ref.uid].error == ""
    name = pn.pod_of("gpu-3")["metadata"]["name"]
    node.api.objects.delete(PODS, name, namespace=podkit.NAMESPACE)  # dies while the agent is down
    node.api.fail_next("create_pods", status=500)  # and the restart at start-up fails
    with structlog.testing.capture_logs() as logged:
        node.restart()
    [problem] = [e["problem"] for e in logged if e["event"] == "MPS daemons could not be recovered"]
    assert problem.startswith("recovery: cannot start MPS control daemon gpu-3: cannot create Pod")
    assert pn.pods() == {} and sharekit.daemon_records(node) == {}  # undone, record gone
    mps_claims = node.driver.state.mps
    assert mps_claims is not None
    mps_claims.daemons.metrics = metrics = metrics_mod.new()
    with structlog.testing.capture_logs() as logged:
        mps_claims.check()
    [started] = [
        e for e in logged if e["event"] == "started the missing MPS daemon of prepared claims"
    ]
    assert (started["daemon"], started["lost_clients"], started["claims"]) == (
        "gpu-3",
        1,
        [ref.uid],
    )
    labels = {"runner": "pod", "reason": "missing"}
    assert metrics.registry.get_sample_value("dra_driver_mps_daemon_restarts_total", labels) == 1
    assert set(pn.pods()) == {name} and sharekit.daemon_records(node)["gpu-3"]["state"] == "Running"
    with structlog.testing.capture_logs() as logged:
        mps_claims.check()  # nothing missing any more
    assert not [e for e in logged if e["log_level"] == "error"]
    assert node.driver.unprepare([ref]) == {ref.uid: ""}
    assert pn.pods() == {}
