"""Device taints and tolerations: which taint a toleration covers, the way Kubernetes decides it.

Why it exists: two places must agree on it exactly — the allocation simulator (a tainted device
is not a candidate for a request that does not tolerate it, as in the scheduler) and the kubelet
plugin's prepare (a claim allocated onto a device that became tainted is refused unless its
request tolerates the taint). Rules (``DeviceToleration``, docs/api-limits.md): an empty key with
``Exists`` matches every key; ``Exists`` ignores the value, ``Equal`` (the default) compares it;
an empty effect matches every effect. Only ``NoSchedule`` and ``NoExecute`` taints keep a device
from being allocated or prepared; ``None`` (and any unknown effect) is informational.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Whether ``toleration`` covers ``taint``."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if key and key != taint.get("key"):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    return bool(
        operator == "Equal" and (toleration.get("value") or "") == (taint.get("value") or "")
    )


def first_untolerated(
    taints: Iterable[Any], tolerations: Iterable[Mapping[str, Any]]
) -> Mapping[str, Any] | None:
    """The first blocking taint none of ``tolerations`` covers; None when the device is usable."""
    covering = list(tolerations)
    for taint in taints:
        if not isinstance(taint, Mapping) or taint.get("effect") not in BLOCKING_EFFECTS:
            continue
        if not any(tolerates(t, taint) for t in covering):
            return taint
    return None


def describe(taint: Mapping[str, Any]) -> str:
    """``gpu.nvidia.com/xid=79:NoExecute`` (kubectl's spelling)."""
    value = taint.get("value") or ""
    return f"{taint.get('key')}{'=' + value if value else ''}:{taint.get('effect')}"
