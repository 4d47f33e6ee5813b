"""The claim ``dra-driver claim --gpus 4`` writes (docs/topology.md) on a real cluster, on a node
where another pod already holds a GPU: the node agent re-ranks its free GPUs, the stock
scheduler follows the ranks, and the pod gets the best-connected free set — exactly what
``dra-driver simulate --explain`` predicts from the node's published slices and allocated
claims, and what it calls optimal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cluster as kube
import yaml

# Nodes with enough GPUs for a holder and four more, links that make the choice matter first.
PREFERRED = ("dgx-1-v100", "hgx-16-mesh", "dgx-h100")
SIZE = 4


def for_simulate(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    """A listed object as ``kubectl get -o yaml`` writes it (list items lack kind)."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": kind, **obj}


def test_best_four_gpus_next_to_a_held_gpu_as_simulate_explains(
    cluster: kube.Cluster, ns: str, nodes: dict[str, Any], tmp_path: Path
) -> None:
    node = kube.node_with_any(nodes, PREFERRED, " (at least 5 GPUs)")
    # Claims of earlier tests' namespaces (deleted, not waited for) would change the GPUs free
    # between the prediction and the allocation: let them go first.
    cluster.settle(keep=ns)
    holder_template, holder, pod = kube.load_spec("best-four")
    cluster.create([holder_template, holder], ns, node=node)
    running = cluster.wait_running(ns, "best-four-holder")
    (held,) = kube.results(cluster.pod_claim(ns, running, "gpu"))
    held_gpu = held["device"]
    # The agent re-ranks once it has prepared the holder's claim: that GPU leaves every set.
    kube.poll(
        lambda: True if not any(kube.set_ranks(cluster.devices(node)[held_gpu]).values()) else None,
        30,
        lambda: f"{held_gpu} on {node} is held but still ranked: {cluster.devices(node)[held_gpu]}",
    )

    generated = kube.dra_driver("claim", "--gpus", str(SIZE), "--template", "--name", "best-four")
    assert generated.returncode == 0, generated.stderr
    template = yaml.safe_load(generated.stdout)
    claim_file = tmp_path / "best-four.yaml"
    claim_file.write_text(generated.stdout)
    slices_file = tmp_path / "slices.yaml"
    slices_file.write_text(
        yaml.safe_dump_all([for_simulate("ResourceSlice", s) for s in cluster.slices(node)])
    )
    allocated_file = tmp_path / "allocated.yaml"
    allocated_file.write_text(
        yaml.safe_dump_all([for_simulate("ResourceClaim", c) for c in cluster.allocated(node)])
    )
    simulated = kube.dra_driver(
        "simulate",
        str(claim_file),
        "--slices",
        str(slices_file),
        "--allocated",
        str(allocated_file),
        "--node-name",
        node,
        "--explain",
    )
    assert simulated.returncode == 0, simulated.stdout + simulated.stderr
    predicted = yaml.safe_load(simulated.stdout)["devices"]["results"]
    explain = [line for line in simulated.stdout.splitlines() if line.startswith("# explain:")]
    assert any(line.startswith("# explain: gap: none") for line in explain), "\n".join(explain)

    cluster.create([template, pod], ns, node=node)
    running = cluster.wait_running(ns, "best-four")
    got = kube.results(cluster.pod_claim(ns, running, "gpus"))

    def picks(results: list[dict[str, Any]]) -> list[tuple[str, str]]:
        return sorted((r["request"], r["device"]) for r in results)

    assert picks(got) == picks(predicted), (
        f"scheduler gave {picks(got)}, simulate predicted {picks(predicted)}:\n"
        + "\n".join(explain)
    )
    assert held_gpu not in {r["device"] for r in got}
    assert got[0]["request"].startswith("gpus/rank"), got  # a ranked set, not the fallback
    devices = cluster.devices(node)
    seen = cluster.seen(ns, "best-four", "ctr")
    minors = sorted(f"nvidia{r['device'].removeprefix('gpu-')}" for r in got)
    assert seen.nodes == minors, f"best-four sees {seen.nodes}, allocated {minors}"
    uuids = {kube.attr(devices[r["device"]], "uuid") for r in got}
    assert set(seen.env.get("NVIDIA_VISIBLE_DEVICES", "").split(",")) == uuids, seen.env
