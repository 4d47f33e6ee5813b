"""The polled health checks of one GPU: what NVML raises no event for.

Why it exists: the health watcher (:mod:`.watcher`) hears XIDs, ECC errors and recovery-action
changes as NVML events, but pages pending retirement, row remapping and the state of the NVLink
fabric are only ever read. Each check here is one such read of one GPU: it returns the finding
(classified by the :class:`~.healthpolicy.HealthPolicy`) when the check fails, adds its kind to
``passed`` when it passes (the tracker may then end that condition), and does neither when the
GPU does not report it (``nvml.optional``: unsupported means unknown, not healthy). NVML errors
other than "not supported" propagate: the watcher decides what a lost or failing GPU means.
"""

from __future__ import annotations

import ctypes
from typing import Any

from dra_driver.devices import healthpolicy, nvml


def retired_pages(
    api: nvml.NvmlApi, policy: healthpolicy.HealthPolicy, handle: Any, passed: set[str]
) -> list[healthpolicy.Finding]:
    """Pages pending retirement (``nvmlDeviceGetRetiredPagesPendingStatus``)."""
    pending = nvml.optional(api, "nvmlDeviceGetRetiredPagesPendingStatus", handle)
    if pending is None:
        return []
    if int(pending) == nvml.NVML_FEATURE_ENABLED:
        return [policy.pages_pending()]
    passed.add(healthpolicy.PAGES)
    return []


def remapped_rows(
    api: nvml.NvmlApi, policy: healthpolicy.HealthPolicy, handle: Any, passed: set[str]
) -> list[healthpolicy.Finding]:
    """Row remapping pending or failed (``nvmlDeviceGetRemappedRows``)."""
    rows = nvml.optional(api, "nvmlDeviceGetRemappedRows", handle)
    if rows is None:
        return []
    _, _, pending, failure = (int(v) for v in rows)
    if failure or pending:
        return [policy.remap(failure=bool(failure))]
    passed.add(healthpolicy.REMAP)
    return []


def fabric(
    api: nvml.NvmlApi, policy: healthpolicy.HealthPolicy, handle: Any, passed: set[str]
) -> list[healthpolicy.Finding]:
    """The NVLink fabric of a GPU that was in a completed one at discovery
    (``nvmlDeviceGetGpuFabricInfoV``): still completed, its routes healthy."""
    struct = nvml.c_nvmlGpuFabricInfoV_t
    if struct is None:
        return []
    info = struct()
    if nvml.optional(api, "nvmlDeviceGetGpuFabricInfoV", handle, ctypes.pointer(info)) is None:
        return []
    state = nvml.FABRIC_STATES.get(int(info.state), "unknown")
    route = (int(getattr(info, "healthMask", 0)) >> nvml.FABRIC_ROUTE_UNHEALTHY_SHIFT) & 0x3
    if state != "completed":
        return [policy.fabric(state)]
    if route == nvml.FABRIC_ROUTE_UNHEALTHY_TRUE:
        return [policy.fabric("route unhealthy")]
    passed.add(healthpolicy.FABRIC)
    return []
