"""A small, synchronous view of a cluster for the e2e suite (its only importer of the client).

Why it exists: the scenarios read like the issue's list (apply a spec, wait for the pod, look at
what its containers see), so the Kubernetes plumbing (dynamic client, polling, logs, exec) lives
here once. Everything comes from ``KUBECONFIG``; nothing is cluster-specific: scenarios that need
a particular node find it by its fake-profile label or by what its ResourceSlices publish, and
skip (naming the profile and the chart value) where the cluster has none.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
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
NAMESPACE_LABEL = {"e2e": "dra-driver"}  # on every namespace the suite creates
DEFAULT_PLUGINS_DIR = "/var/lib/kubelet/plugins"
_GPU_OF = re.compile(r"^(gpu-\d+)(?:-mig-|$)")  # gpu-3, gpu-3-mig-1g-10gb-0 -> gpu-3
_T = TypeVar("_T")


def load_spec(name: str) -> list[dict[str, Any]]:
    """The objects of ``e2e/specs/<name>.yaml``, in file order."""
    return [obj for obj in yaml.safe_load_all((SPECS / f"{name}.yaml").read_text()) if obj]


def pin(obj: dict[str, Any], node: str) -> dict[str, Any]:
    """``obj`` (a Pod) made to run on ``node`` only: a required node-affinity term on the node's
    name, ANDed with whatever the spec already asks. Not ``spec.nodeName``, which would skip the
    scheduler and so the allocation of the pod's claims."""
    if obj["kind"] != "Pod":
        return obj
    field = {"key": "metadata.name", "operator": "In", "values": [node]}
    required = (
        obj["spec"]
        .setdefault("affinity", {})
        .setdefault("nodeAffinity", {})
        .setdefault("requiredDuringSchedulingIgnoredDuringExecution", {"nodeSelectorTerms": [{}]})
    )
    for term in required["nodeSelectorTerms"]:
        term.setdefault("matchFields", []).append(field)
    return obj


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

    def apply_spec(
        self, name: str, namespace: str, node: str | None = None
    ) -> list[dict[str, Any]]:
        """Create every object of ``e2e/specs/<name>.yaml`` in ``namespace`` (its pods pinned
        to ``node`` if given)."""
        return self.create(load_spec(name), namespace, node=node)

    def create(
        self, objs: Iterable[dict[str, Any]], namespace: str, node: str | None = None
    ) -> list[dict[str, Any]]:
        """Create ``objs`` in order in ``namespace``; pods run ``E2E_WORKLOAD_IMAGE`` if set
        and only on ``node`` if given."""
        created = []
        for obj in objs:
            if obj["kind"] == "Pod" and WORKLOAD_IMAGE:
                for c in obj["spec"]["containers"]:
                    c["image"] = WORKLOAD_IMAGE
            if node is not None:
                pin(obj, node)
            res = self.resource(obj["apiVersion"], obj["kind"])
            created.append(res.create(body=obj, namespace=namespace).to_dict())
        return created

    # ---- namespaces, pods ------------------------------------------------------------------

    def temp_namespace(self, prefix: str) -> Iterator[str]:
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        self.core.create_namespace({"metadata": {"name": name, "labels": NAMESPACE_LABEL}})
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
        """What one container saw: GPU device nodes, NVIDIA_* and CUDA_MPS_* variables and
        the JSON documents it printed (one per line, e.g. its claim metadata file)."""
        lines = self.logs(namespace, name, container).split(READY_MARK)[0].splitlines()
        words = [w for line in lines for w in line.split()]
        nodes = sorted(w for w in words if re.fullmatch(r"nvidia\d+", w))
        env = dict(w.split("=", 1) for w in words if w.startswith(("NVIDIA_", "CUDA_MPS_")))
        docs = [json.loads(line) for line in lines if line.startswith("{")]
        return Seen(nodes=nodes, env=env, documents=docs)

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

    def wait_unschedulable(self, namespace: str, name: str, timeout: float = 90) -> dict[str, Any]:
        """The pod once the scheduler has tried and failed to place it (PodScheduled False)."""

        def unschedulable() -> dict[str, Any] | None:
            pod = self.pod(namespace, name)
            for cond in pod["status"].get("conditions") or []:
                if cond["type"] == "PodScheduled" and cond["status"] == "False":
                    return pod
            assert not pod["spec"].get("nodeName"), f"{namespace}/{name} was scheduled"
            return None

        return poll(unschedulable, timeout, lambda: self.describe(namespace, name))

    def settle(self, keep: str, timeout: float = 90) -> bool:
        """Wait until the namespaces earlier tests left behind (deleted, not waited for) are
        gone, so their claims no longer hold GPUs; False if some are still there at the end."""
        selector = ",".join(f"{k}={v}" for k, v in NAMESPACE_LABEL.items())

        def others() -> list[str]:
            return [
                n.metadata.name
                for n in self.core.list_namespace(label_selector=selector).items
                if n.metadata.name != keep
            ]

        deadline = time.monotonic() + timeout
        while others():
            if time.monotonic() > deadline:
                return False
            time.sleep(2)
        return True

    def run(
        self,
        namespace: str,
        pod: str,
        command: list[str],
        *,
        container: str | None = None,
        timeout: float = 60,
    ) -> Ran:
        """Run ``command`` in a container: exit code, stdout and stderr apart."""
        kwargs: dict[str, Any] = {"container": container} if container else {}
        resp = stream(
            self.core.connect_get_namespaced_pod_exec,
            pod,
            namespace,
            command=command,
            stderr=True,
            stdin=False,
            stdout=True,
            tty=False,
            _preload_content=False,
            **kwargs,
        )
        try:
            resp.run_forever(timeout=timeout)
            if resp.is_open():
                raise AssertionError(f"{' '.join(command)} in {namespace}/{pod}: over {timeout} s")
            out, err = resp.read_stdout(timeout=0), resp.read_stderr(timeout=0)
            return Ran(rc=int(resp.returncode), stdout=str(out or ""), stderr=str(err or ""))
        finally:
            resp.close()

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

    def devices(self, node: str, timeout: float = 30) -> dict[str, dict[str, Any]]:
        """Our devices on ``node`` by name, read from a complete pool (:func:`complete_pool`:
        what the scheduler would use), waiting up to ``timeout`` for one; {} without slices."""
        deadline = time.monotonic() + timeout
        while True:
            slices = self.slices(node)
            if not slices or complete_pool(slices):
                break
            if time.monotonic() > deadline:
                seen = sorted(
                    (s["metadata"]["name"], s["spec"]["pool"]["generation"]) for s in slices
                )
                raise AssertionError(f"node {node}: pool still incomplete after {timeout}s: {seen}")
            time.sleep(0.2)
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

    def wait_cdi_spec(
        self, node: str, claim_uid: str, *, present: bool, timeout: float = 90
    ) -> None:
        """Until the node's CDI directory has (or no longer has) the claim's spec: our spec
        files are named after the claim's UID, so this is "prepared" / "unprepared"."""
        state = "present" if present else "gone"
        poll(
            lambda: True if (claim_uid in self.cdi_specs(node)) == present else None,
            timeout,
            lambda: f"CDI spec of claim {claim_uid} on {node} should be {state}",
        )

    def agent_run(self, node: str, command: list[str], component: str = "kubelet-plugin") -> Ran:
        """``command`` in the node's agent pod, which fails the test unless it exits 0."""
        agent = self.agent_pod(node, component=component)
        ran = self.run(AGENT_NAMESPACE, agent["metadata"]["name"], command)
        assert ran.rc == 0, f"{' '.join(command)} on {node}: exit {ran.rc}: {ran.stderr}"
        return ran

    def plugin_dir(self, node: str) -> str:
        """The DRA agent's own directory, ``<KUBELET_PLUGINS_DIR>/<DRIVER_NAME>``, as its pod
        (and the host: the chart mounts it at the same path) sees it."""
        env = agent_env(self.agent_pod(node))
        plugins = env.get("KUBELET_PLUGINS_DIR", DEFAULT_PLUGINS_DIR)
        return f"{plugins.rstrip('/')}/{env.get('DRIVER_NAME', DRIVER)}"

    def agent_gpus(self, node: str) -> dict[str, dict[str, Any]]:
        """``dra-driver discover -o json`` in the node's DRA agent, by GPU UUID: index, minor
        and the agent's view of its health (conditions, recoveries, holdLeftSeconds)."""
        env = agent_env(self.agent_pod(node))
        ran = self.agent_run(
            node,
            [
                "dra-driver",
                "discover",
                "-o",
                "json",
                "--kubelet-plugins-dir",
                env.get("KUBELET_PLUGINS_DIR", DEFAULT_PLUGINS_DIR),
                "--driver-name",
                env.get("DRIVER_NAME", DRIVER),
            ],
        )
        return {g["uuid"]: g for g in json.loads(ran.stdout)["gpus"]}

    def fake_event(self, node: str, *args: str, component: str = "kubelet-plugin") -> str:
        """``dra-driver fake-event ARGS`` inside the node's agent pod (its environment names the
        agent's directories); what it printed."""
        return self.agent_run(node, ["dra-driver", "fake-event", *args], component).stdout

    def allocated(self, node: str) -> list[dict[str, Any]]:
        """Every ResourceClaim (all namespaces) allocated one of our devices on ``node``."""
        return [
            c
            for c in self.list_objects("resource.k8s.io/v1", "ResourceClaim")
            if any(r["driver"] == DRIVER and r["pool"] == node for r in results(c))
        ]

    def held_gpus(self, node: str) -> set[str]:
        """The GPUs (``gpu-<minor>``) that allocated claims use on ``node``, whole or in part."""
        return {
            gpu_of(r["device"])
            for c in self.allocated(node)
            for r in results(c)
            if r["driver"] == DRIVER and r["pool"] == node
        }


