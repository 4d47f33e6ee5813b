"""The seam between discovery and the rest of the driver.

Everything above discovery takes a :class:`Backend`; the composition root picks the real NVML
one or the fake one. Keeping this a one-method protocol lets tests hand in anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from dra_driver import records
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


# The values a GPU sample carries, by the names its ``errors`` use.
SAMPLE_VALUES: tuple[str, ...] = ("utilization", "memory", "power", "temperature")


@records.record
class GpuSample:
    """One GPU's telemetry at one sampling pass; None = NVML could not give it (see errors)."""

    uuid: str
    gpu_util_percent: float | None = None
    memory_util_percent: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    power_watts: float | None = None
    temperature_celsius: float | None = None
    errors: tuple[str, ...] = ()  # of SAMPLE_VALUES: those NVML refused for this GPU


class GpuSampler(Protocol):
    """Something that reads GPU telemetry (the NVML backends' :meth:`sampler`)."""

    def sample(self, uuids: Sequence[str]) -> dict[str, GpuSample]:
        """One pass over ``uuids``; never raises for one GPU's failure."""
        ...


# Where the fake GPU profiles shipped with the package are, known here so that naming them (the
# CLI's help) does not load the fake backend, which a real node's agent never needs.
BUILTIN_FAKE_PROFILES = Path(__file__).parent / "fake" / "profiles"


def builtin_fake_profiles() -> list[str]:
    """Names of the fake GPU profiles shipped with the package (``dgx-h100``, ...)."""
    return sorted(p.name.removesuffix(".yaml") for p in BUILTIN_FAKE_PROFILES.glob("*.yaml"))
