"""What changed between two discoveries of one node: GPUs matched by UUID and PCI address.

Why it exists: after the NVIDIA driver comes back (an upgrade), after a GPU fell off the bus or
was hot-added, or after MIG was re-partitioned behind the driver's back, the node agent
rediscovers and must act on the difference only: republish what changed, withdraw what vanished,
report the claims whose GPU vanished (never re-prepare them on another GPU), and leave the rest
alone. :func:`compare` is that difference, as plain data (no I/O), so it is tested alone and the
agent's loop (:mod:`dra_driver.driverwatch`) only applies it.

GPUs are matched by UUID; a GPU whose UUID is gone but whose PCI address now shows another UUID
was *replaced* (a node rebooted with a new card in the slot): the old one counts as vanished,
the new one as added, never as the same GPU. A MIG device that is gone from a GPU still there
(destroyed with ``nvidia-smi``) is listed by its own UUID, so the claim that held it is
reported as one whose GPU vanished. Whether a GPU that NVML no longer lists has really
vanished goes through one predicate, :func:`vanished`: a GPU that NVML cannot see on purpose
(``hidden``, e.g. bound to another kernel driver for passthrough) is not vanished.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from dra_driver import records
from dra_driver.devices import model

Hidden = Callable[[str], bool]  # GPU UUID → NVML does not see it on purpose


def never_hidden(uuid: str) -> bool:
    return False


@records.record
class Changes:
    """The difference between the GPUs discovered before and now."""

    vanished: tuple[model.Gpu, ...] = ()  # known before, gone now (not hidden on purpose)
    hidden: tuple[model.Gpu, ...] = ()  # known before, invisible now on purpose: kept as is
    added: tuple[model.Gpu, ...] = ()  # new UUIDs
    replaced: tuple[tuple[model.Gpu, model.Gpu], ...] = ()  # (old, new) at one PCI address
    changed: tuple[str, ...] = ()  # UUIDs of GPUs still there whose facts changed
    driver_version: tuple[str, str] | None = None  # (before, now) when it changed
    # MIG devices gone from a GPU that is still there (an admin destroyed them, or dynamic MIG
    # did at an unprepare): their parents are in ``changed``; whose claim lost one, the agent
    # tells from its records (:mod:`dra_driver.lifecycleparts`).
    mig_destroyed: tuple[model.MigDevice, ...] = ()

    @property
    def any(self) -> bool:
        return bool(
            self.vanished or self.added or self.changed or self.driver_version or self.mig_destroyed
        )


def vanished(uuid: str, *, hidden: Hidden = never_hidden) -> bool:
    """Whether a GPU NVML no longer lists is gone: the one place that decides it."""
    return not hidden(uuid)


def compare(
    before: model.NodeDevices, now: model.NodeDevices, *, hidden: Hidden = never_hidden
) -> Changes:
    """What changed from ``before`` to ``now`` (see the module docstring)."""
    old = {g.uuid: g for g in before.gpus}
    new = {g.uuid: g for g in now.gpus}
    new_by_bus = {g.pci_bus_id: g for g in now.gpus}
    gone = [g for u, g in old.items() if u not in new]
    lost = tuple(g for g in gone if vanished(g.uuid, hidden=hidden))
    kept_hidden = tuple(g for g in gone if not vanished(g.uuid, hidden=hidden))
    added = tuple(g for u, g in new.items() if u not in old)
    replaced = tuple(
        (g, new_by_bus[g.pci_bus_id])
        for g in lost
        if g.pci_bus_id in new_by_bus and new_by_bus[g.pci_bus_id].uuid not in old
    )
    changed = tuple(u for u, g in new.items() if u in old and _facts(old[u]) != _facts(g))
    versions = (_version(before), _version(now))
    destroyed = tuple(
        m
        for u, g in new.items()
        if u in old
        for m in old[u].mig_devices
        if m.uuid not in {n.uuid for n in g.mig_devices}
    )
    return Changes(
        vanished=lost,
        hidden=kept_hidden,
        added=added,
        replaced=replaced,
        changed=changed,
        driver_version=versions if versions[0] != versions[1] and versions[1] else None,
        mig_destroyed=destroyed,
    )


def merged(
    before: model.NodeDevices, now: model.NodeDevices, changes: Changes
) -> model.NodeDevices:
    """``now`` plus the GPUs hidden on purpose as they were (they are still this node's)."""
    if not changes.hidden:
        return now
    gpus = sorted((*now.gpus, *changes.hidden), key=lambda g: g.minor)
    return dataclasses.replace(now, gpus=tuple(gpus))


def _facts(gpu: model.Gpu) -> model.Gpu:
    """A GPU as compared: its NVML index may change (renumbering) without changing it."""
    return dataclasses.replace(gpu, index=0, nvlinks={})


def _version(devices: model.NodeDevices) -> str:
    return next((g.driver_version for g in devices.gpus if g.driver_version), "")
