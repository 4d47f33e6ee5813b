"""The chart's ComputeDomain parts: the CRD and DeviceClasses are the package's, the controller
Deployment and the agents' second driver are wired, and RBAC grants exactly the API calls the
controller and the agents' ComputeDomain driver make (recorded from the code, not listed by
hand), cluster-wide only where a call leaves the release namespace."""

from __future__ import annotations

import re
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import pytest
import structlog
import test_chart  # the chart helpers: objects(), _rules(), the Node policy's CEL
import yaml

from dra_driver.computedomain import api as cdapi
from dra_driver.computedomain import controller, controlloop, deviceclasses, leader, manifests
from dra_driver.computedomain import monitor as monitor_mod
from dra_driver.kube.objects import COMPUTE_DOMAINS, DAEMON_SETS, Kind, ObjectApi
from dra_driver.testing.fakeapi import memory

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from computedomain import cdkit

ON = {"computeDomains": {"enabled": True}}
RELEASE_NS = "dra-driver"
LOG = structlog.get_logger()


def objects(rc: ModuleType, values: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return test_chart.objects(rc, values, kind)  # type: ignore[no-any-return]


def test_off_by_default(rc: ModuleType) -> None:
    kinds = {(m.obj["kind"], m.obj["metadata"]["name"]) for m in rc.render({})}
    assert not [
        k for k in kinds if "compute" in k[1] or k[0] in ("Deployment", "CustomResourceDefinition")
    ]
    (role,) = objects(rc, {}, "ClusterRole")
    assert not [r for r in role["rules"] if "resource.nvidia.com" in r["apiGroups"]]


def test_the_crd_is_the_packages(rc: ModuleType) -> None:
    (crd,) = objects(rc, ON, "CustomResourceDefinition")
    assert crd["metadata"]["name"] == "computedomains.resource.nvidia.com"
    assert crd["spec"] == cdapi.crd()["spec"]


def test_the_device_classes_are_the_packages(rc: ModuleType) -> None:
    def norm(obj: dict[str, Any]) -> tuple[str, Any]:
        spec = yaml.safe_load(yaml.safe_dump(obj["spec"]))
        for sel in spec["selectors"]:
            sel["cel"]["expression"] = re.sub(r"\s+", " ", sel["cel"]["expression"]).strip()
        return obj["metadata"]["name"], spec

    chart = dict(
        norm(o) for o in objects(rc, ON, "DeviceClass") if "compute-domain" in o["metadata"]["name"]
    )
    assert chart == dict(norm(o) for o in deviceclasses.load_all())
    assert sorted(chart) == [
        "compute-domain-daemon.nvidia.com",
        "compute-domain-default-channel.nvidia.com",
    ]


def test_the_controller_deployment(rc: ModuleType) -> None:
    (deploy,) = objects(rc, {**ON, "fakeGPU": {"profile": "gb200-nvl"}}, "Deployment")
    spec = deploy["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["args"] == ["controller"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["FAKE_IMEX"] == "true" and env["IMEX_DAEMON_IMAGE"] == container["image"]
    assert spec["serviceAccountName"] == "dra-driver-controller"
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    (real,) = objects(rc, ON, "Deployment")
    real_env = {e["name"] for e in real["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "FAKE_IMEX" not in real_env


def test_the_agents_serve_the_second_driver(rc: ModuleType) -> None:
    (ds,) = objects(rc, {**ON, "fakeGPU": {"profile": "gb200-nvl"}}, "DaemonSet")
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["COMPUTE_DOMAINS"] == "true" and env["IMEX_PORT"] == "50000"
    assert env["NODE_IP"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {
        v["name"]: v.get("hostPath", {}).get("path")
        for v in ds["spec"]["template"]["spec"]["volumes"]
    }
    # the IMEX files' host path is where the agent sees them: daemon pods mount that host path
    assert mounts["compute-domain-dir"] == volumes["compute-domain-dir"]
    assert volumes["compute-domain-dir"] == "/var/lib/kubelet/plugins/compute-domain.nvidia.com"


# ---- least privilege, from recorded calls -------------------------------------------------


class Recorder:
    """An ObjectApi that records (api group, resource, verb, namespace) of every call."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: set[tuple[str, str, str, str]] = set()

    def _note(self, kind: Kind, verb: str, namespace: str | None, sub: str = "") -> None:
        resource = kind.plural + (f"/{sub}" if sub else "")
        self.calls.add((kind.group, resource, verb, namespace or "*"))

    def get(self, kind: Kind, name: str, *, namespace: str | None = None) -> Any:
        self._note(kind, "get", namespace)
        return self.inner.get(kind, name, namespace=namespace)

    def list(self, kind: Kind, **kw: Any) -> Any:
        self._note(kind, "list", kw.get("namespace"))
        return self.inner.list(kind, **kw)

    def watch(self, kind: Kind, **kw: Any) -> Any:
        self._note(kind, "watch", kw.get("namespace"))
        return self.inner.watch(kind, **kw)

    def create(self, kind: Kind, obj: Any) -> Any:
        self._note(kind, "create", obj["metadata"].get("namespace"))
        return self.inner.create(kind, obj)

    def update(self, kind: Kind, obj: Any) -> Any:
        self._note(kind, "update", obj["metadata"].get("namespace"))
        return self.inner.update(kind, obj)

    def update_status(self, kind: Kind, obj: Any) -> Any:
        self._note(kind, "update", obj["metadata"].get("namespace"), "status")
        return self.inner.update_status(kind, obj)

    def patch(self, kind: Kind, name: str, patch: Any, *, namespace: str | None = None) -> Any:
        self._note(kind, "patch", namespace)
        return self.inner.patch(kind, name, patch, namespace=namespace)

    def delete(self, kind: Kind, name: str, **kw: Any) -> None:
        self._note(kind, "delete", kw.get("namespace"))
        self.inner.delete(kind, name, **kw)


def _domain(mem: memory.InMemoryApi, name: str) -> None:
    mem.objects.create(
        COMPUTE_DOMAINS,
        {
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "ComputeDomain",
            "metadata": {"name": name, "namespace": "team"},
            "spec": {"numNodes": 1, "channel": {"resourceClaimTemplate": {"name": f"{name}-ch"}}},
        },
    )


def _controller_calls() -> set[tuple[str, str, str, str]]:
    """Everything the controller does in a domain's life: leader election, the watch, creating,
    updating an outdated DaemonSet, tearing down, and sweeping an orphan."""
    mem = memory.InMemoryApi()
    cdapi.register(mem.objects)
    recorder = Recorder(mem.objects)
    objs = cast(ObjectApi, recorder)
    elector = leader.LeaderElector(objs, namespace=RELEASE_NS, name="lease", identity="a", log=LOG)
    ctl = controller.Controller(objs, settings=manifests.Settings(namespace=RELEASE_NS), log=LOG)
    assert elector.step() and elector.step()  # created, then renewed
    loop = controlloop.ControlLoop(
        objects=objs, controller=ctl, elector=elector, log=LOG, watch_timeout_s=0.2
    )
    stop = threading.Event()
    watcher = threading.Thread(target=loop._watch, args=(COMPUTE_DOMAINS, stop))
    watcher.start()
    try:
        _domain(mem, "job")
        ctl.reconcile_all()
        uid = mem.objects.get(COMPUTE_DOMAINS, "job", namespace="team")["metadata"]["uid"]
        outdated = mem.objects.get(DAEMON_SETS, f"imex-{uid}", namespace=RELEASE_NS)
        outdated["metadata"]["annotations"][controller.HASH] = "old"
        mem.objects.update(DAEMON_SETS, outdated)
        ctl.reconcile_all()  # the DaemonSet is updated
        mem.objects.delete(COMPUTE_DOMAINS, "job", namespace="team")
        ctl.reconcile_all()
        ctl.reconcile_all()
        _domain(mem, "gone")
        ctl.reconcile_all()
        obj = mem.objects.get(COMPUTE_DOMAINS, "gone", namespace="team")
        mem.objects.update(
            COMPUTE_DOMAINS, {**obj, "metadata": {**obj["metadata"], "finalizers": []}}
        )
        mem.objects.delete(COMPUTE_DOMAINS, "gone", namespace="team")
        ctl.reconcile_all()  # the orphan sweep
        assert not mem.objects.all(DAEMON_SETS) and not mem.objects.all(COMPUTE_DOMAINS)
    finally:
        stop.set()
        watcher.join(timeout=5)
    elector.release()
    return recorder.calls


def _granted(rc: ModuleType, values: dict[str, Any], name: str) -> tuple[set[Any], set[Any]]:
    cluster = {
        (r["apiGroups"][0], r["resources"][0], v)
        for role in objects(rc, values, "ClusterRole")
        if role["metadata"]["name"] == name
        for r in role["rules"]
        for v in r["verbs"]
    }
    local = {
        (r["apiGroups"][0], r["resources"][0], v)
        for role in objects(rc, values, "Role")
        if role["metadata"]["name"] == name
        for r in role["rules"]
        for v in r["verbs"]
    }
    return cluster, local


def test_the_controller_gets_exactly_the_access_it_uses(rc: ModuleType) -> None:
    calls = _controller_calls()
    cluster, local = _granted(rc, ON, "dra-driver-controller")
    needed = {(g, r, v) for g, r, v, _ in calls}
    assert cluster | local == needed  # nothing unused is granted, nothing used is missing
    outside = {(g, r, v) for g, r, v, ns in calls if ns != RELEASE_NS}
    assert outside <= cluster  # calls beyond the release namespace: the ClusterRole
    assert not (local & cluster)
    assert {(g, r) for g, r, _ in local} <= {
        ("apps", "daemonsets"),
        ("coordination.k8s.io", "leases"),
        ("resource.k8s.io", "resourceclaimtemplates"),
    }
    bindings = objects(rc, ON, "RoleBinding") + objects(rc, ON, "ClusterRoleBinding")
    ours = [b for b in bindings if b["roleRef"]["name"] == "dra-driver-controller"]
    assert len(ours) == 2 and all(
        b["subjects"]
        == [{"kind": "ServiceAccount", "name": "dra-driver-controller", "namespace": RELEASE_NS}]
        for b in ours
    )


@pytest.fixture
def tmp() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as name:
        yield Path(name)


def test_the_agents_get_exactly_what_their_compute_domain_driver_uses(
    rc: ModuleType, tmp: Path
) -> None:
    mem = cdkit.cluster()
    dom = cdkit.domain(mem, num_nodes=1)
    drv = cdkit.node_driver(mem, tmp, "a1")
    recorder = Recorder(mem.objects)
    drv._objects = drv.member._objects = cast(ObjectApi, recorder)
    job = cdkit.claim(mem, "job-channel", "job-0", "a1")
    drv.prepare([job])
    daemon_tmpl = f"imex-{dom['metadata']['uid']}"
    daemon = cdkit.claim(mem, daemon_tmpl, "imex-a1", "a1", namespace=cdkit.DRIVER_NS)
    assert drv.prepare([daemon])[daemon.uid].error == ""
    monitor_mod.Monitor(driver=drv, interval_s=1, log=LOG).step()
    assert drv.unprepare([job, daemon]) == {job.uid: "", daemon.uid: ""}
    needed = {(g, r, v) for g, r, v, _ in recorder.calls}
    role = _agent_rules(rc, ON)
    granted = {
        ("resource.nvidia.com", r, v)
        for (g, r), verbs in role.items()
        if g == "resource.nvidia.com"
        for v in verbs
    }
    assert granted == needed
    assert role[("", "nodes")] == ["get", "patch"]  # the domain label
    off = {**ON, "nodeLabels": {"enabled": False}}
    assert _agent_rules(rc, off)[("", "nodes")] == ["get", "patch"]  # even without GPU labels


def _agent_rules(rc: ModuleType, values: dict[str, Any]) -> dict[tuple[str, str], list[str]]:
    (role,) = [
        r
        for r in objects(rc, values, "ClusterRole")
        if r["metadata"]["name"] == "dra-driver-kubelet-plugin"
    ]
    return test_chart._rules(role)  # type: ignore[no-any-return]


def test_the_node_policy_lets_agents_bind_their_node_to_a_domain_only_when_on(
    rc: ModuleType,
) -> None:
    agent = "system:serviceaccount:dra-driver:dra-driver"
    old = {"metadata": {"labels": {"kubernetes.io/hostname": "n1"}}}
    bound = {
        "metadata": {
            "labels": {"kubernetes.io/hostname": "n1", "resource.nvidia.com/computeDomain": "uid-1"}
        }
    }
    on = test_chart._node_policy(rc, ON)
    assert test_chart._admit_node(on, user=agent, node="n1", name="n1", old=old, new=bound) == (
        True,
        "",
    )
    assert test_chart._admit_node(on, user=agent, node="n1", name="n1", old=bound, new=old) == (
        True,
        "",
    )
    ok, msg = test_chart._admit_node(on, user=agent, node="n2", name="n1", old=old, new=bound)
    assert not ok and "n2" in msg  # still only its own Node
    other = {"metadata": {"labels": {**bound["metadata"]["labels"], "team": "x"}}}
    assert not test_chart._admit_node(on, user=agent, node="n1", name="n1", old=bound, new=other)[0]
    off = test_chart._node_policy(rc, {})
    ok, msg = test_chart._admit_node(off, user=agent, node="n1", name="n1", old=old, new=bound)
    assert not ok and "only labels under nvidia.com/" in msg
    # ComputeDomains on, GPU labels off: the policy still confines the domain label
    only = test_chart._node_policy(rc, {**ON, "nodeLabels": {"enabled": False}})
    assert test_chart._admit_node(only, user=agent, node="n1", name="n1", old=old, new=bound)[0]
