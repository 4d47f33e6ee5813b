"""The seam between discovery and the rest of the driver.

Everything above discovery takes a :class:`Backend`; the composition root picks the real NVML
one or the fake one. Keeping this a one-method protocol lets tests hand in anything.
"""

from __future__ import annotations

from typing import Protocol

from dra_driver.devices import model


class DiscoveryError(Exception):
    """Discovery cannot run at all (no NVML library, driver not loaded, ...).

    The message is meant for the operator: what is missing and what to do about it.
    """


class Backend(Protocol):
    """Something that can list a node's GPUs."""

    def discover(self) -> model.NodeDevices:
        """Return the node's GPUs; GPUs that fail individually are skipped, not fatal."""
        ...
