"""The Helm chart, rendered by Helm's own engine: lint, strict 1.37 schemas, values checks,
node separation of the two plugin modes, privileges, RBAC and the admission policy's CEL."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from cel_expr_python import cel
from cel_expr_python.ext import ext_optional
from google.protobuf import descriptor_pool

from dra_driver.devices.fake import profiles

CHART = Path(__file__).resolve().parents[2] / "deployments" / "helm" / "dra-driver"
CI_SETS = sorted(p.name.removesuffix("-values.yaml") for p in (CHART / "ci").glob("*-values.yaml"))
SETS = ["default", *CI_SETS]
MODE_KEY = "gpu.nvidia.com/mode"
FAKE_LABEL = "dra-driver.example/fake-profile"


def objects(rc: ModuleType, values: dict[str, Any] | None = None, kind: str = "") -> list[Any]:
    return [m.obj for m in rc.render(values or {}) if not kind or m.obj["kind"] == kind]


def container(ds: dict[str, Any]) -> dict[str, Any]:
    (only,) = ds["spec"]["template"]["spec"]["containers"]
    return only  # type: ignore[no-any-return]


def env_of(ds: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(ds)["env"]}


# ---- every value set: renders, lints clean, passes the strict Kubernetes 1.37 schemas ---------


@pytest.mark.parametrize("name", SETS)
def test_value_set_renders_lints_and_validates(rc: ModuleType, name: str) -> None:
    values = rc.value_sets()[name]
    manifests = rc.render(values)
    assert manifests, f"value set {name} rendered nothing"
    assert rc.lint(values) == []
    assert rc.validate(manifests) == []


@pytest.mark.parametrize("version", ["1.34.0", "1.35.0", "1.36.0", "1.37.0"])
def test_the_chart_installs_on_every_supported_kubernetes(rc: ModuleType, version: str) -> None:
    """resource.k8s.io/v1 is GA from 1.34: the defaults lint for and validate against each."""
    assert version in rc.SUPPORTED and rc.installs_on(version)
    assert rc.lint({}, kube_version=version) == []
    assert rc.validate(rc.render({}), kube_version=version) == []


def test_the_chart_refuses_kubernetes_older_than_1_34(rc: ModuleType) -> None:
    assert not rc.installs_on("1.33.5") and not rc.installs_on("v1.33.0-gke.1")
    assert rc.installs_on("v1.34.1-eks.2") and rc.installs_on("1.38.0")


def test_lint_reports_problems(rc: ModuleType) -> None:
    found = rc.lint({"logging": {"level": "loud"}})
    assert found and any("/logging/level" in line for line in found)


def test_strict_validation_catches_an_unknown_field(rc: ModuleType) -> None:
    (ds,) = [m for m in rc.render({}) if m.obj["kind"] == "DaemonSet"]
    broken = rc.Manifest(ds.source, ds.text, {**ds.obj, "spec": {**ds.obj["spec"], "x": 1}})
    (problem,) = rc.validate([broken])
    assert "DaemonSet/dra-driver-kubelet-plugin" in problem and "'x'" in problem


# ---- bad values: the schema or a render-time check refuses them, naming the value ------------


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        ({"logging": {"level": "loud"}}, "level"),
        ({"fakeGPU": {"profile": "no-such-gpu"}}, "profile"),
        ({"kubeletPlugin": {"seamlesUpgrade": True}}, "seamlesUpgrade"),
        ({"metrics": {"port": 0}}, "port"),
        ({"driverName": "Not_A_Domain"}, "driverName"),
        ({"devicePlugin": {"migStrategy": "all"}}, "migStrategy"),
        ({"kubeletPlugin": {"cdiRoot": "relative/cdi"}}, "cdiRoot"),
        ({"kubeletPlugin": {"metadataDir": "run/meta"}}, "metadataDir"),
    ],
)
def test_schema_rejects_bad_values(rc: ModuleType, values: dict[str, Any], needle: str) -> None:
    with pytest.raises(rc.RenderError, match=needle):
        rc.render(values)


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        ({"kubeletPlugin": {"nodeSelector": {MODE_KEY: "device-plugin"}}}, "kubeletPlugin.nodeSel"),
        ({"devicePlugin": {"enabled": True, "nodeSelector": {MODE_KEY: "x"}}}, "devicePlugin.node"),
        (
            {
                "devicePlugin": {
                    "nodeAffinityExpressions": [{"key": MODE_KEY, "operator": "Exists"}]
                }
            },
            "devicePlugin.nodeAffinityExpressions",
        ),
        ({"fakeGPU": {"nodeLabel": FAKE_LABEL}}, "fakeGPU.profiles is empty"),
        ({"fakeGPU": {"profiles": ["dgx-h100"]}}, "fakeGPU.nodeLabel is empty"),
        (
            {"fakeGPU": {"nodeLabel": FAKE_LABEL, "profiles": ["pcie-l4", "pcie-l4"]}},
            "lists a profile twice",
        ),
        ({"fakeGPU": {"nodeLabel": MODE_KEY, "profiles": ["pcie-l4"]}}, "is the node-mode label"),
        ({"deviceClasses": {"gpu": False, "extendedResourceName": "nvidia.com/gpu"}}, "needs"),
    ],
)
def test_conflicting_values_fail_the_render(
    rc: ModuleType, values: dict[str, Any], needle: str
) -> None:
    with pytest.raises(rc.RenderError, match=needle):
        rc.render(values)


# ---- the two plugin modes never serve the same node --------------------------------------------


def _matches(node: dict[str, str], ds: dict[str, Any]) -> bool:
    spec = ds["spec"]["template"]["spec"]
    if any(node.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return any(
        all(_expr(node, e) for e in term["matchExpressions"]) for term in terms["nodeSelectorTerms"]
    )


def _expr(node: dict[str, str], e: dict[str, Any]) -> bool:
    has, value = e["key"] in node, node.get(e["key"])
    return {
        "In": has and value in e.get("values", []),
        "NotIn": not has or value not in e.get("values", []),
        "Exists": has,
        "DoesNotExist": not has,
    }[e["operator"]]


NODES = [
    {k: v for k, v in (("kubernetes.io/os", "linux"), (MODE_KEY, m), (FAKE_LABEL, f)) if v}
    for m, f in itertools.product(
        ["", "device-plugin", "dra"], ["", "dgx-h100", "h100-nvl-pairs", "a100-mig", "other"]
    )
]


@pytest.mark.parametrize("name", SETS)
def test_no_node_is_served_by_two_agents(rc: ModuleType, name: str) -> None:
    daemonsets = objects(rc, rc.value_sets()[name], "DaemonSet")
    for node in NODES:
        serving = [ds["metadata"]["name"] for ds in daemonsets if _matches(node, ds)]
        assert len(serving) <= 1, f"node {node} is served by {serving}"


def test_device_plugin_runs_only_on_labelled_nodes(rc: ModuleType) -> None:
    values = {"devicePlugin": {"enabled": True}, "fakeGPU": {"profile": "pcie-l4"}}
    by_name = {ds["metadata"]["name"]: ds for ds in objects(rc, values, "DaemonSet")}
    dp, kp = by_name["dra-driver-device-plugin"], by_name["dra-driver-kubelet-plugin"]
    assert _matches({MODE_KEY: "device-plugin"}, dp) and not _matches({}, dp)
    assert _matches({}, kp) and not _matches({MODE_KEY: "device-plugin"}, kp)
    # its one API use is its Node's labels: a service account of its own, else no token at all
    pod = dp["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "dra-driver-device-plugin"
    assert env_of(dp)["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    values["nodeLabels"] = {"enabled": False}
    by_name = {ds["metadata"]["name"]: ds for ds in objects(rc, values, "DaemonSet")}
    dp = by_name["dra-driver-device-plugin"]
    assert dp["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in dp["spec"]["template"]["spec"]
    assert "NODE_NAME" not in env_of(dp) and env_of(dp)["NODE_LABELS"] == "false"
    assert env_of(by_name["dra-driver-kubelet-plugin"])["NODE_LABELS"] == "false"


def test_per_node_fake_profiles_render_one_daemonset_each(rc: ModuleType) -> None:
    values = {"fakeGPU": {"nodeLabel": FAKE_LABEL, "profiles": ["dgx-h100", "pcie-l4"]}}
    dss = objects(rc, values, "DaemonSet")
    got = {ds["metadata"]["name"]: env_of(ds)["FAKE_PROFILE"] for ds in dss}
    assert got == {
        "dra-driver-kubelet-plugin-dgx-h100": "dgx-h100",
        "dra-driver-kubelet-plugin-pcie-l4": "pcie-l4",
    }
    # no fallback profile: an unlabelled node gets no agent
    assert not any(_matches({}, ds) for ds in dss)


# ---- upgrades, privileges, mounts -----------------------------------------------------------


def test_seamless_upgrade_surges_and_passes_the_pod_uid(rc: ModuleType) -> None:
    (off,) = objects(rc, {}, "DaemonSet")
    assert off["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert "POD_UID" not in env_of(off)
    (on,) = objects(rc, {"kubeletPlugin": {"seamlessUpgrade": True}}, "DaemonSet")
    assert on["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert env_of(on)["POD_UID"] == {"fieldRef": {"fieldPath": "metadata.uid"}}


def test_real_gpus_are_privileged_with_dev_and_driver_root(rc: ModuleType) -> None:
    (ds,) = objects(rc, {}, "DaemonSet")
    sc, env = container(ds)["securityContext"], env_of(ds)
    assert sc["privileged"] is True and sc["runAsUser"] == 0
    mounts = {m["name"]: m for m in container(ds)["volumeMounts"]}
    assert mounts["dev"]["mountPath"] == "/dev"
    # "/" cannot be mounted at "/": the agent is told where it is mounted instead
    assert mounts["driver-root"] == {
        "name": "driver-root",
        "mountPath": "/driver-root",
        "readOnly": True,
    }
    assert (env["DRIVER_ROOT"], env["DRIVER_ROOT_MOUNT"]) == ("/", "/driver-root")
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    (ds,) = objects(rc, {"kubeletPlugin": {"driverRoot": "/run/nvidia/driver"}}, "DaemonSet")
    mounts = {m["name"]: m for m in container(ds)["volumeMounts"]}
    assert mounts["driver-root"]["mountPath"] == "/run/nvidia/driver"
    assert "DRIVER_ROOT_MOUNT" not in env_of(ds)


def test_fake_gpus_run_unprivileged_without_host_dev(rc: ModuleType) -> None:
    (ds,) = objects(rc, {"fakeGPU": {"profile": "dgx-h100"}}, "DaemonSet")
    sc = container(ds)["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    names = {m["name"] for m in container(ds)["volumeMounts"]}
    assert names == {"plugins-registry", "plugin-dir", "cdi", "claim-metadata", "tmp"}
    paths = {
        v["name"]: v["hostPath"]["path"]
        for v in ds["spec"]["template"]["spec"]["volumes"]
        if "hostPath" in v
    }
    assert paths == {
        "plugins-registry": "/var/lib/kubelet/plugins_registry",
        "plugin-dir": "/var/lib/kubelet/plugins/gpu.nvidia.com",
        "cdi": "/var/run/cdi",
        "claim-metadata": "/run/dra-driver/claim-metadata",
    }
    # host paths are mounted at identical paths (the kubelet uses the paths we report)
    for m in container(ds)["volumeMounts"]:
        if m["name"] in paths:
            assert m["mountPath"] == paths[m["name"]]


def test_claim_metadata_dir_is_a_host_tmpfs_dir_at_the_same_path(rc: ModuleType) -> None:
    """kubeletPlugin.metadataDir (docs/metadata.md): the agent is told it (METADATA_DIR) and
    sees the host directory at the same path (the CDI specs mount the files by host path)."""
    values = {"kubeletPlugin": {"metadataDir": "/run/meta"}}
    for ds in objects(rc, values, "DaemonSet") + objects(
        rc, {**values, "fakeGPU": {"profile": "dgx-h100"}}, "DaemonSet"
    ):
        assert env_of(ds)["METADATA_DIR"] == "/run/meta"
        mounts = [m for m in container(ds)["volumeMounts"] if m["name"] == "claim-metadata"]
        assert mounts == [{"name": "claim-metadata", "mountPath": "/run/meta"}]
        volumes = [
            v for v in ds["spec"]["template"]["spec"]["volumes"] if v["name"] == "claim-metadata"
        ]
        assert volumes == [
            {
                "name": "claim-metadata",
                "hostPath": {"path": "/run/meta", "type": "DirectoryOrCreate"},
            }
        ]
    (ds,) = objects(rc, {}, "DaemonSet")  # the default: /run, a tmpfs on every systemd node
    assert env_of(ds)["METADATA_DIR"] == "/run/dra-driver/claim-metadata"


def test_an_empty_metadata_dir_keeps_the_files_in_the_plugin_dir(rc: ModuleType) -> None:
    (ds,) = objects(rc, {"kubeletPlugin": {"metadataDir": ""}}, "DaemonSet")
    assert "METADATA_DIR" not in env_of(ds)
    assert "claim-metadata" not in {m["name"] for m in container(ds)["volumeMounts"]}
    assert "claim-metadata" not in {v["name"] for v in ds["spec"]["template"]["spec"]["volumes"]}


def test_probes_use_the_metrics_port(rc: ModuleType) -> None:
    (ds,) = objects(rc, {"metrics": {"port": 9400}}, "DaemonSet")
    c = container(ds)
    assert c["ports"] == [{"name": "metrics", "containerPort": 9400, "protocol": "TCP"}]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert env_of(ds)["METRICS_PORT"] == "9400"
    assert ds["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == "9400"


def test_metrics_server_binds_the_pod_ip_unless_told_otherwise(rc: ModuleType) -> None:
    values = {"devicePlugin": {"enabled": True}}
    daemonsets = objects(rc, values, "DaemonSet")
    assert len(daemonsets) == 2  # the kubelet plugin and the device plugin
    for ds in daemonsets:
        assert env_of(ds)["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
        assert "METRICS_ADDRESS" not in env_of(ds)
    for ds in objects(rc, {**values, "metrics": {"address": "0.0.0.0"}}, "DaemonSet"):
        assert env_of(ds)["METRICS_ADDRESS"] == "0.0.0.0"


# ---- RBAC and the admission policy ------------------------------------------------------------


def _rules(role: dict[str, Any]) -> dict[tuple[str, str], list[str]]:
    assert all(len(r["apiGroups"]) == len(r["resources"]) == 1 for r in role["rules"])
    return {(r["apiGroups"][0], r["resources"][0]): sorted(r["verbs"]) for r in role["rules"]}


def test_rbac_is_exactly_what_the_agent_calls(rc: ModuleType) -> None:
    (role,) = objects(rc, {}, "ClusterRole")
    assert _rules(role) == {
        ("resource.k8s.io", "resourceclaims"): ["get"],
        ("resource.k8s.io", "resourceclaims/status"): ["patch"],  # status.devices
        ("resource.k8s.io", "resourceclaims/driver"): ["associated-node:patch"],
        ("resource.k8s.io", "resourceslices"): ["create", "delete", "list", "update", "watch"],
        ("", "nodes"): ["get", "patch"],  # patch: the Node's GPU labels
        # a Warning Event on a claim whose device vanished: create only, never read
        ("events.k8s.io", "events"): ["create"],
        # ranks follow allocations: the Pods bound to its node, read as that node (only)
        ("authentication.k8s.io", "nodes"): ["impersonate:associated-node"],
        ("", "pods"): [
            "impersonate-on:associated-node:list",
            "impersonate-on:associated-node:watch",
        ],
    }
    (granular,) = [r for r in role["rules"] if r["resources"] == ["resourceclaims/driver"]]
    assert granular["resourceNames"] == ["gpu.nvidia.com"]  # only our driver's entries
    (role,) = objects(rc, {"nodeLabels": {"enabled": False}}, "ClusterRole")
    assert _rules(role)[("", "nodes")] == ["get"]
    assert objects(rc, {"kubeletPlugin": {"enabled": False}}, "ClusterRole") == []


@pytest.mark.parametrize(
    "values", [{"watchAllocations": False}, {"gpuSets": False}], ids=["watch-off", "ranks-off"]
)
def test_no_pod_access_when_ranks_do_not_follow_allocations(
    rc: ModuleType, values: dict[str, Any]
) -> None:
    (role,) = objects(rc, {"kubeletPlugin": values}, "ClusterRole")
    assert ("", "pods") not in _rules(role)
    assert ("authentication.k8s.io", "nodes") not in _rules(role)
    (ds,) = objects(rc, {"kubeletPlugin": values}, "DaemonSet")
    if "watchAllocations" in values:
        assert env_of(ds)["WATCH_ALLOCATIONS"] == "false"
    else:
        assert "WATCH_ALLOCATIONS" not in env_of(ds)


def test_the_default_grants_no_cluster_wide_pod_read(rc: ModuleType) -> None:
    """No role bound to the agent lets its own token get, list or watch Pods beyond the
    driver's namespace; it reads its node's Pods only by acting as the node."""
    for role in objects(rc, {}, "ClusterRole"):
        for rule in role["rules"]:
            if "" in rule["apiGroups"] and {"pods", "*"} & set(rule["resources"]):
                assert not {"get", "list", "watch", "*"} & set(rule["verbs"]), rule
    (ds,) = objects(rc, {}, "DaemonSet")
    assert "ALLOCATION_SOURCE" not in env_of(ds)  # the agent's default: act as the node


def test_allocation_source_pods_is_the_explicit_cluster_wide_read(rc: ModuleType) -> None:
    values = {"kubeletPlugin": {"allocationSource": "pods"}}
    (role,) = objects(rc, values, "ClusterRole")
    rules = _rules(role)
    assert rules[("", "pods")] == ["list", "watch"]
    assert ("authentication.k8s.io", "nodes") not in rules
    (ds,) = objects(rc, values, "DaemonSet")
    assert env_of(ds)["ALLOCATION_SOURCE"] == "pods"


def test_the_device_plugin_may_only_get_and_patch_nodes(rc: ModuleType) -> None:
    values: dict[str, Any] = {
        "kubeletPlugin": {"enabled": False},
        "devicePlugin": {"enabled": True},
    }
    (role,) = objects(rc, values, "ClusterRole")
    assert role["metadata"]["name"] == "dra-driver-device-plugin"
    assert _rules(role) == {("", "nodes"): ["get", "patch"]}
    (binding,) = objects(rc, values, "ClusterRoleBinding")
    (account,) = objects(rc, values, "ServiceAccount")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": "dra-driver"}
    ]
    values["nodeLabels"] = {"enabled": False}
    for kind in ("ClusterRole", "ClusterRoleBinding", "ServiceAccount"):
        assert objects(rc, values, kind) == []


def _cel_env() -> Any:
    dyn = cel.Type.Map(cel.Type.STRING, cel.Type.DYN)
    return cel.NewEnv(
        descriptor_pool.Default(),
        variables={name: dyn for name in ("request", "object", "oldObject", "variables")},
        extensions=[ext_optional.ExtOptional()],
    )


def _admit(
    policy: dict[str, Any], *, user: str, node: str | None, op: str, slice_node: str | None
) -> tuple[bool, str]:
    """Evaluate the policy's CEL like the API server: (allowed, message)."""
    extra = {"authentication.kubernetes.io/node-name": [node]} if node else {}
    spec = {"nodeName": slice_node} if slice_node else {"allNodes": True}
    data: dict[str, Any] = {
        "request": {"operation": op, "userInfo": {"username": user, "extra": extra}},
        "object": {} if op == "DELETE" else {"spec": spec},
        "oldObject": {"spec": spec} if op != "CREATE" else {},
        "variables": {},
    }
    return _evaluate(policy, data)


