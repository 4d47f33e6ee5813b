"""What a claim's allocated devices become on this node, checked before anything changes.

Why it exists: :meth:`~dra_driver.driver.state.ClaimState.prepare` must refuse a claim it cannot
honour before its first effect (checkpoint, sharing, MPS, MIG, CDI), so that a refusal leaves
nothing to roll back. The checks need only the node's inventory and health, not the claim
state: each allocated device must be a device of this node without a problem, its taints
tolerated by the request (:class:`DeviceTainted` otherwise, naming the taint and why it is
there), and the devices of one claim must not overlap in physical GPUs. The answer is the plan
the rest of the prepare works from: each device with its request and effective configuration.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dra_driver.apimachinery import taints
from dra_driver.driver import cdi, claims, config, inventory


class DeviceTainted(claims.ClaimError):
    """A device is tainted (unhealthy) and the claim's request does not tolerate the taint."""


# Device name → its current taints (``{"key", "value", "effect"}``, plus a ``message`` saying
# why, for the refusal); the node's health.
DeviceTaints = Callable[[str], Sequence[Mapping[str, Any]]]


def plan(
    ref: claims.ClaimRef,
    allocated: Sequence[claims.AllocatedDevice],
    *,
    devices: inventory.Inventory,
    device_taints: DeviceTaints | None,
) -> list[cdi.Planned]:
    """The claim's devices as this node prepares them; :class:`claims.ClaimError` (or
    :class:`DeviceTainted`) naming the claim and the device for one it cannot have."""
    planned: list[cdi.Planned] = []
    for dev in allocated:
        known = devices.get(dev.device)
        if known is None:
            raise claims.ClaimError(
                f"{ref}: device {dev.pool}/{dev.device} (request {dev.request}) is not a "
                "device of this node"
            )
        if known.problem:
            raise claims.ClaimError(
                f"{ref}: device {dev.device} cannot be prepared: {known.problem}"
            )
        check_taints(ref, dev, device_taints)
        cfg = config.effective(dev.configs, ref=ref, kind=known.kind)
        planned.append(cdi.Planned(device=known, request=dev.request_name, config=cfg))
    clashes = inventory.overlaps(
        [(p.device.name, p.device) for p in planned],
        shares=[d.share_id is not None for d in allocated],
    )
    if clashes:
        raise claims.ClaimError(
            f"{ref}: refusing a claim whose devices overlap in physical GPUs: " + "; ".join(clashes)
        )
    return planned


def check_taints(
    ref: claims.ClaimRef, dev: claims.AllocatedDevice, device_taints: DeviceTaints | None
) -> None:
    """:class:`DeviceTainted` if the device has a taint the request does not tolerate."""
    if device_taints is None:
        return
    blocking = taints.first_untolerated(device_taints(dev.device), dev.tolerations)
    if blocking is not None:
        reason = blocking.get("message") or "the device is unhealthy"
        raise DeviceTainted(
            f"{ref}: device {dev.pool}/{dev.device} is tainted "
            f"{taints.describe(blocking)} ({reason}) and request {dev.request} does not "
            "tolerate it"
        )
