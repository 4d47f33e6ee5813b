"""The health watcher across driver outages and device changes: stopped while the NVIDIA driver
is away (it holds an NVML initialisation, which keeps the kernel module in use), started again
over the new devices.

Why its own module: both agents use it (the DRA agent's :mod:`dra_driver.lifecycleparts` and the
device plugin's :mod:`dra_driver.deviceplugin.lifecycle`), and the release for a driver upgrade
(:mod:`dra_driver.driverrelease`) relies on the same stop.
"""

from __future__ import annotations

from typing import Any

import structlog

from dra_driver import driverwatch, nodehealth
from dra_driver import metrics as metrics_mod
from dra_driver.devices import model, watcher


def follow_outage(
    node_health: nodehealth.NodeHealth, outage: driverwatch.Outage, *, restart: Any
) -> None:
    """The driver went away: stop the health watcher (it holds NVML); back: ``restart()`` it
    unless the device change already did."""
    if outage.gone:
        old = node_health.watcher
        node_health.watcher = None
        if old is not None:
            old.stop()
    elif node_health.watcher is None:
        restart()


def restart_watcher(
    node_health: nodehealth.NodeHealth,
    devices: model.NodeDevices,
    *,
    published: set[str],
    enabled: bool,
    nvml_api: Any,
    metrics: metrics_mod.DriverMetrics,
    log: structlog.typing.FilteringBoundLogger,
) -> None:
    """A new health watcher over ``devices`` (the tracker, its history, stays)."""
    old = node_health.watcher
    api = node_health.fake or nvml_api
    if not enabled or api is None:
        return
    new = watcher.Watcher(
        api=api,
        gpus=watcher.watched_gpus(devices, published),
        tracker=node_health.tracker,
        log=log,
        observe=metrics.health_event,
        nvml_error=metrics.nvml_error,
    )
    node_health.watcher = None
    if old is not None:
        old.stop()
    new.start()
    node_health.devices = devices
    node_health.watcher = new
