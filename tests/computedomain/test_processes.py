"""ComputeDomains with every part a process, as the existing process tests run the agent:
node agents with --compute-domains on fake NVL nodes, the controller, the stand-in IMEX daemons
(see :mod:`dra_driver.testing.cdcluster`), against the in-memory API server over HTTP."""

from __future__ import annotations

import json
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from dra_driver import cdagent as agent
from dra_driver import computedomain as cd
from dra_driver.computedomain import api as cdapi
from dra_driver.computedomain import imexconfig
from dra_driver.devices.fake import profiles
from dra_driver.kube.objects import COMPUTE_DOMAINS, DAEMON_SETS, LEASES, RESOURCE_CLAIM_TEMPLATES
from dra_driver.testing import cdcluster, polling
from dra_driver.testing import kubeletsim as sim

NS = "team"
DOMAIN = """
apiVersion: resource.nvidia.com/v1beta1
kind: ComputeDomain
metadata: {name: job, namespace: team}
spec:
  numNodes: %d
  channel: {resourceClaimTemplate: {name: job-channel}}
"""


@pytest.fixture
def cluster() -> Iterator[cdcluster.Cluster]:
    base = Path(tempfile.mkdtemp(prefix="cd-", dir="/tmp"))  # short: unix socket paths
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    made = cdcluster.Cluster(base, imex_port=port)
    made.api.put_namespace(NS)
    try:
        yield made
    finally:
        made.close()
        shutil.rmtree(base, ignore_errors=True)


def _slices(c: cdcluster.Cluster, node: str) -> list[str]:
    found, _ = c.api.list_resource_slices(driver=cd.DRIVER_NAME, node_name=node)
    return [d["name"] for s in found for d in s["spec"]["devices"]]


def _label(c: cdcluster.Cluster, node: str) -> str | None:
    labels = c.api.get_node(node)["metadata"].get("labels") or {}
    return labels.get(cd.NODE_LABEL)


def _entries(c: cdcluster.Cluster) -> dict[str, str]:
    obj = cdcluster.get_object(c.api, COMPUTE_DOMAINS, "job", NS)
    return {n.name: n.status for n in cdapi.Domain.from_obj(obj or {}).nodes}


def _domain(c: cdcluster.Cluster, nodes: int) -> dict[str, Any]:
    c.api.objects.create(COMPUTE_DOMAINS, yaml.safe_load(DOMAIN % nodes))
    return polling.wait_for(
        lambda: (
            cdcluster.get_object(c.api, RESOURCE_CLAIM_TEMPLATES, "job-channel", NS)
            and cdcluster.get_object(c.api, COMPUTE_DOMAINS, "job", NS)
        ),
        what="the controller's objects",
    )  # type: ignore[no-any-return]


