"""ComputeDomain test kit, part two: a small cluster of fake NVL nodes, every part a process.

Why it exists: a ComputeDomain involves the controller, several node agents, the scheduler, the
DaemonSet controller and the kubelet; the demo and the process tests need all of them without a
cluster. Real here: the in-memory API server over loopback HTTP (with our CRD registered), the
node agents (``dra-driver kubelet-plugin --compute-domains`` processes, one per node, each on
its own loopback address 127.0.0.x where its IMEX daemon listens), the controller
(``dra-driver controller`` process), the IMEX daemons (the DaemonSet's own command, run with the
environment and the ``/imexd`` mount their CDI spec gives them). Stand-ins: the scheduler
(:func:`~dra_driver.testing.cdalloc.allocate` with the shipped DeviceClasses), the kubelet
(:class:`~dra_driver.testing.kubeletsim.KubeletSim` on each agent's compute-domain sockets) and
the DaemonSet controller (:class:`DaemonPods`: one daemon Pod per DaemonSet and node its
nodeSelector matches, its claim allocated, prepared, its container started; torn down in
reverse when the node no longer matches or the DaemonSet or Pod is gone).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import grpc
import yaml

from dra_driver import computedomain as cd
from dra_driver.computedomain import api as cdapi
from dra_driver.devices.fake import profiles
from dra_driver.driver import claims
from dra_driver.kube import api
from dra_driver.kube.objects import DAEMON_SETS, PODS, RESOURCE_CLAIM_TEMPLATES, owner_reference
from dra_driver.testing import cdalloc, polling
from dra_driver.testing import kubeletsim as sim
from dra_driver.testing.fakeapi import fakeserver, memory

DRIVER_NS = "dra-driver"


@dataclasses.dataclass
class Node:
    name: str
    ip: str
    clique_id: int
    plugin: sim.PluginProcess
    kubelet: sim.KubeletSim

    def spec(self, claim_uid: str) -> dict[str, Any] | None:
        path = self.plugin.cdi_root / f"k8s.{cd.DRIVER_NAME}-claim_{claim_uid}.json"
        return json.loads(path.read_text()) if path.exists() else None

    @property
    def domains_dir(self) -> Path:
        return self.plugin.plugins_dir / cd.DRIVER_NAME / "domains"


@dataclasses.dataclass
class DaemonPod:
    pod: str
    node: Node
    ref: claims.ClaimRef
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None


class Cluster:
    """Start with :meth:`add_node` and :meth:`start_controller`; :meth:`close` stops all."""

    def __init__(self, base: Path, *, imex_port: int) -> None:
        self.base = base
        self.imex_port = imex_port
        base.mkdir(parents=True, exist_ok=True)
        self.server = fakeserver.FakeApiServer(memory.InMemoryApi()).start()
        self.api: memory.InMemoryApi = self.server.api
        cdapi.register(self.api.objects)
        self.api.put_namespace(DRIVER_NS)
        self.kubeconfig = self.server.write_kubeconfig(base / "kubeconfig")
        self.nodes: dict[str, Node] = {}
        self.controllers: list[subprocess.Popen[bytes]] = []
        self.daemons = DaemonPods(self)

    # ------------------------------------------------------------------ parts
    def add_node(
        self, name: str, *, clique_id: int, ip: str, profile: profiles.Profile | None = None
    ) -> Node:
        """A node agent on ``gb200-nvl`` in ``clique_id`` (or on ``profile``)."""
        self.api.put_node(name, uid=str(uuid.uuid4()))
        base = self.base / name
        base.mkdir(parents=True, exist_ok=True)
        profile_file = base / "profile.yaml"
        dumped = profiles.dump(profile or cdalloc.nvl_profile(clique_id))
        profile_file.write_text(yaml.safe_dump(dumped), encoding="utf-8")
        plugin = sim.PluginProcess(
            base=base,
            kubeconfig=self.kubeconfig,
            node=name,
            fake_file=profile_file,
            publish=True,
            extra=[
                "--compute-domains",
                "--node-ip",
                ip,
                "--imex-port",
                str(self.imex_port),
                "--imex-check-interval",
                "0.2",
            ],
        ).start()
        plugin.wait_ready()
        kubelet = sim.KubeletSim(plugin.registry_dir)
        kubelet.register(cd.DRIVER_NAME)
        node = Node(name=name, ip=ip, clique_id=clique_id, plugin=plugin, kubelet=kubelet)
        self.nodes[name] = node
        return node

    def restart_node(self, name: str, *, env: dict[str, str] | None = None) -> Node:
        """Start ``name``'s agent again (killed first if it runs), with ``env`` added."""
        node = self.nodes[name]
        node.kubelet.close()
        node.plugin.kill()
        saved = {k: os.environ.get(k) for k in env or {}}
        os.environ.update(env or {})
        try:
            node.plugin.start()
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        node.plugin.wait_ready()
        node.kubelet = sim.KubeletSim(node.plugin.registry_dir)
        node.kubelet.register(cd.DRIVER_NAME)
        return node

    def start_controller(self, identity: str = "controller-0") -> subprocess.Popen[bytes]:
        log = (self.base / f"{identity}.log").open("ab")
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dra_driver",
                "--log-format",
                "json",
                "controller",
                "--kubeconfig",
                str(self.kubeconfig),
                "--namespace",
                DRIVER_NS,
                "--identity",
                identity,
                "--fake-imex",
                "--resync",
                "1",
                "--lease-duration",
                "3",
                "--renew-interval",
                "1",
                "--metrics-address",
                "127.0.0.1",
                "--metrics-port",
                "0",
            ],
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        self.controllers.append(proc)
        return proc

    # ------------------------------------------------------------------ scheduling and kubelet
    def schedule(self, namespace: str, template: str, *, claim: str, node: str) -> claims.ClaimRef:
        """The claim of a pod on ``node`` from ``template`` (waits for the controller's)."""
        tmpl = polling.wait_for(
            lambda: get_object(self.api, RESOURCE_CLAIM_TEMPLATES, template, namespace),
            what=f"ResourceClaimTemplate {namespace}/{template}",
        )
        obj = cdalloc.allocate(self.api, tmpl, name=claim, node=node, pod=claim)
        meta = obj["metadata"]
        return claims.ClaimRef(uid=meta["uid"], namespace=meta["namespace"], name=meta["name"])

    def prepare(
        self, node: str, ref: claims.ClaimRef, *, timeout_s: float = 30.0
    ) -> tuple[str, Any]:
        """Prepare as the kubelet does: retried until it succeeds (or ``timeout_s``). Returns
        the first error answered ("" if none) and the last answer."""
        first = ""
        deadline = time.monotonic() + timeout_s
        while True:
            answer = self.nodes[node].kubelet.prepare([ref]).claims[ref.uid]
            if not answer.error or time.monotonic() > deadline:
                return first, answer
            first = first or answer.error
            time.sleep(0.2)

    def unprepare(self, node: str, ref: claims.ClaimRef) -> str:
        error = str(self.nodes[node].kubelet.unprepare([ref]).claims[ref.uid].error)
        if not error:
            with contextlib.suppress(api.NotFound):
                self.api.delete_resource_claim(ref.namespace, ref.name)
        return error

    def close(self) -> list[str]:
        """Stop everything; what did not stop cleanly."""
        problems = self.daemons.stop()
        for proc in self.controllers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    problems.append("a controller did not stop on SIGTERM")
        for node in self.nodes.values():
            node.kubelet.close()
            if node.plugin.proc is not None and node.plugin.proc.poll() is None:
                node.plugin.signal(signal.SIGTERM)
                try:  # the agent's own shutdown deadline (--shutdown-timeout) is 25 s
                    code = node.plugin.wait(30)
                except subprocess.TimeoutExpired:
                    node.plugin.kill()
                    problems.append(f"the agent of {node.name} did not stop on SIGTERM")
                    continue
                if code != 0:
                    stuck = node.plugin.stuck_at_stop()
                    problems.append(
                        f"the agent of {node.name} exited {code} on SIGTERM"
                        + (f": {stuck}" if stuck else "")
                    )
        self.server.stop()
        return problems