def _evaluate(policy: dict[str, Any], data: dict[str, Any]) -> tuple[bool, str]:
    """The policy's match conditions, variables and validations over ``data``."""
    env = _cel_env()

    def run(expr: str) -> Any:
        return env.compile(expr).eval(env.Activation(data)).value()

    if not all(run(c["expression"]) for c in policy["spec"]["matchConditions"]):
        return True, "not matched"
    for var in policy["spec"]["variables"]:
        data["variables"][var["name"]] = run(var["expression"])
    for check in policy["spec"]["validations"]:
        if not run(check["expression"]):
            if "messageExpression" in check:
                return False, run(check["messageExpression"])
            return False, " ".join(check["message"].split())
    return True, ""


def test_admission_policy_confines_agents_to_their_node(rc: ModuleType) -> None:
    (policy,) = [
        p
        for p in objects(rc, {}, "ValidatingAdmissionPolicy")
        if p["metadata"]["name"] == "dra-driver-resourceslices"
    ]
    (binding,) = [
        b
        for b in objects(rc, {}, "ValidatingAdmissionPolicyBinding")
        if b["spec"]["policyName"] == "dra-driver-resourceslices"
    ]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    agent = "system:serviceaccount:dra-driver:dra-driver"
    for op in ("CREATE", "UPDATE", "DELETE"):
        assert _admit(policy, user=agent, node="n1", op=op, slice_node="n1") == (True, "")
        ok, msg = _admit(policy, user=agent, node="n1", op=op, slice_node="n2")
        assert not ok and "node n1" in msg and '"n2"' in msg
    ok, msg = _admit(policy, user=agent, node=None, op="CREATE", slice_node="n1")
    assert not ok and "no node name" in msg
    assert not _admit(policy, user=agent, node="n1", op="CREATE", slice_node=None)[0]
    # other users (the kubelet, admins) are not this policy's business
    assert _admit(policy, user="system:node:n1", node=None, op="DELETE", slice_node="n2")[0]
    assert objects(rc, {"admissionPolicy": {"enabled": False}}, "ValidatingAdmissionPolicy") == []


