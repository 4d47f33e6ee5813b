"""Toleration matching as Kubernetes defines it (docs/api-limits.md#taints-and-tolerations),
shared by the simulator and prepare."""

from __future__ import annotations

import pytest

from dra_driver.apimachinery import taints

TAINT = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoExecute"}


@pytest.mark.parametrize(
    ("toleration", "covers"),
    [
        ({"key": "gpu.nvidia.com/xid", "value": "79"}, True),  # Equal is the default
        ({"key": "gpu.nvidia.com/xid", "value": "48"}, False),
        ({"key": "gpu.nvidia.com/xid", "operator": "Exists"}, True),
        ({"operator": "Exists"}, True),  # empty key + Exists: every taint
        ({"operator": "Exists", "effect": "NoSchedule"}, False),
        ({"key": "gpu.nvidia.com/xid", "operator": "Exists", "effect": "NoExecute"}, True),
        ({"key": "gpu.nvidia.com/ecc", "operator": "Exists"}, False),
        ({"key": "gpu.nvidia.com/xid", "operator": "Lt", "value": "80"}, False),
    ],
)
def test_tolerates(toleration: dict[str, str], covers: bool) -> None:
    assert taints.tolerates(toleration, TAINT) is covers


def test_first_untolerated_skips_informational_taints_and_tolerated_ones() -> None:
    note = {"key": "gpu.nvidia.com/note", "effect": "None"}
    ecc = {"key": "gpu.nvidia.com/ecc", "value": "double-bit", "effect": "NoSchedule"}
    tolerate_xid = [{"key": "gpu.nvidia.com/xid", "operator": "Exists"}]
    assert taints.first_untolerated([note, TAINT, ecc], tolerate_xid) == ecc
    assert taints.first_untolerated([note], []) is None
    assert taints.describe(TAINT) == "gpu.nvidia.com/xid=79:NoExecute"
    assert taints.describe(ecc | {"value": ""}) == "gpu.nvidia.com/ecc:NoSchedule"
