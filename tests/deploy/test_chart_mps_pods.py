"""The chart's side of MPS daemon Pods: the agent's image passed as ``MPS_DAEMON_IMAGE``, a Role
(never a ClusterRole) for Pods in the release namespace, and a ValidatingAdmissionPolicy that
keeps each agent to daemon Pods on its own node. The policy's CEL is evaluated as the API server
would (cel-expr-python), against hand-made requests and against the very Pods the agent's
:class:`~dra_driver.driver.mps.mpspod.PodRunner` sends, through an admission hook of the in-memory
API server. (The recorded kube-apiserver verdicts in ``../shared/reference/apiserver-verdicts``
cover ResourceSlices, ResourceClaims and DeviceClasses only; none applies to Pods.)"""

from __future__ import annotations

import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import structlog
from cel_expr_python import cel
from cel_expr_python.ext import ext_optional
from google.protobuf import descriptor_pool

from dra_driver.driver.mps import mpspod, mpspodspec, mpsprocess
from dra_driver.driver.mps.mpsrecords import DaemonDevice, DaemonRecord, Dirs, MpsError
from dra_driver.driver.mps.mpsrunner import Launch
from dra_driver.kube import api
from dra_driver.kube.objects import PODS, Kind
from dra_driver.testing.fakeapi import memory

AGENT = "system:serviceaccount:dra-driver:dra-driver"
IMAGE = "dra-driver:0.1.0"  # the chart's default: image.repository:appVersion


def objects(rc: ModuleType, values: dict[str, Any] | None = None, kind: str = "") -> list[Any]:
    return [m.obj for m in rc.render(values or {}) if not kind or m.obj["kind"] == kind]


def policy(rc: ModuleType, values: dict[str, Any] | None = None) -> dict[str, Any]:
    (found,) = [
        p
        for p in objects(rc, values, "ValidatingAdmissionPolicy")
        if p["metadata"]["name"].endswith("-mps-pods")
    ]
    return found


def admit(
    pol: dict[str, Any],
    *,
    user: str,
    node: str | None,
    op: str,
    new: dict[str, Any] | None,
    old: dict[str, Any] | None,
) -> tuple[bool, str]:
    """Evaluate the policy's CEL as the API server does: (allowed, message)."""
    dyn = cel.Type.Map(cel.Type.STRING, cel.Type.DYN)
    env = cel.NewEnv(
        descriptor_pool.Default(),
        variables={n: dyn for n in ("request", "object", "oldObject", "variables")},
        extensions=[ext_optional.ExtOptional()],
    )
    extra = {"authentication.kubernetes.io/node-name": [node]} if node else {}
    data: dict[str, Any] = {
        "request": {"operation": op, "userInfo": {"username": user, "extra": extra}},
        "object": new or {},
        "oldObject": old or {},
        "variables": {},
    }

    def run(expr: str) -> Any:
        return env.compile(expr).eval(env.Activation(data)).value()

    if not all(run(c["expression"]) for c in pol["spec"]["matchConditions"]):
        return True, "not matched"
    for var in pol["spec"]["variables"]:
        data["variables"][var["name"]] = run(var["expression"])
    for check in pol["spec"]["validations"]:
        if not run(check["expression"]):
            if "messageExpression" in check:
                return False, str(run(check["messageExpression"]))
            return False, " ".join(check["message"].split())
    return True, ""


def pod(node: str = "n1", image: str = IMAGE, **extra: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "mps-x",
            "namespace": "dra-driver",
            "labels": {"app.kubernetes.io/component": "mps-control-daemon"},
        },
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": image}], **extra},
    }


def test_the_agent_gets_a_role_for_pods_in_its_namespace_only(rc: ModuleType) -> None:
    (role,) = objects(rc, {}, "Role")
    assert role["metadata"]["namespace"] == "dra-driver"
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["pods"],
            "verbs": ["create", "delete", "get", "list", "watch"],
        }
    ]
    (binding,) = objects(rc, {}, "RoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "dra-driver", "namespace": "dra-driver"}
    ]
    for cluster_role in objects(rc, {}, "ClusterRole"):  # cluster-wide, pods are only read,
        for rule in cluster_role["rules"]:  # as the node: the allocation watch (docs/security.md)
            if "pods" in rule["resources"]:
                assert rule["verbs"] == [
                    "impersonate-on:associated-node:list",
                    "impersonate-on:associated-node:watch",
                ]


