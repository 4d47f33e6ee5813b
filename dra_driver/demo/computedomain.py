"""The ComputeDomain demo scene: a 2-node job on a multi-node NVLink fabric gets IMEX channels.

Steps: four fake GB200 NVL nodes in two NVLink cliques (agents as processes, the second driver
``compute-domain.nvidia.com`` on) publish their channel and daemon devices → the controller
(a process) turns a ComputeDomain for 2 nodes into its claim template and IMEX DaemonSet → the
job's 2 pods land on the two nodes of clique A: their prepares wait (retryable) while the nodes
are bound and the daemon pods start (the stand-in IMEX daemon on each node's address), then get
``/dev/nvidia-caps-imex-channels/channel0`` → both daemons list each other and the domain is
Ready → a third pod on a node of clique B is refused with the reason → deleting the domain (and
the job ending) removes everything: DaemonSet, templates, daemon pods, node labels, IMEX files,
CDI specs, the domain itself.
"""

from __future__ import annotations

import contextlib
import functools
import socket
from pathlib import Path
from typing import Any

import yaml

from dra_driver import computedomain as cd
from dra_driver.computedomain import api as cdapi
from dra_driver.computedomain import imexconfig
from dra_driver.demo import report as reporting
from dra_driver.devices import fake
from dra_driver.kube.objects import COMPUTE_DOMAINS, DAEMON_SETS, PODS, RESOURCE_CLAIM_TEMPLATES
from dra_driver.testing import cdcluster, polling

NAMESPACE = "demo"
NODES = (("nvl-a1", 32766, "127.0.0.11"), ("nvl-a2", 32766, "127.0.0.12"))
NODES_B = (("nvl-b1", 41, "127.0.0.21"), ("nvl-b2", 41, "127.0.0.22"))
DOMAIN = """apiVersion: resource.nvidia.com/v1beta1
kind: ComputeDomain
metadata:
  name: nccl-job
  namespace: demo
spec:
  numNodes: 2
  channel:
    resourceClaimTemplate:
      name: nccl-job-channel"""
Report = reporting.Report


def scene(
    report: Report, *, base: Path, backend: fake.FakeBackend, node_name: str, driver_name: str
) -> None:
    """Run the story on its own four nodes (the scene ignores --fake and the node name)."""
    del backend, node_name, driver_name
    report.section("Four GB200 NVL nodes in two NVLink cliques, agents with --compute-domains")
    cluster = cdcluster.Cluster(base, imex_port=_free_port())
    try:
        _story(report, cluster)
    finally:
        problems = cluster.close()
        report.check(
            not problems,
            "controller, agents and daemons stopped cleanly"
            + (f": {problems}" if problems else ""),
        )


