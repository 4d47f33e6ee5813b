"""deployments/examples/legacy/: the pod that picks its GPUs by node label and the DRA claim that
makes the same selection agree on every built-in profile, and both are valid objects."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from dra_driver.allocation import simulator
from dra_driver.devices import fake
from dra_driver.devices.fake import profiles
from dra_driver.nodelabels import compute

LEGACY = Path(__file__).resolve().parents[2] / "deployments" / "examples" / "legacy"


def load(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((LEGACY / name).read_text()) if d]


def _expression_matches(expr: dict[str, Any], labels: dict[str, str]) -> bool:
    """One matchExpression, as the scheduler evaluates it on a node's labels."""
    key, op, values = expr["key"], expr["operator"], expr.get("values", [])
    if op == "In":
        return labels.get(key) in values
    if op == "NotIn":
        return labels.get(key) not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if key not in labels:
        return False
    number = int(labels[key])
    return number > int(values[0]) if op == "Gt" else number < int(values[0])


def _term_matches(term: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(_expression_matches(e, labels) for e in term.get("matchExpressions", []))


def schedulable_by_label(pod: dict[str, Any], labels: dict[str, str]) -> bool:
    """nodeAffinity matches and the node has as many GPUs as the limit asks for."""
    required = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    wanted = sum(
        int(c["resources"]["limits"].get("nvidia.com/gpu", 0)) for c in pod["spec"]["containers"]
    )
    return (
        any(_term_matches(t, labels) for t in required["nodeSelectorTerms"])
        and int(labels.get("nvidia.com/gpu.count", "0")) >= wanted
    )


def allocated_by_claim(docs: list[dict[str, Any]], profile: str) -> bool:
    devices = fake.FakeBackend.from_name(profile).discover()
    kinds = simulator.split_kinds(docs, source="example")
    (outcome,) = simulator.run(
        simulator.Inputs(
            claims=kinds["claims"],
            classes=simulator.builtin_classes(),
            slices=simulator.fake_slices(devices, node_name="n1", driver_name="gpu.nvidia.com"),
            node_name="n1",
            allocated=set(),
            node_devices=devices,
        )
    )
    return outcome.allocated


@pytest.mark.parametrize("profile", profiles.builtin_names())
def test_node_label_pod_and_dra_claim_select_the_same_nodes(profile: str) -> None:
    (pod,) = load("two-v100-by-node-label.yaml")
    labels = compute.compute(fake.FakeBackend.from_name(profile).discover()).labels
    by_label = schedulable_by_label(pod, labels)
    by_claim = allocated_by_claim(load("two-v100-by-claim.yaml"), profile)
    assert by_label == by_claim == (profile in ("dgx-1-v100", "hgx-16-mesh"))


def test_the_pod_asks_for_two_gpus_the_legacy_way() -> None:
    (pod,) = load("two-v100-by-node-label.yaml")
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 2}
    claim, claim_pod = load("two-v100-by-claim.yaml")
    assert claim["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] == 2
    assert (
        claim_pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
        == (claim["metadata"]["name"])
    )


def test_legacy_examples_are_valid_objects(rc: ModuleType) -> None:
    manifests = [
        rc.Manifest(source=path.name, text=path.read_text(), obj=doc)
        for path in sorted(LEGACY.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]
    assert len(manifests) == 3
    assert rc.validate(manifests) == []
