"""What the driver core knows of MPS: the interface it is handed, and a claim's MPS plan.

Why it exists: the MPS machinery lives in its own package, :mod:`dra_driver.driver.mps`
(control daemons as processes or Pods, their records and steps, the lazy loading), and that
package builds on the core (claims, checkpoint, config, CDI). The core, which prepares claims
and recovers at start-up, must not import it back: it reaches MPS only through
:class:`MpsPart`, a Protocol, and the composition root (``dra_driver/agentparts.py``) passes in
the real part (:class:`~dra_driver.driver.mps.lazymps.LazyMpsClaims`), or None for a plugin
running without MPS. :func:`plan_claim` is the core's side of a claim's plan: a claim asking for
MPS where there is none is refused (:class:`MpsClaimError`, which the MPS package raises too).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from typing import Any, Protocol, TypeVar

from dra_driver.driver import cdi, checkpoint, claims, config, inventory

# (allocated device, the node's device, its merged config): what a claim's MPS plan looks at.
Item = tuple[claims.AllocatedDevice, inventory.PreparableDevice, config.GpuConfig]


class MpsClaimError(claims.ClaimError):
    """A claim's MPS use cannot be prepared as asked (names the claim and device)."""


class _Named(Protocol):
    @property
    def name(self) -> str: ...


class Need(Protocol):
    """One device of a claim that runs through an MPS control daemon (what its record keeps)."""

    @property
    def daemon(self) -> str: ...

    @property
    def device(self) -> _Named: ...


N = TypeVar("N", bound=Need)


class MpsPart(Protocol[N]):
    """What the claim state and recovery use of
    :class:`~dra_driver.driver.mps.mpsclaims.MpsClaims`."""

    def plan(
        self, ref: claims.ClaimRef, items: Sequence[Item]
    ) -> tuple[tuple[N, ...], dict[str, Any]]: ...

    def check_time_slicing(self, ref: claims.ClaimRef, uuids: Collection[str]) -> None: ...

    def acquire(
        self,
        ref: claims.ClaimRef,
        needs: Sequence[N],
        *,
        time_sliced: Collection[str],
    ) -> None: ...

    def release(self, record: checkpoint.ClaimRecord) -> None: ...

    def check(self) -> None: ...

    def recover(self, prepared: Sequence[checkpoint.ClaimRecord]) -> list[str]: ...


def uses_mps(share_id: str | None, cfg: config.GpuConfig) -> bool:
    """Whether a device may run through an MPS daemon: a share, or a config asking for MPS."""
    return share_id is not None or (cfg.sharing is not None and cfg.sharing.strategy == "MPS")


def plan_claim(
    mps_claims: MpsPart[N] | None,
    ref: claims.ClaimRef,
    allocated: Sequence[claims.AllocatedDevice],
    planned: list[cdi.Planned],
) -> tuple[tuple[N, ...], list[cdi.Planned]]:
    """A claim's MPS needs, and its planned devices with their MPS container edits.

    ``mps_claims`` None: the plugin runs without MPS, and a claim that needs it is refused. So
    is MPS on a dynamic MIG device (its instance, and so its UUID, exists only once prepared).
    """
    items = [(dev, p.device, p.config) for dev, p in zip(allocated, planned, strict=True)]
    if mps_claims is None:
        if any(d.share_id or (c.sharing and c.sharing.strategy == "MPS") for d, _, c in items):
            raise claims.ClaimError(f"{ref}: uses MPS, but this plugin runs without MPS")
        return (), planned
    needs, edits = mps_claims.plan(ref, items)
    using = {n.device.name for n in needs}
    dynamic = sorted(
        p.device.name for p in planned if p.device.placement and p.device.name in using
    )
    if dynamic:
        raise MpsClaimError(
            f"{ref}: device {dynamic[0]} is a dynamic MIG device (its MIG instance is made at "
            "prepare): MPS on it is not supported"
        )
    return needs, [
        dataclasses.replace(p, edits=edits) if p.device.name in using else p for p in planned
    ]
