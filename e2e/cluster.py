"""A small, synchronous view of a cluster for the e2e suite (its only importer of the client).

Why it exists: the scenarios read like the issue's list (apply a spec, wait for the pod, look at
what its containers see), so the Kubernetes plumbing (dynamic client, polling, logs, exec) lives
here once. Everything comes from ``KUBECONFIG``; nothing is cluster-specific.
"""

from __future__ import annotations

import dataclasses
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from kubernetes import client, config, dynamic
from kubernetes.client.rest import ApiException
from kubernetes.stream import stream

SPECS = Path(__file__).resolve().parent / "specs"
DRIVER = os.environ.get("E2E_DRIVER_NAME", "gpu.nvidia.com")
AGENT_NAMESPACE = os.environ.get("E2E_AGENT_NAMESPACE", "dra-driver")
WORKLOAD_IMAGE = os.environ.get("E2E_WORKLOAD_IMAGE", "")
READY_MARK = "E2E-READY"
PROFILE_LABEL = "dra-driver.example/fake-profile"
MODE_LABEL = "gpu.nvidia.com/mode"
_T = TypeVar("_T")


class Unreachable(Exception):
    """No cluster to talk to; the message is the skip reason."""


def connect(timeout: float = 5.0) -> Cluster:
    """The cluster ``KUBECONFIG`` names, after one cheap call proves it answers."""
    path = os.environ.get("KUBECONFIG", "")
    if not path:
        raise Unreachable("KUBECONFIG is not set (run e2e/run.sh, or point it at a cluster)")
    try:
        api_client = config.new_client_from_config(config_file=path.split(os.pathsep)[0])
        version = client.VersionApi(api_client).get_code(_request_timeout=timeout)
    except Exception as exc:  # any failure means: nothing reachable to test against
        raise Unreachable(f"no cluster reachable through KUBECONFIG={path}: {exc}") from exc
    return Cluster(api_client, server_version=f"{version.major}.{version.minor}")