def _admit_event(
    policy: dict[str, Any], *, user: str, node: str | None, event: dict[str, Any]
) -> tuple[bool, str]:
    """Evaluate the Event policy's CEL like the API server for a CREATE of ``event``."""
    extra = {"authentication.kubernetes.io/node-name": [node]} if node else {}
    data: dict[str, Any] = {
        "request": {"operation": "CREATE", "userInfo": {"username": user, "extra": extra}},
        "object": event,
        "oldObject": {},
        "variables": {},
    }
    return _evaluate(policy, data)


def test_event_policy_confines_agents_to_claim_events_from_their_node(rc: ModuleType) -> None:
    (policy,) = [
        p
        for p in objects(rc, {}, "ValidatingAdmissionPolicy")
        if p["metadata"]["name"] == "dra-driver-events"
    ]
    (binding,) = [
        b
        for b in objects(rc, {}, "ValidatingAdmissionPolicyBinding")
        if b["spec"]["policyName"] == "dra-driver-events"
    ]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert policy["spec"]["matchConstraints"]["resourceRules"] == [
        {
            "apiGroups": ["events.k8s.io"],
            "apiVersions": ["*"],
            "operations": ["CREATE"],
            "resources": ["events"],
        }
    ]
    agent = "system:serviceaccount:dra-driver:dra-driver"
    ours = {
        "reportingController": "gpu.nvidia.com",
        "reportingInstance": "n1",
        "regarding": {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "name": "c"},
    }
    assert _admit_event(policy, user=agent, node="n1", event=ours) == (True, "")
    for bad, needle in (
        (
            {**ours, "reportingInstance": "n2"},
            'node n1 may report Events only as itself, not as "n2"',
        ),
        ({k: v for k, v in ours.items() if k != "reportingInstance"}, 'not as ""'),
        ({**ours, "reportingController": "kubelet"}, "only as gpu.nvidia.com"),
        ({**ours, "regarding": {"apiVersion": "v1", "kind": "Pod"}}, "only about ResourceClaims"),
        (
            {**ours, "regarding": {"apiVersion": "x.io/v1", "kind": "ResourceClaim"}},
            "ResourceClaims",
        ),
    ):
        ok, msg = _admit_event(policy, user=agent, node="n1", event=bad)
        assert not ok and needle in msg, (bad, msg)
    ok, msg = _admit_event(policy, user=agent, node=None, event=ours)
    assert not ok and "no node name" in msg
    other = {**ours, "reportingInstance": "n2"}
    assert _admit_event(policy, user="system:node:n1", node=None, event=other) == (
        True,
        "not matched",
    )