class DaemonPods:
    """The DaemonSet controller and the kubelet for the IMEX daemon pods (a thread)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.pods: dict[tuple[str, str], DaemonPod] = {}
        self.events: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lock = threading.Lock()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="daemonsets", daemon=True)
        self._thread.start()

    def stop(self) -> list[str]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        problems = []
        for key in list(self.pods):
            problems += self._remove(key)
        return problems

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            # ValueError: a node's kubelet channel closed under the step (the test restarted
            # that node's agent and its kubelet stand-in); a kubelet retries at the next turn.
            except (api.ApiError, OSError, RuntimeError, ValueError, grpc.RpcError) as exc:
                self.events.append(f"daemon pods step failed: {exc}")
            self._stop.wait(0.1)

    def step(self) -> None:
        cluster = self.cluster
        sets, _ = cluster.api.objects.list(DAEMON_SETS, namespace=DRIVER_NS)
        wanted: dict[tuple[str, str], dict[str, Any]] = {}
        for ds in sets:
            selector = ds["spec"]["template"]["spec"].get("nodeSelector") or {}
            for node in list(cluster.nodes.values()):  # a test may add a node meanwhile
                labels = cluster.api.get_node(node.name)["metadata"].get("labels") or {}
                if all(labels.get(k) == v for k, v in selector.items()):
                    wanted[(ds["metadata"]["name"], node.name)] = ds
        with self.lock:
            for key in [k for k in self.pods if k not in wanted or not self._pod_exists(k)]:
                self.events += self._remove(key)
            for key, ds in wanted.items():
                if key not in self.pods:
                    self._create(key, ds)
                self._advance(key, ds)

    def _pod_exists(self, key: tuple[str, str]) -> bool:
        return get_object(self.cluster.api, PODS, self.pods[key].pod, DRIVER_NS) is not None

    def _create(self, key: tuple[str, str], ds: dict[str, Any]) -> None:
        ds_name, node_name = key
        node = self.cluster.nodes[node_name]
        template = ds["spec"]["template"]
        pod_name = f"{ds_name[:50]}-{node_name}"
        self.cluster.api.objects.create(
            PODS,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": pod_name,
                    "namespace": DRIVER_NS,
                    "labels": template["metadata"]["labels"],
                    "ownerReferences": [owner_reference(ds)],
                },
                "spec": {**template["spec"], "nodeName": node_name},
            },
        )
        (claim,) = template["spec"]["resourceClaims"]
        tmpl = self.cluster.api.objects.get(
            RESOURCE_CLAIM_TEMPLATES, claim["resourceClaimTemplateName"], namespace=DRIVER_NS
        )
        obj = cdalloc.allocate(
            self.cluster.api, tmpl, name=f"{pod_name}-daemon", node=node_name, pod=pod_name
        )
        meta = obj["metadata"]
        ref = claims.ClaimRef(uid=meta["uid"], namespace=meta["namespace"], name=meta["name"])
        self.pods[key] = DaemonPod(pod=pod_name, node=node, ref=ref)
        self.events.append(f"daemon pod {pod_name} created on {node_name}")

    def _advance(self, key: tuple[str, str], ds: dict[str, Any]) -> None:
        """Prepare the pod's claim (once per step until it works), then start its container."""
        pod = self.pods[key]
        if pod.proc is not None:
            return
        answer = pod.node.kubelet.prepare([pod.ref]).claims[pod.ref.uid]
        if answer.error:
            return
        spec = pod.node.spec(pod.ref.uid)
        if spec is None:
            raise RuntimeError(f"no CDI spec for the daemon claim of {pod.pod}")
        (device,) = spec["devices"]
        edits = device["containerEdits"]
        env = dict(os.environ)
        env.update(e.split("=", 1) for e in edits.get("env") or ())
        mounts = {m["containerPath"]: m["hostPath"] for m in edits.get("mounts") or ()}
        (container,) = ds["spec"]["template"]["spec"]["containers"]
        argv = [mounts.get(a, a) for a in container["command"]]
        if argv[0] == "python":
            argv[0] = sys.executable
        pod.log = self.cluster.base / pod.node.name / f"{pod.pod}.log"
        with pod.log.open("ab") as log:
            pod.proc = subprocess.Popen(
                argv, env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL
            )
        self.events.append(f"daemon pod {pod.pod} running on {pod.node.name}")

    def _remove(self, key: tuple[str, str]) -> list[str]:
        pod = self.pods[key]  # dropped last: while it is listed, it is not gone
        problems = []
        if pod.proc is not None and pod.proc.poll() is None:
            pod.proc.send_signal(signal.SIGTERM)
            try:
                pod.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pod.proc.kill()
                problems.append(f"daemon of {pod.pod} ignored SIGTERM")
        error = pod.node.kubelet.unprepare([pod.ref]).claims[pod.ref.uid].error
        if error:
            problems.append(f"unprepare of {pod.pod}'s claim: {error}")
        with contextlib.suppress(api.NotFound):
            self.cluster.api.delete_resource_claim(pod.ref.namespace, pod.ref.name)
        with contextlib.suppress(api.NotFound):
            self.cluster.api.objects.delete(PODS, pod.pod, namespace=DRIVER_NS)
        self.events.append(f"daemon pod {pod.pod} removed from {pod.node.name}")
        del self.pods[key]
        return problems


def get_object(
    mem: memory.InMemoryApi, kind: Any, name: str, namespace: str
) -> dict[str, Any] | None:
    try:
        return mem.objects.get(kind, name, namespace=namespace)
    except api.NotFound:
        return None