def _story(report: Report, cluster: cdcluster.Cluster) -> None:
    api = cluster.api
    api.put_namespace(NAMESPACE)
    for name, clique, ip in (*NODES, *NODES_B):
        cluster.add_node(name, clique_id=clique, ip=ip)
        slices = polling.wait_for(
            functools.partial(_slices, api, name), what=f"{name}'s compute-domain slice"
        )
        devices = [d["name"] for s in slices for d in s["spec"]["devices"]]
        report.check(
            devices == ["channel-0", "daemon-0"],
            f"{name} (clique ...{clique}, IMEX address {ip}) publishes {', '.join(devices)}",
        )
    cluster.start_controller()
    cluster.daemons.start()

    report.section("A ComputeDomain for 2 nodes (a manifest as written for NVIDIA's driver)")
    report.block(DOMAIN)
    api.objects.create(COMPUTE_DOMAINS, yaml.safe_load(DOMAIN))
    dom = polling.wait_for(lambda: _finalized(api), what="the controller's finalizer")
    uid = dom["metadata"]["uid"]
    template = polling.wait_for(
        lambda: cdcluster.get_object(api, RESOURCE_CLAIM_TEMPLATES, "nccl-job-channel", NAMESPACE),
        what="the workload claim template",
    )
    request = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"]
    report.check(
        request == cd.CHANNEL_CLASS,
        f"the controller made ResourceClaimTemplate nccl-job-channel ({request})",
    )
    ds = polling.wait_for(
        lambda: api.objects.list(DAEMON_SETS, namespace=cdcluster.DRIVER_NS)[0],
        what="the DaemonSet",
    )
    report.check(
        len(ds) == 1,
        f"... and the IMEX DaemonSet {ds[0]['metadata']['name']} "
        f"(for nodes labelled {cd.NODE_LABEL}={uid[:8]}...)",
    )

    report.section("The job's 2 pods land on nvl-a1 and nvl-a2 (clique A)")
    refs = {}
    for index, (node, _, _) in enumerate(NODES):
        refs[node] = cluster.schedule(
            NAMESPACE, "nccl-job-channel", claim=f"nccl-job-{index}", node=node
        )
    for node, ref in refs.items():
        first, answer = cluster.prepare(node, ref, timeout_s=40)
        report.say(f"  {node}: first answer: {_reason(first) or '(none)'}")
        report.check(
            "the kubelet retries" in first,
            f"{node}: prepare waited for the node's IMEX daemon (retryable error)",
        )
        spec = cluster.nodes[node].spec(ref.uid)
        paths = [
            n["path"]
            for d in (spec or {}).get("devices", [])
            for n in d["containerEdits"].get("deviceNodes", [])
        ]
        report.check(
            not answer.error and paths == [cd.channel_path(0)],
            f"{node}: prepared; its CDI spec injects {', '.join(paths) or answer.error}",
        )

    report.section("Both IMEX daemons know each other; the domain is Ready")
    ips = [ip for _, _, ip in NODES]
    for node, _, _ in NODES:
        directory = cluster.nodes[node].domains_dir / uid
        listed = polling.wait_for(
            functools.partial(_daemon_lists, directory, ips),
            what=f"{node}'s daemon",
            timeout_s=20,
        )
        report.check(
            bool(listed),
            f"{node}: nodes.cfg lists {', '.join(imexconfig.read_nodes(directory))}; "
            "its daemon reports READY",
        )
    ready = polling.wait_for(lambda: _status(api) == "Ready", what="status Ready", timeout_s=20)
    obj = api.objects.get(COMPUTE_DOMAINS, "nccl-job", namespace=NAMESPACE)
    report.block(
        "\n".join(
            f"status.nodes: {n.name} {n.ip_address} index {n.index} {n.status}"
            for n in cdapi.Domain.from_obj(obj).nodes
        )
    )
    report.check(bool(ready), "ComputeDomain demo/nccl-job status: Ready")

    report.section("A third pod of the domain lands on nvl-b1 (clique B)")
    third = cluster.schedule(NAMESPACE, "nccl-job-channel", claim="nccl-job-2", node="nvl-b1")
    answer = cluster.nodes["nvl-b1"].kubelet.prepare([third]).claims[third.uid]
    report.say(f"  refused: {_reason(answer.error)}")
    report.check(
        "spans NVLink cliques" in answer.error, "refused, saying why (the domain lives in clique A)"
    )
    labels = api.get_node("nvl-b1")["metadata"].get("labels") or {}
    report.check(
        cd.NODE_LABEL not in labels, "nvl-b1 was not bound to the domain (no daemon started there)"
    )
    report.check(
        cluster.unprepare("nvl-b1", third) == "",
        "the refused pod goes: its claim unprepares cleanly",
    )

    report.section("Delete the ComputeDomain; the job ends")
    api.objects.delete(COMPUTE_DOMAINS, "nccl-job", namespace=NAMESPACE)
    for node, ref in refs.items():
        report.check(
            cluster.unprepare(node, ref) == "", f"{node}: the job's pod ended; its claim unprepared"
        )
    with contextlib.suppress(TimeoutError):  # the check below names what is left
        polling.wait_for(lambda: not _left(cluster), what="everything removed", timeout_s=30)
    left = _left(cluster)
    report.check(
        not left,
        "no domain, DaemonSet, claim template, daemon pod, node label, IMEX file or CDI spec "
        "is left" + (f": {left}" if left else ""),
    )


def _slices(api: Any, node: str) -> list[dict[str, Any]]:
    return list(api.list_resource_slices(driver=cd.DRIVER_NAME, node_name=node)[0])


def _daemon_lists(directory: Path, ips: list[str]) -> bool:
    return imexconfig.read_nodes(directory) == ips and imexconfig.daemon_ready(directory)


def _reason(error: str) -> str:
    """An error without its "ResourceClaim ns/name (uid ...): " prefix."""
    return error.split("): ", 1)[-1]


def _finalized(api: Any) -> dict[str, Any] | None:
    obj = cdcluster.get_object(api, COMPUTE_DOMAINS, "nccl-job", NAMESPACE)
    return obj if obj and cd.FINALIZER in (obj["metadata"].get("finalizers") or ()) else None


def _status(api: Any) -> str:
    obj = cdcluster.get_object(api, COMPUTE_DOMAINS, "nccl-job", NAMESPACE)
    return str(((obj or {}).get("status") or {}).get("status") or "")


def _left(cluster: cdcluster.Cluster) -> list[str]:
    api = cluster.api
    left = [
        f"{k.kind} {o['metadata']['name']}"
        for k in (COMPUTE_DOMAINS, DAEMON_SETS, RESOURCE_CLAIM_TEMPLATES, PODS)
        for o in api.objects.all(k)
    ]
    for node in cluster.nodes.values():
        if cd.NODE_LABEL in (api.get_node(node.name)["metadata"].get("labels") or {}):
            left.append(f"label on {node.name}")
        if node.domains_dir.is_dir() and any(node.domains_dir.iterdir()):
            left.append(f"IMEX files on {node.name}")
        specs = (
            list(node.plugin.cdi_root.glob(f"k8s.{cd.DRIVER_NAME}-*.json"))
            if node.plugin.cdi_root.is_dir()
            else []
        )
        if specs:
            left.append(f"CDI specs on {node.name}")
    return left


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