def test_two_node_job_end_to_end_and_refusals(cluster: cdcluster.Cluster) -> None:
    cluster.add_node("a1", clique_id=7, ip="127.0.0.31")
    cluster.add_node("a2", clique_id=7, ip="127.0.0.32")
    cluster.add_node("b1", clique_id=8, ip="127.0.0.41")
    cluster.add_node(
        "pcie", clique_id=0, ip="127.0.0.51", profile=profiles.load_builtin("dgx-h100")
    )
    # channels (and the daemon device) only on nodes in a clique
    for node in ("a1", "a2", "b1"):
        assert polling.wait_for(lambda n=node: _slices(cluster, n), what=node) == [
            "channel-0",
            "daemon-0",
        ]
    ready = [
        json.loads(line)
        for line in cluster.nodes["pcie"].plugin.log().splitlines()
        if '"ComputeDomain driver ready"' in line
    ]
    assert [r["clique"] for r in ready] == ["none"]
    time.sleep(0.5)  # its publisher has run (GPU slices are there): none of ours
    assert cluster.api.list_resource_slices(driver="gpu.nvidia.com", node_name="pcie")[0]
    assert _slices(cluster, "pcie") == []
    cluster.start_controller()
    cluster.daemons.start()
    dom = _domain(cluster, 2)
    uid = dom["metadata"]["uid"]
    refs = {
        n: cluster.schedule(NS, "job-channel", claim=f"job-{i}", node=n)
        for i, n in enumerate(("a1", "a2"))
    }
    for node, ref in refs.items():
        first, answer = cluster.prepare(node, ref, timeout_s=40)
        assert "waiting for the IMEX daemon" in first and "the kubelet retries" in first
        assert answer.error == ""
        (device,) = answer.devices
        assert list(device.cdi_device_ids) == [
            f"k8s.compute-domain.nvidia.com/claim={ref.uid}-channel-0"
        ]
        (spec_dev,) = (cluster.nodes[node].spec(ref.uid) or {})["devices"]
        assert spec_dev["containerEdits"]["deviceNodes"] == [
            {"path": "/dev/nvidia-caps-imex-channels/channel0", "hostPath": "/dev/null"}
        ]
    for node in ("a1", "a2"):
        directory = cluster.nodes[node].domains_dir / uid
        polling.wait_for(
            lambda d=directory: (
                imexconfig.read_nodes(d) == ["127.0.0.31", "127.0.0.32"]
                and imexconfig.daemon_ready(d)
            ),
            what=f"{node}'s daemon lists both and is ready",
        )
    polling.wait_for(
        lambda: (
            (cdcluster.get_object(cluster.api, COMPUTE_DOMAINS, "job", NS) or {})
            .get("status", {})
            .get("status")
            == "Ready"
        ),
        what="the domain Ready",
    )
    # a third pod in the other clique: refused, in words, nothing changed on its node
    third = cluster.schedule(NS, "job-channel", claim="job-2", node="b1")
    error = cluster.nodes["b1"].kubelet.prepare([third]).claims[third.uid].error
    assert "spans NVLink cliques" in error and "a1, a2" in error
    assert _label(cluster, "b1") is None and set(_entries(cluster)) == {"a1", "a2"}
    assert cluster.unprepare("b1", third) == ""
    # the domain goes, the job ends: nothing is left anywhere
    cluster.api.objects.delete(COMPUTE_DOMAINS, "job", namespace=NS)
    for node, ref in refs.items():
        assert cluster.unprepare(node, ref) == ""
    polling.wait_for(
        lambda: (
            not any(
                cluster.api.objects.all(k)
                for k in (COMPUTE_DOMAINS, DAEMON_SETS, RESOURCE_CLAIM_TEMPLATES)
            )
        ),
        what="domain, DaemonSet and templates gone",
    )
    polling.wait_for(lambda: not cluster.daemons.pods, what="daemon pods gone")
    for node in ("a1", "a2", "b1"):
        assert _label(cluster, node) is None
        assert not any(cluster.nodes[node].domains_dir.glob("*"))
        assert not list(cluster.nodes[node].plugin.cdi_root.glob("k8s.compute-domain*"))


@pytest.mark.parametrize("step", ["recorded", "joined", "labelled", "spec-written"])
def test_agent_killed_at_each_step_of_a_channel_prepare_leaves_nothing_behind(
    cluster: cdcluster.Cluster, step: str
) -> None:
    cluster.add_node("a1", clique_id=7, ip="127.0.0.33")
    cluster.start_controller()
    cluster.daemons.start()
    dom = _domain(cluster, 1)
    ref = cluster.schedule(NS, "job-channel", claim="job-0", node="a1")
    if step == "spec-written":  # get as far as the spec: the daemon must be ready first
        answer = cluster.nodes["a1"].kubelet.prepare([ref]).claims[ref.uid]
        assert "waiting for the IMEX daemon" in answer.error
        polling.wait_for(lambda: _entries(cluster).get("a1") == "Ready", what="daemon ready")
    cluster.restart_node("a1", env={agent.CRASH_ENV: step})
    with pytest.raises(grpc.RpcError):
        cluster.nodes["a1"].kubelet.prepare([ref])
    assert cluster.nodes["a1"].plugin.wait(10) == 137
    cluster.restart_node("a1")  # recovery, then the kubelet gives up on the pod: unprepare
    assert cluster.unprepare("a1", ref) == ""
    polling.wait_for(
        lambda: not cluster.daemons.pods, what="the daemon pod leaves the unbound node"
    )
    assert _label(cluster, "a1") is None
    assert _entries(cluster) == {}
    assert not any(cluster.nodes["a1"].domains_dir.glob("*"))
    assert not list(cluster.nodes["a1"].plugin.cdi_root.glob("k8s.compute-domain*"))
    assert dom["metadata"]["uid"]