def _agent_env(rc: ModuleType, values: dict[str, Any]) -> dict[str, Any]:
    (ds,) = objects(rc, values, "DaemonSet")
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_the_daemon_image_defaults_to_the_agents_own(rc: ModuleType) -> None:
    (ds,) = objects(rc, {}, "DaemonSet")
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    env = _agent_env(rc, {})
    assert env["MPS_DAEMON_IMAGE"] == container["image"] == IMAGE
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    other = {"kubeletPlugin": {"mpsDaemons": {"image": "mirror.example/mps:1"}}}
    assert _agent_env(rc, other)["MPS_DAEMON_IMAGE"] == "mirror.example/mps:1"
    assert "mirror.example/mps:1" in policy(rc, other)["spec"]["validations"][-1]["expression"]
    # In the agent's container instead: no image, no Role, no Pod policy.
    process = {"kubeletPlugin": {"mpsDaemons": {"mode": "process"}}}
    assert "MPS_DAEMON_IMAGE" not in _agent_env(rc, process)
    assert objects(rc, process, "Role") == [] and objects(rc, process, "RoleBinding") == []
    names = [p["metadata"]["name"] for p in objects(rc, process, "ValidatingAdmissionPolicy")]
    assert not [n for n in names if n.endswith("-mps-pods")]
    assert rc.lint(process) == [] and rc.validate(rc.render(process)) == []


@pytest.mark.parametrize("daemons", [{"mode": "threads"}, {"img": "x"}])
def test_the_schema_refuses_unknown_daemon_settings(
    rc: ModuleType, daemons: dict[str, Any]
) -> None:
    assert rc.lint({"kubeletPlugin": {"mpsDaemons": daemons}}) != []


def test_the_policy_keeps_an_agent_to_daemon_pods_on_its_own_node(rc: ModuleType) -> None:
    pol = policy(rc)
    (binding,) = [
        b
        for b in objects(rc, {}, "ValidatingAdmissionPolicyBinding")
        if b["spec"]["policyName"] == pol["metadata"]["name"]
    ]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert pol["spec"]["failurePolicy"] == "Fail"
    rules = pol["spec"]["matchConstraints"]["resourceRules"]
    assert rules == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE", "DELETE"],
            "resources": ["pods"],
        }
    ]
    ok = admit(pol, user=AGENT, node="n1", op="CREATE", new=pod(), old=None)
    assert ok == (True, "")
    assert admit(pol, user=AGENT, node="n1", op="DELETE", new=None, old=pod()) == (True, "")
    allowed, message = admit(pol, user=AGENT, node="n1", op="CREATE", new=pod("n2"), old=None)
    assert not allowed and message == 'the driver agent on node n1 may not manage Pods of node "n2"'
    allowed, message = admit(pol, user=AGENT, node="n1", op="DELETE", new=None, old=pod("n2"))
    assert not allowed and 'may not manage Pods of node "n2"' in message
    allowed, message = admit(pol, user=AGENT, node=None, op="CREATE", new=pod(), old=None)
    assert not allowed and "carries no node name" in message
    unlabelled = pod()
    unlabelled["metadata"]["labels"] = {"app": "miner"}
    allowed, message = admit(pol, user=AGENT, node="n1", op="CREATE", new=unlabelled, old=None)
    assert not allowed and "only its MPS control daemon Pods" in message
    for bad in (pod(image="evil:latest"), pod(initContainers=[{"name": "i", "image": IMAGE}])):
        allowed, message = admit(pol, user=AGENT, node="n1", op="CREATE", new=bad, old=None)
        assert (
            not allowed
            and message == f"the driver agent's Pods run the MPS daemon image {IMAGE} only"
        )
    # Anyone else (an admin, the kubelet) is not this policy's business.
    assert admit(pol, user="kubernetes-admin", node=None, op="CREATE", new=pod("n9"), old=None)[0]
    assert not [
        c for c in objects(rc, {"admissionPolicy": {"enabled": False}}, "ValidatingAdmissionPolicy")
    ]


