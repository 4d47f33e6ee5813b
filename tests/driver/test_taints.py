"""Prepare refuses a claim on a device that became tainted, unless the request tolerates it;
the refusal is that claim's alone and names the taint and why it is there."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.driver import claims

from .conftest import DRIVER, NODE, Node, claim_obj, new_uid

TAINT = {
    "key": "gpu.nvidia.com/xid",
    "value": "79",
    "effect": "NoExecute",
    "message": "XID 79 (GPU has fallen off the bus)",
}


def tainting(node: Node, sick: str, taint: dict[str, Any] = TAINT) -> None:
    node.driver.state.device_taints = lambda name: [taint] if name == sick else []


def with_tolerations(obj: dict[str, Any], tolerations: list[dict[str, Any]]) -> dict[str, Any]:
    for result in obj["status"]["allocation"]["devices"]["results"]:
        result["tolerations"] = tolerations
    return obj


def test_claim_on_a_tainted_device_is_refused_and_others_are_not(node: Node) -> None:
    tainting(node, "gpu-3")
    sick = node.add(claim_obj(name="sick", uid=new_uid(), devices=["gpu-2", "gpu-3"]))
    fine = node.add(claim_obj(name="fine", uid=new_uid(), devices=["gpu-4"]))
    answers = node.driver.prepare([sick, fine])
    assert answers[fine.uid].error == ""
    error = answers[sick.uid].error
    assert "ResourceClaim default/sick" in error
    assert f"device {NODE}/gpu-3 is tainted gpu.nvidia.com/xid=79:NoExecute" in error
    assert "GPU has fallen off the bus" in error and "request gpu does not tolerate it" in error
    assert not any(sick.uid in f for f in node.spec_files())  # nothing prepared for it
    assert node.driver.state.store.get(sick.uid) is None


@pytest.mark.parametrize(
    "toleration",
    [
        {"key": "gpu.nvidia.com/xid", "operator": "Exists"},
        {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoExecute"},
        {"operator": "Exists"},
    ],
)
def test_a_matching_toleration_is_accepted(node: Node, toleration: dict[str, Any]) -> None:
    tainting(node, "gpu-3")
    ref = node.add(
        with_tolerations(claim_obj(name="ok", uid=new_uid(), devices=["gpu-3"]), [toleration])
    )
    assert node.driver.prepare([ref])[ref.uid].error == ""


@pytest.mark.parametrize(
    "toleration",
    [
        {"key": "gpu.nvidia.com/xid", "value": "48"},
        {"key": "gpu.nvidia.com/xid", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "gpu.nvidia.com/gpu-lost", "operator": "Exists"},
    ],
)
def test_a_toleration_of_something_else_is_not_enough(
    node: Node, toleration: dict[str, Any]
) -> None:
    tainting(node, "gpu-3")
    ref = node.add(
        with_tolerations(claim_obj(name="no", uid=new_uid(), devices=["gpu-3"]), [toleration])
    )
    assert "does not tolerate it" in node.driver.prepare([ref])[ref.uid].error


def test_effect_none_taints_do_not_block(node: Node) -> None:
    tainting(node, "gpu-3", {**TAINT, "effect": "None"})
    ref = node.add(claim_obj(name="info", uid=new_uid(), devices=["gpu-3"]))
    assert node.driver.prepare([ref])[ref.uid].error == ""


def test_tolerations_must_be_objects(node: Node) -> None:
    obj = claim_obj(name="bad", uid=new_uid(), devices=["gpu-0"])
    obj["status"]["allocation"]["devices"]["results"][0]["tolerations"] = "all"
    ref = claims.ClaimRef(uid=obj["metadata"]["uid"], namespace="default", name="bad")
    with pytest.raises(claims.ClaimError, match=r"results\[0\]\.tolerations must be a list"):
        claims.allocated_devices(obj, ref=ref, driver=DRIVER, pool=NODE)
