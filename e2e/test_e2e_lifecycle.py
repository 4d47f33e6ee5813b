"""Claim lifecycle on the node: deleting the pod unprepares (its CDI spec goes), a restarted
agent keeps prepared claims working and still unprepares them, and so does a rolling update of
the agent's DaemonSet, during which new pods still get GPUs."""

from __future__ import annotations

import uuid
from typing import Any

import cluster as kube
from kubernetes import client

ROLL_ENV = "E2E_ROLLOUT"  # the env change that rolls the DaemonSet (left in place afterwards)


def _spec_present(cluster: kube.Cluster, node: str, claim_uid: str) -> bool:
    return claim_uid in cluster.cdi_specs(node)


def _wait_spec(cluster: kube.Cluster, node: str, uid: str, present: bool) -> None:
    cluster.wait_cdi_spec(node, uid, present=present)


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


def _daemonset_of(agent: dict[str, Any]) -> str:
    (owner,) = [o for o in agent["metadata"]["ownerReferences"] if o["kind"] == "DaemonSet"]
    return str(owner["name"])


def _rolled_out(apps: client.AppsV1Api, name: str) -> bool | None:
    ds = apps.read_namespaced_daemon_set(name, kube.AGENT_NAMESPACE)
    status, meta = ds.status, ds.metadata
    if status is None or meta is None:
        return None
    want = status.desired_number_scheduled
    done = (
        (status.observed_generation or 0) >= (meta.generation or 0)
        and status.updated_number_scheduled == want
        and status.number_available == want
        and not status.number_unavailable
    )
    return True if done else None


def test_rolling_update_keeps_claims_and_serves_new_pods(
    cluster: kube.Cluster, ns: str, nodes: dict[str, Any]
) -> None:
    """An env change rolls the agent DaemonSet of one node while a claim is prepared there: the
    running pod and its CDI spec stay, pods created during and after the roll get GPUs, and the
    new agent unprepares the claim the old one prepared."""
    node = kube.fake_profiles(nodes).get("dgx-h100") or nodes["dra"][0]  # 3 free GPUs wanted
    template, before, during, after = kube.load_spec("rollout")
    cluster.create([template, before], ns, node=node)
    pod = cluster.wait_running(ns, "before-roll")
    container_id = pod["status"]["containerStatuses"][0]["containerID"]
    uid = cluster.pod_claim(ns, pod, "gpu")["metadata"]["uid"]
    assert _spec_present(cluster, node, uid), f"no CDI spec for claim {uid} on {node}"

    old = cluster.agent_pod(node)
    name = _daemonset_of(old)
    token = uuid.uuid4().hex[:12]
    apps = client.AppsV1Api(cluster.api_client)
    patch = {
        "name": old["spec"]["containers"][0]["name"],
        "env": [{"name": ROLL_ENV, "value": token}],
    }
    apps.patch_namespaced_daemon_set(
        name, kube.AGENT_NAMESPACE, {"spec": {"template": {"spec": {"containers": [patch]}}}}
    )
    cluster.create([during], ns, node=node)  # its claim is prepared by whichever agent serves

    kube.poll(lambda: _rolled_out(apps, name), 240, lambda: f"DaemonSet {name} did not roll out")
    new = cluster.agent_pod(node)
    assert new["metadata"]["uid"] != old["metadata"]["uid"], f"the agent on {node} was not replaced"
    assert kube.agent_env(new).get(ROLL_ENV) == token, kube.agent_env(new)

    cluster.create([after], ns, node=node)
    gpus = {}
    for late in ("during-roll", "after-roll"):
        running = cluster.wait_running(ns, late)
        (result,) = kube.results(cluster.pod_claim(ns, running, "gpu"))
        gpus[late] = result["device"]
    # The pod that ran through the roll was never touched, and its claim is still prepared.
    pod = cluster.pod(ns, "before-roll")
    assert pod["status"]["phase"] == "Running"
    (status,) = pod["status"]["containerStatuses"]
    assert status["containerID"] == container_id and status["restartCount"] == 0, status
    assert _spec_present(cluster, node, uid), f"the roll removed the CDI spec of claim {uid}"
    (result,) = kube.results(cluster.pod_claim(ns, pod, "gpu"))
    gpus["before-roll"] = result["device"]
    assert len(set(gpus.values())) == 3, f"GPUs given twice: {gpus}"
    # The new agent unprepares what the old one prepared.
    cluster.delete_pod(ns, "before-roll")
    _wait_spec(cluster, node, uid, present=False)