class PolicyHook:
    """The rendered policy as an admission hook of the in-memory API: every Pod request is
    made as the agent whose token says ``node``."""

    def __init__(self, pol: dict[str, Any], node: str) -> None:
        self.pol, self.node = pol, node

    def __call__(self, verb: str, kind: Kind, new: Any, old: Any) -> None:
        if kind != PODS:
            return
        op = {"create": "CREATE", "update": "UPDATE", "delete": "DELETE"}[verb]
        allowed, message = admit(self.pol, user=AGENT, node=self.node, op=op, new=new, old=old)
        if not allowed:
            name = (new or old)["metadata"]["name"]
            policy_name = self.pol["metadata"]["name"]
            raise api.ApiError(
                403,
                f"pods \"{name}\" is forbidden: ValidatingAdmissionPolicy '{policy_name}' with "
                f"binding '{policy_name}' denied request: {message}",
                reason="Forbidden",
            )


def _runner(mem: memory.InMemoryApi, node: str, image: str) -> mpspod.PodRunner:
    template = mpspodspec.PodTemplate(
        driver_name="gpu.nvidia.com",
        node_name=node,
        namespace="dra-driver",
        image=image,
        command=mpsprocess.program(fake=True, files=(), driver_root_is_slash=True)[0],
        env={},
        device_nodes=lambda d: ("/dev/nvidia0",),
        fake_device_node="/dev/null",
    )
    return mpspod.PodRunner(
        objects=mem.objects,
        template=template,
        owner=lambda: mem.get_node(node),
        processes=mpsprocess.Processes(command=template.command),
        log=structlog.get_logger("test"),
        ready_timeout_s=0.2,
        stop_timeout_s=0.5,
    )


def test_the_agents_own_pods_pass_the_policy_and_another_nodes_do_not(
    rc: ModuleType, tmp_path: Path
) -> None:
    mem = memory.InMemoryApi(use_default_cel=False)
    for node in ("n1", "n2"):
        mem.put_node(node, uid=str(uuid.uuid4()))
    mem.objects.add_admission(PolicyHook(policy(rc), node="n1"))
    dirs = Dirs(root=tmp_path, pipe=tmp_path / "p", log=tmp_path / "l", shm=tmp_path / "s")
    devices = (DaemonDevice(name="gpu-0", uuid="GPU-0", kind="gpu"),)
    launch = Launch(daemon_id="gpu-0", devices=devices, dirs=dirs)
    record = DaemonRecord(id="gpu-0", bootId="b", state="Starting", devices=devices)

    mine = _runner(mem, "n1", IMAGE)  # the agent on n1, as the chart configures it
    started = mine.start(launch, mine.intent(record))
    assert [p["metadata"]["uid"] for p in mem.objects.all(PODS)] == [started.podUid]
    mine.stop(started, dirs)  # its own Pod: the delete passes too
    assert mem.objects.all(PODS) == []

    # A token of n1 cannot start a daemon Pod for n2, nor one of another image on n1.
    for runner, reason in (
        (_runner(mem, "n2", IMAGE), 'may not manage Pods of node "n2"'),
        (_runner(mem, "n1", "evil:latest"), f"run the MPS daemon image {IMAGE} only"),
    ):
        with pytest.raises(MpsError) as exc:
            runner.start(launch, runner.intent(record))
        text = str(exc.value)
        assert text.startswith(f"cannot create Pod dra-driver/{runner.name('gpu-0')}: pods ")
        assert "is forbidden: ValidatingAdmissionPolicy 'dra-driver-mps-pods'" in text
        assert reason in text and text.endswith("(HTTP 403)")
    assert mem.objects.all(PODS) == []
