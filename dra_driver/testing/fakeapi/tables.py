"""Server-side printing: the ``Table`` kubectl asks for, for ResourceSlices.

Why it exists: ``kubectl get`` asks the server to render rows (``Accept:
application/json;as=Table;v=v1;g=meta.k8s.io, ...``) and prints only NAME and AGE when a
server answers with a plain list. kube-apiserver prints a ResourceSlice as NAME, NODE, DRIVER,
POOL, AGE; the fake does the same, so that ``kubectl get resourceslices`` against
``dra-driver dev-cluster`` looks as it does on a cluster. Test kit.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

_COLUMNS = (
    ("Name", "string", "name"),
    ("Node", "string", ""),
    ("Driver", "string", ""),
    ("Pool", "string", ""),
    ("Age", "date", ""),
)


def wants_table(accept: str) -> bool:
    """Whether an ``Accept`` header asks for a ``meta.k8s.io/v1`` Table first."""
    first = accept.split(",")[0].replace(" ", "")
    return "as=Table" in first and "g=meta.k8s.io" in first and "v=v1;" in first + ";"


def resource_slices(items: Sequence[dict[str, Any]], resource_version: str) -> dict[str, Any]:
    """The Table of ``items`` (ResourceSlices) as kube-apiserver prints them."""
    now = datetime.datetime.now(datetime.UTC)
    rows = []
    for obj in items:
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        cells = [
            meta.get("name", ""),
            spec.get("nodeName") or "",
            spec.get("driver") or "",
            (spec.get("pool") or {}).get("name") or "",
            _age(meta.get("creationTimestamp"), now),
        ]
        partial = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1"}
        rows.append({"cells": cells, "object": {**partial, "metadata": meta}})
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": [
            {"name": name, "type": kind, "format": fmt, "description": "", "priority": 0}
            for name, kind, fmt in _COLUMNS
        ],
        "rows": rows,
    }


def _age(stamp: Any, now: datetime.datetime) -> str:
    """A short age as kubectl's (``45s``, ``12m``, ``5h``, ``3d``; coarser than its
    ``4m30s``), ``<unknown>`` without a timestamp."""
    try:
        then = datetime.datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    except ValueError:
        return "<unknown>"
    seconds = max(0, int((now - then).total_seconds()))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 3 * 3600:
        return f"{seconds // 60}m"
    if seconds < 48 * 3600:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"