@dataclasses.dataclass(frozen=True)
class Seen:
    nodes: list[str]  # e.g. ["nvidia0", "nvidia3"]
    env: dict[str, str]
    documents: list[dict[str, Any]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Ran:
    rc: int
    stdout: str
    stderr: str


def agent_env(agent: dict[str, Any]) -> dict[str, str]:
    """The plain (``value``) environment of an agent pod's container."""
    env = agent["spec"]["containers"][0].get("env") or []
    return {e["name"]: e["value"] for e in env if "value" in e}


def gpu_of(device: str) -> str:
    """The full GPU a published device is or belongs to: gpu-3-mig-1g-10gb-0 -> gpu-3."""
    found = _GPU_OF.match(device)
    assert found, f"{device} is not one of our GPU or MIG device names"
    return found.group(1)


def dra_driver(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """The ``dra-driver`` CLI of this checkout (the same code as the image kind-up.sh builds)."""
    return subprocess.run(
        [sys.executable, "-m", "dra_driver", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def attr(device: dict[str, Any], name: str) -> Any:
    """An attribute's value, by bare name (our domain) or fully qualified name."""
    attrs = device.get("attributes") or {}
    value = attrs.get(name) or attrs.get(f"{DRIVER}/{name}")
    if value is None:
        return None
    (only,) = value.values()
    return only


def set_ranks(device: dict[str, Any]) -> dict[int, int]:
    """A GPU's set ranks (docs/topology.md), ``{N: rank}`` for N = 1..15 from the digits of its
    ``setRanks`` attribute (digit N from the right); 0 means in no ranked set: the agent gives
    every held or tainted GPU 0. ``{}`` when the GPU carries no ranks."""
    value = attr(device, "setRanks")
    if value is None:
        return {}
    return {size: int(value) // 10 ** (size - 1) % 10 for size in range(1, 16)}


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


def node_with_any(nodes: dict[str, Any], profiles: Iterable[str], why: str = "") -> str:
    """The DRA node of the first of ``profiles`` the cluster has, or skip naming them all."""
    wanted = list(profiles)
    for profile in wanted:
        if isinstance(nodes.get(profile), str):
            return str(nodes[profile])
    labels = " or ".join(f"{PROFILE_LABEL}={p}" for p in wanted)
    pytest.skip(f"needs a DRA node labelled {labels}{why} (e2e/kind-config.yaml)")


def fake_profiles(nodes: dict[str, Any]) -> dict[str, str]:
    """Fake profile -> its DRA node, for every profile the cluster's DRA nodes run."""
    return {k: v for k, v in nodes.items() if isinstance(v, str)}


def complete_pool(slices: list[dict[str, Any]]) -> bool:
    """Whether one node's slices form a complete pool: one generation, and as many slices of it
    as its ``resourceSliceCount`` (mid-rewrite, the scheduler sees no device of the node)."""
    pools = [s["spec"]["pool"] for s in slices]
    generations = {int(p.get("generation") or 0) for p in pools}
    counts = {int(p.get("resourceSliceCount") or 1) for p in pools}
    return len(generations) == 1 and counts == {len(slices)}
