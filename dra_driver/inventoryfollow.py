"""The kubelet's DRA health stream and the per-GPU metrics follow the GPUs the agent finds at run
time (driver back, GPU hot-added or vanished, MIG re-partitioned), not the list from start-up.

Why it exists apart from :mod:`dra_driver.lifecycleparts`: that module swaps the agent's own
inventory (slices, preparable devices, health watcher, labels); these two parts are served to
others (the kubelet over gRPC, Prometheus over HTTP) and only need the new devices handed over.
:class:`Followers` is what the lifecycle calls after each change (``devices_changed``) and each
outage change (``outage_changed``):

* the health stream (:class:`~dra_driver.kubelet.health_service.HealthStreams`) lists the new
  devices; a device that was listed and that a prepared claim still holds, but whose GPU is
  gone, stays listed as ``UNHEALTHY`` ("its GPU vanished from this node"), so the kubelet shows
  it in that pod's status rather than letting it time out to "Unknown" unexplained;
* the GPU metrics sampler (:class:`~dra_driver.gpumetrics.GpuMetrics`) samples the new GPUs
  and drops the series of the vanished ones; while the driver is away (or released for an
  upgrade) it is paused, so it makes no NVML call and shows no frozen value.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import structlog

from dra_driver import driverwatch, gpumetrics
from dra_driver.devices import health, migprofiles, model
from dra_driver.kubelet import health_service

VANISHED_MESSAGE = "its GPU vanished from this node; the claim is not moved to another GPU"

# The names of the devices prepared claims hold now.
HeldDevices = Callable[[], Iterable[str]]


def held_in(store: Any) -> HeldDevices:
    """The devices the claim records of ``store`` (a checkpoint store) hold, asked live."""
    return lambda: [d.deviceName for record in store.records() for d in record.devices]


def stream_devices(
    devices: model.NodeDevices, dynamic: migprofiles.DynamicMig
) -> dict[str, tuple[str, ...]]:
    """The health stream's device list for ``devices`` (published name -> health keys)."""
    return migprofiles.health_keys(devices, dynamic, health.device_keys(devices))


class Followers:
    """See the module docstring. Either part may be None (not served in this agent)."""

    def __init__(
        self,
        *,
        streams: health_service.HealthStreams | None,
        gpu_metrics: gpumetrics.GpuMetrics | None,
        held: HeldDevices,
        dynamic: migprofiles.DynamicMig,
        log: structlog.typing.FilteringBoundLogger,
    ) -> None:
        self.streams = streams
        self.gpu_metrics = gpu_metrics
        self._held = held
        self._dynamic = dynamic
        self._log = log
        self._paused = False

    def devices_changed(self, devices: model.NodeDevices) -> None:
        if self.streams is not None:
            before = self.streams.devices
            now = stream_devices(devices, self._dynamic)
            gone = vanished(before, now, self.streams.vanished, self._held())
            self.streams.set_devices(now, gone, held=lambda: set(self._held()))
        if self.gpu_metrics is not None:
            self.gpu_metrics.set_devices(devices)

    def outage_changed(self, outage: driverwatch.Outage) -> None:
        """The sampler stops while the driver is away or released, and starts on its return."""
        if self.gpu_metrics is None or outage.gone == self._paused:
            return
        self._paused = outage.gone
        if outage.gone:
            self.gpu_metrics.pause()
            self._log.info("GPU metrics sampling paused while the NVIDIA driver is away")
        else:
            self.gpu_metrics.resume()
            self._log.info("GPU metrics sampling resumed")


def vanished(
    before: Mapping[str, object],
    now: Mapping[str, object],
    reported: Mapping[str, str],
    held: Iterable[str],
) -> dict[str, str]:
    """Devices listed ``before`` (or reported vanished already) and missing ``now`` that a
    prepared claim still holds -> why; a device no claim holds is simply no longer listed."""
    gone = (set(before) | set(reported)) - set(now)
    return {name: reported.get(name, VANISHED_MESSAGE) for name in sorted(gone & set(held))}