def _node_policy(rc: ModuleType, values: dict[str, Any] | None = None) -> dict[str, Any]:
    (policy,) = [
        p
        for p in objects(rc, values or {}, "ValidatingAdmissionPolicy")
        if p["metadata"]["name"].endswith("-nodes")
    ]
    return policy


def _admit_node(
    policy: dict[str, Any],
    *,
    user: str,
    node: str | None,
    name: str,
    old: dict[str, Any],
    new: dict[str, Any],
) -> tuple[bool, str]:
    """Evaluate the Node policy's CEL like the API server for an UPDATE of Node ``name``."""
    env = _cel_env()
    extra = {"authentication.kubernetes.io/node-name": [node]} if node else {}

    def obj(meta: dict[str, Any]) -> dict[str, Any]:
        return {
            "metadata": {"name": name, **meta.get("metadata", {})},
            "spec": meta.get("spec", {}),
        }

    data: dict[str, Any] = {
        "request": {"operation": "UPDATE", "userInfo": {"username": user, "extra": extra}},
        "object": obj(new),
        "oldObject": obj(old),
        "variables": {},
    }

    # Variables are inlined (the binding hands map values back in a form it cannot take again).
    inline = {f"variables.{v['name']}": f"({v['expression']})" for v in policy["spec"]["variables"]}

    def run(expr: str, kind: type) -> Any:
        for var, text in inline.items():
            expr = expr.replace(var, text)
        value = env.compile(expr).eval(env.Activation(data)).value()
        assert isinstance(value, kind), f"{expr} gave {value!r}"
        return value

    if not all(run(c["expression"], bool) for c in policy["spec"]["matchConditions"]):
        return True, "not matched"
    for check in policy["spec"]["validations"]:
        if not run(check["expression"], bool):
            if "messageExpression" in check:
                return False, run(check["messageExpression"], str)
            return False, " ".join(check["message"].split())
    return True, ""


