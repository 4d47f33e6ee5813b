"""Dynamic MIG (docs/mig.md) on a real cluster: the scheduler picks two placements of different
profiles on one GPU from the published counters, the node agent creates both MIG instances at
prepare (the container's claim metadata names them), holds the GPU (set ranks 0) and destroys
the instances when the pod goes.

Needs a node whose agent publishes dynamic MIG placements of an H100 80GB (profiles 3g.40gb and
2g.20gb): fake profile h100-mig or dgx-h100 with ``kubeletPlugin.dynamicMig`` matching it."""

from __future__ import annotations

import json
from typing import Any

import cluster as kube
import pytest

PROFILES = {"big": "3g.40gb", "small": "2g.20gb"}  # request -> MIG profile (mig-two-profiles)
PREFERRED = ("h100-mig", "dgx-h100")


def placements(cluster: kube.Cluster, node: str) -> dict[str, dict[str, Any]]:
    """The node's dynamic MIG devices: MIG devices without a uuid (no instance exists yet)."""
    return {
        n: d
        for n, d in cluster.devices(node).items()
        if kube.attr(d, "type") == "mig" and kube.attr(d, "uuid") is None
    }


def mig_node(cluster: kube.Cluster, nodes: dict[str, Any]) -> str:
    profiles = kube.fake_profiles(nodes)
    for profile in PREFERRED:
        node = profiles.get(profile)
        if node is None:
            continue
        offered = {kube.attr(d, "profile") for d in placements(cluster, node).values()}
        if set(PROFILES.values()) <= offered:
            return node
    pytest.skip(
        f"needs a DRA node with dynamic MIG placements of {' and '.join(PROFILES.values())}: "
        f"fake profile {' or '.join(PREFERRED)} with kubeletPlugin.dynamicMig matching it "
        "(e2e/values-kind.yaml: 'auto:H100 80GB'; an auto: value publishes no placements "
        "where the API server drops shared counters)"
    )


def instances(cluster: kube.Cluster, node: str, parent: str) -> list[dict[str, Any]]:
    """The MIG instances the fake NVML of the node's agent holds on GPU ``parent`` (its
    state file, which outlives the agent as instances outlive a process on a card)."""
    path = f"{cluster.plugin_dir(node)}/fake-mig-state.json"
    state = json.loads(cluster.agent_run(node, ["cat", path]).stdout)
    return list(state["gpus"][parent]["instances"])


def test_two_mig_profiles_on_one_gpu_are_made_and_released(
    cluster: kube.Cluster, ns: str, nodes: dict[str, Any]
) -> None:
    node = mig_node(cluster, nodes)
    cluster.apply_spec("mig-two-profiles", ns, node=node)
    pod = cluster.wait_running(ns, "mig-two-profiles")
    claim = cluster.pod_claim(ns, pod, "mig")
    results = kube.results(claim)
    published = placements(cluster, node)

    # The scheduler: one placement per request, of the asked profile, on one GPU.
    assert sorted(r["request"] for r in results) == sorted(PROFILES), results
    by_request: dict[str, dict[str, Any]] = {}
    for r in results:
        device = published.get(r["device"])
        assert device is not None, f"{r['device']} is not a dynamic placement of {node}"
        assert kube.attr(device, "profile") == PROFILES[r["request"]], r
        by_request[r["request"]] = device
    (parent,) = {kube.attr(d, "parentUUID") for d in by_request.values()}
    full = kube.gpu_of(next(iter(by_request.values()))["name"])

    # The container: both MIG devices prepare created, on that GPU (claim metadata file).
    seen = cluster.seen(ns, "mig-two-profiles", "ctr")
    assert seen.nodes == [f"nvidia{full.removeprefix('gpu-')}"], f"the container sees {seen.nodes}"
    (meta,) = [d for d in seen.documents if "devices" in d]
    assert meta["claim"]["uid"] == claim["metadata"]["uid"], meta["claim"]
    made = {d["requests"][0]: d for d in meta["devices"]}
    assert set(made) == set(PROFILES), meta["devices"]
    for request, entry in made.items():
        assert entry["type"] == "mig" and entry["mig"]["profile"] == PROFILES[request], entry
        assert entry["mig"]["uuid"].startswith("MIG-"), entry
        assert [g["uuid"] for g in entry["gpus"]] == [parent], entry
    mig_uuids = {e["mig"]["uuid"] for e in made.values()}
    assert len(mig_uuids) == 2, made

    # The node: exactly those two instances exist on the GPU, and the GPU is held.
    live = instances(cluster, node, parent)
    assert sorted(i["name"] for i in live) == sorted(PROFILES.values()), live
    assert {ci["uuid"] for i in live for ci in i["computeInstances"]} == mig_uuids, live

    def held() -> bool | None:
        return True if not any(kube.set_ranks(cluster.devices(node)[full]).values()) else None

    kube.poll(held, 30, lambda: f"{full} on {node} still ranked while its MIG devices run")

    # Released: the pod goes, both instances are destroyed, the spec is removed.
    cluster.delete_pod(ns, "mig-two-profiles")
    cluster.wait_cdi_spec(node, claim["metadata"]["uid"], present=False)
    kube.poll(
        lambda: True if not instances(cluster, node, parent) else None,
        30,
        lambda: f"MIG instances left on {full}: {instances(cluster, node, parent)}",
    )