@dataclasses.dataclass
class Cluster:
    api_client: client.ApiClient
    server_version: str

    def __post_init__(self) -> None:
        self.core = client.CoreV1Api(self.api_client)
        self.dyn = dynamic.DynamicClient(self.api_client)

    # ---- generic objects ---------------------------------------------------------------------

    def resource(self, api_version: str, kind: str) -> Any:
        return self.dyn.resources.get(api_version=api_version, kind=kind)

    def list_objects(self, api_version: str, kind: str, **kwargs: Any) -> list[dict[str, Any]]:
        items = self.resource(api_version, kind).get(**kwargs).to_dict()["items"]
        return list(items)

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Any:
        obj = self.resource(api_version, kind).get(name=name, namespace=namespace)
        return obj.to_dict()

    def apply_spec(self, name: str, namespace: str) -> list[dict[str, Any]]:
        """Create every object of ``e2e/specs/<name>.yaml`` in ``namespace``."""
        created = []
        for obj in yaml.safe_load_all((SPECS / f"{name}.yaml").read_text()):
            if not obj:
                continue
            if obj["kind"] == "Pod" and WORKLOAD_IMAGE:
                for c in obj["spec"]["containers"]:
                    c["image"] = WORKLOAD_IMAGE
            res = self.resource(obj["apiVersion"], obj["kind"])
            created.append(res.create(body=obj, namespace=namespace).to_dict())
        return created

    # ---- namespaces, pods ------------------------------------------------------------------

    def temp_namespace(self, prefix: str) -> Iterator[str]:
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        self.core.create_namespace({"metadata": {"name": name, "labels": {"e2e": "dra-driver"}}})
        try:
            yield name
        finally:
            self.core.delete_namespace(name, grace_period_seconds=0)

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        pod: dict[str, Any] = self.api_client.sanitize_for_serialization(
            self.core.read_namespaced_pod(name, namespace)
        )
        return pod

    def wait_running(self, namespace: str, name: str, timeout: float = 180) -> dict[str, Any]:
        """The pod once Running with every container's ready mark in its log."""

        def ready() -> dict[str, Any] | None:
            pod = self.pod(namespace, name)
            phase = pod["status"].get("phase")
            if phase in ("Failed", "Succeeded"):
                raise AssertionError(f"pod {namespace}/{name} ended: {phase} {pod['status']}")
            if phase != "Running":
                return None
            for c in pod["spec"]["containers"]:
                if READY_MARK not in self.logs(namespace, name, c["name"]):
                    return None
            return pod

        return poll(
            ready, timeout, lambda: f"pod {namespace}/{name}: {self.describe(namespace, name)}"
        )

    def describe(self, namespace: str, name: str) -> str:
        try:
            status = self.pod(namespace, name)["status"]
        except ApiException as exc:
            return f"unreadable ({exc.status})"
        events = self.core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={name}"
        ).items
        return f"phase={status.get('phase')} conditions={status.get('conditions')} events=" + (
            "; ".join(f"{e.reason}: {e.message}" for e in events[-5:])
        )

    def logs(self, namespace: str, name: str, container: str) -> str:
        try:
            return str(self.core.read_namespaced_pod_log(name, namespace, container=container))
        except ApiException:
            return ""

    def seen(self, namespace: str, name: str, container: str) -> Seen:
        """What one container saw: GPU device nodes and NVIDIA_* variables."""
        lines = self.logs(namespace, name, container).split(READY_MARK)[0].split()
        nodes = sorted(line for line in lines if line.startswith("nvidia"))
        env = dict(line.split("=", 1) for line in lines if line.startswith("NVIDIA_"))
        return Seen(nodes=nodes, env=env)

    def delete_pod(self, namespace: str, name: str, timeout: float = 120) -> None:
        self.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)

        def gone() -> bool | None:
            try:
                self.core.read_namespaced_pod(name, namespace)
            except ApiException as exc:
                if exc.status == 404:
                    return True
                raise
            return None

        poll(gone, timeout, lambda: f"pod {namespace}/{name} still exists")

    def exec(self, namespace: str, pod: str, command: list[str]) -> str:
        return str(
            stream(
                self.core.connect_get_namespaced_pod_exec,
                pod,
                namespace,
                command=command,
                stderr=True,
                stdin=False,
                stdout=True,
                tty=False,
            )
        )

    # ---- DRA views -------------------------------------------------------------------------

    def claim(self, namespace: str, name: str) -> dict[str, Any]:
        return dict(self.get("resource.k8s.io/v1", "ResourceClaim", name, namespace))

    def pod_claim(self, namespace: str, pod: dict[str, Any], claim: str) -> dict[str, Any]:
        """The ResourceClaim behind the pod's ``resourceClaims`` entry ``claim``."""
        for status in pod["status"].get("resourceClaimStatuses") or []:
            if status["name"] == claim:
                return self.claim(namespace, status["resourceClaimName"])
        for entry in pod["spec"].get("resourceClaims") or []:
            if entry["name"] == claim and entry.get("resourceClaimName"):
                return self.claim(namespace, entry["resourceClaimName"])
        raise AssertionError(f"pod {pod['metadata']['name']} has no claim {claim!r}")

    def slices(self, node: str | None = None) -> list[dict[str, Any]]:
        selector = f"spec.driver={DRIVER}" + (f",spec.nodeName={node}" if node else "")
        return self.list_objects("resource.k8s.io/v1", "ResourceSlice", field_selector=selector)

    def devices(self, node: str) -> dict[str, dict[str, Any]]:
        """Our devices on ``node`` by name (highest pool generation only)."""
        slices = self.slices(node)
        if not slices:
            return {}
        top = max(s["spec"]["pool"]["generation"] for s in slices)
        return {
            d["name"]: d
            for s in slices
            if s["spec"]["pool"]["generation"] == top
            for d in s["spec"].get("devices") or []
        }

    def agent_pod(self, node: str, component: str = "kubelet-plugin") -> dict[str, Any]:
        pods = self.core.list_namespaced_pod(
            AGENT_NAMESPACE,
            label_selector=f"app.kubernetes.io/component={component}",
            field_selector=f"spec.nodeName={node}",
        ).items
        running = [
            p for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp
        ]
        if not running:
            raise AssertionError(f"no running {component} pod on node {node}")
        pod: dict[str, Any] = self.api_client.sanitize_for_serialization(running[0])
        return pod

    def cdi_specs(self, node: str) -> str:
        """``ls`` of the CDI directory as the node's agent sees it."""
        agent = self.agent_pod(node)
        cdi_root = "/var/run/cdi"
        for env in agent["spec"]["containers"][0].get("env") or []:
            if env["name"] == "CDI_ROOT":
                cdi_root = env["value"]
        return self.exec(AGENT_NAMESPACE, agent["metadata"]["name"], ["ls", cdi_root])


@dataclasses.dataclass(frozen=True)
class Seen:
    nodes: list[str]  # e.g. ["nvidia0", "nvidia3"]
    env: dict[str, str]


def attr(device: dict[str, Any], name: str) -> Any:
    """An attribute's value, by bare name (our domain) or fully qualified name."""
    attrs = device.get("attributes") or {}
    value = attrs.get(name) or attrs.get(f"{DRIVER}/{name}")
    if value is None:
        return None
    (only,) = value.values()
    return only


def results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return list((allocation.get("devices") or {}).get("results") or [])


def poll(check: Callable[[], _T | None], timeout: float, what: Callable[[], str]) -> _T:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got is not None:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s: {what()}")
        time.sleep(1)


def node_with(nodes: dict[str, Any], profile: str) -> str:
    """The DRA node running fake ``profile``, or skip the test saying which label is missing."""
    name = nodes.get(profile)
    if not isinstance(name, str):
        pytest.skip(f"needs a DRA node labelled {PROFILE_LABEL}={profile} (e2e/kind-config.yaml)")
    return name