def test_node_policy_confines_agents_to_their_nodes_gpu_labels(rc: ModuleType) -> None:
    values = {"devicePlugin": {"enabled": True}}
    policy = _node_policy(rc, values)
    (binding,) = [
        b
        for b in objects(rc, values, "ValidatingAdmissionPolicyBinding")
        if b["spec"]["policyName"] == policy["metadata"]["name"]
    ]
    assert binding["spec"]["validationActions"] == ["Deny"]
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rules == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["nodes"]}
    ]
    base = {
        "metadata": {
            "labels": {"kubernetes.io/hostname": "n1", "nvidia.com/gpu.deploy.driver": "true"},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"podCIDR": "10.0.0.0/24"},
    }

    def changed(**meta: Any) -> dict[str, Any]:
        new = json.loads(json.dumps(base))
        for key, value in meta.items():
            if key == "spec":
                new["spec"] = value
            else:
                new["metadata"][key] = value
        return new

    ours = changed(
        labels={**base["metadata"]["labels"], "nvidia.com/gpu.product": "NVIDIA-L4"},
        annotations={**base["metadata"]["annotations"], "gpu.nvidia.com/node-labels": "x"},
    )
    for user in (
        "system:serviceaccount:dra-driver:dra-driver",
        "system:serviceaccount:dra-driver:dra-driver-device-plugin",
    ):
        assert _admit_node(policy, user=user, node="n1", name="n1", old=base, new=ours) == (
            True,
            "",
        )
        ok, msg = _admit_node(policy, user=user, node="n1", name="n2", old=base, new=ours)
        assert not ok and msg == 'the driver agent on node n1 may not change Node "n2"'
        ok, msg = _admit_node(policy, user=user, node=None, name="n1", old=base, new=ours)
        assert not ok and "no node name" in msg
    agent = "system:serviceaccount:dra-driver:dra-driver"
    # removing our own label (even one under nvidia.com/ we never set) is a label change we may make
    gone = changed(labels={"kubernetes.io/hostname": "n1"})
    assert _admit_node(policy, user=agent, node="n1", name="n1", old=base, new=gone)[0]
    for bad, needle in (
        (changed(labels={"nvidia.com/gpu.deploy.driver": "true"}), "only labels under nvidia.com/"),
        (
            changed(labels={**base["metadata"]["labels"], "kubernetes.io/hostname": "evil"}),
            "only labels under nvidia.com/",
        ),
        (
            changed(labels={**base["metadata"]["labels"], "node-role.kubernetes.io/x": ""}),
            "only labels under nvidia.com/",
        ),
        (changed(annotations={}), "only the annotation gpu.nvidia.com/node-labels"),
        (
            changed(annotations={**base["metadata"]["annotations"], "other": "1"}),
            "only the annotation gpu.nvidia.com/node-labels",
        ),
        (
            changed(spec={**base["spec"], "taints": [{"key": "k", "effect": "NoSchedule"}]}),
            "may not change a Node's spec",
        ),
    ):
        ok, msg = _admit_node(policy, user=agent, node="n1", name="n1", old=base, new=bad)
        assert not ok and needle in msg, (bad, msg)
    # the kubelet and admins are not this policy's business
    other = _admit_node(policy, user="system:node:n1", node=None, name="n2", old=base, new=gone)
    assert other == (True, "not matched")
    assert sorted(
        p["metadata"]["name"]
        for p in objects(rc, {"nodeLabels": {"enabled": False}}, "ValidatingAdmissionPolicy")
    ) == ["dra-driver-events", "dra-driver-mps-pods", "dra-driver-resourceslices"]  # no -nodes


# ---- values.schema.json stays in step with the package ----------------------------------------


def test_schema_lists_exactly_the_builtin_fake_profiles() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    enum = schema["properties"]["fakeGPU"]["properties"]["profiles"]["items"]["enum"]
    assert sorted(enum) == profiles.builtin_names(), (
        "deployments/helm/dra-driver/values.schema.json: update the fake profile enum "
        "(fakeGPU.profile and fakeGPU.profiles) to the built-in profiles"
    )