def test_agent_killed_while_writing_the_imex_config_leaves_no_config(
    cluster: cdcluster.Cluster,
) -> None:
    cluster.add_node("a1", clique_id=7, ip="127.0.0.34")
    cluster.start_controller()
    dom = _domain(cluster, 1)
    ref = cluster.schedule(NS, "job-channel", claim="job-0", node="a1")
    assert "waiting" in cluster.nodes["a1"].kubelet.prepare([ref]).claims[ref.uid].error
    daemon_tmpl = f"imex-{dom['metadata']['uid']}"
    daemon = cluster.schedule(cdcluster.DRIVER_NS, daemon_tmpl, claim="imex-a1", node="a1")
    cluster.restart_node("a1", env={agent.CRASH_ENV: "configured"})
    with pytest.raises(grpc.RpcError):
        cluster.nodes["a1"].kubelet.prepare([daemon])
    assert cluster.nodes["a1"].plugin.wait(10) == 137
    assert any(cluster.nodes["a1"].domains_dir.glob("*"))  # half-written, as the crash left it
    cluster.api.delete_resource_claim(cdcluster.DRIVER_NS, "imex-a1")  # the pod went meanwhile
    cluster.restart_node("a1")
    assert not any(cluster.nodes["a1"].domains_dir.glob("*"))
    assert cluster.unprepare("a1", ref) == ""
    assert _label(cluster, "a1") is None and _entries(cluster) == {}


def test_two_controller_processes_one_leader_and_a_takeover(cluster: cdcluster.Cluster) -> None:
    one = cluster.start_controller("one")
    two = cluster.start_controller("two")

    def holder() -> str:
        lease = cdcluster.get_object(
            cluster.api, LEASES, "dra-driver-compute-domain-controller", cdcluster.DRIVER_NS
        )
        return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")

    first = polling.wait_for(holder, what="a leader")
    _domain(cluster, 1)
    polling.wait_for(lambda: cluster.api.objects.all(DAEMON_SETS), what="the leader's DaemonSet")
    logs = {name: (cluster.base / f"{name}.log").read_text() for name in ("one", "two")}
    assert [name for name, text in logs.items() if '"became the leader"' in text] == [first]
    leader_proc, other = (one, "two") if first == "one" else (two, "one")
    leader_proc.kill()  # no release: the other waits the lease out, then takes over
    leader_proc.wait(10)
    polling.wait_for(lambda: holder() == other, what="the takeover", timeout_s=20)
    cluster.api.objects.delete(COMPUTE_DOMAINS, "job", namespace=NS)
    polling.wait_for(
        lambda: (
            not cluster.api.objects.all(COMPUTE_DOMAINS)
            and not cluster.api.objects.all(DAEMON_SETS)
        ),
        what="the new leader's clean-up",
    )


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--compute-domains"], "needs this node's IP (--node-ip"),
        (
            [
                "--compute-domains",
                "--node-ip",
                "127.0.0.9",
                "--pod-uid",
                "0b8e1f2c-1111-4222-8333-444455556666",
            ],
            "does not support seamless upgrades",
        ),
    ],
)
def test_the_agent_refuses_to_start_a_half_configured_compute_domain_driver(
    cluster: cdcluster.Cluster, extra: list[str], needle: str
) -> None:
    cluster.api.put_node("n1")
    plugin = sim.PluginProcess(
        base=cluster.base, kubeconfig=cluster.kubeconfig, node="n1", fake="gb200-nvl", extra=extra
    )
    plugin.start()
    assert plugin.wait(30) == 1
    assert needle in plugin.log()
