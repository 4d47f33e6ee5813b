"""Claim lifecycle on the node: deleting the pod unprepares (its CDI spec goes), and a restarted
agent keeps prepared claims working and still unprepares them."""

from __future__ import annotations

from typing import Any

import cluster as kube


def _spec_present(cluster: kube.Cluster, node: str, claim_uid: str) -> bool:
    return claim_uid in cluster.cdi_specs(node)


def _wait_spec(cluster: kube.Cluster, node: str, uid: str, present: bool) -> None:
    kube.poll(
        lambda: True if _spec_present(cluster, node, uid) == present else None,
        90,
        lambda: f"CDI spec of claim {uid} on {node} should be {'present' if present else 'gone'}",
    )


def test_pod_deletion_unprepares(cluster: kube.Cluster, ns: str) -> None:
    cluster.apply_spec("one-gpu", ns)
    pod = cluster.wait_running(ns, "one-gpu")
    node = pod["spec"]["nodeName"]
    uid = cluster.pod_claim(ns, pod, "gpu")["metadata"]["uid"]
    assert _spec_present(cluster, node, uid), f"no CDI spec for claim {uid} on {node}"
    cluster.delete_pod(ns, "one-gpu")
    _wait_spec(cluster, node, uid, present=False)


def test_agent_restart_keeps_prepared_claims(cluster: kube.Cluster, ns: str) -> None:
    cluster.apply_spec("one-gpu", ns)
    pod = cluster.wait_running(ns, "one-gpu")
    node = pod["spec"]["nodeName"]
    uid = cluster.pod_claim(ns, pod, "gpu")["metadata"]["uid"]
    old = cluster.agent_pod(node)
    cluster.core.delete_namespaced_pod(old["metadata"]["name"], kube.AGENT_NAMESPACE)

    def new_agent_ready() -> dict[str, Any] | None:
        try:
            agent = cluster.agent_pod(node)
        except AssertionError:
            return None
        if agent["metadata"]["uid"] == old["metadata"]["uid"]:
            return None
        ready = [c for c in agent["status"].get("conditions") or [] if c["type"] == "Ready"]
        return agent if ready and ready[0]["status"] == "True" else None

    kube.poll(new_agent_ready, 180, lambda: f"no new ready agent on {node}")
    # the running workload was never touched and its spec survived the restart
    assert cluster.pod(ns, "one-gpu")["status"]["phase"] == "Running"
    assert _spec_present(cluster, node, uid)
    # the new agent prepares new claims ...
    cluster.apply_spec("shared-claim-containers", ns)
    cluster.wait_running(ns, "two-containers")
    # ... and unprepares the claim its predecessor prepared (from the checkpoint)
    cluster.delete_pod(ns, "one-gpu")
    _wait_spec(cluster, node, uid, present=False)
