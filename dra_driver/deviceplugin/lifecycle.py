"""The legacy device plugin through driver upgrades and GPU hot-plug (docs/lifecycle.md).

Why it exists: the device plugin (``dra-driver device-plugin``) must follow the same lifecycle
as the DRA agent. While the NVIDIA driver is away, ``ListAndWatch`` lists every device
unhealthy: the driver watch (:mod:`dra_driver.driverwatch`) marks every GPU on the health
board the streams read, so nothing else is needed for that. When the GPUs change (the driver
came back, a GPU vanished or was hot-added), :func:`follower` rebuilds each resource's device
list, topology and static CDI spec, and the streams send the new list at their next turn.

A resource that did not exist at start (a first MIG device under the ``mixed`` strategy) is not
registered until the plugin restarts, and MPS replicas keep the GPUs they started with: both
are logged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import structlog

from dra_driver import driverwatch, health_server, lifecycleparts, logs, nodehealth
from dra_driver import metrics as metrics_mod
from dra_driver.deviceplugin import app, cdi, inventory
from dra_driver.devices import health, model, rediscovery, topology


def start(
    plugin: app.DevicePluginApp,
    *,
    source: Any,
    devices: model.NodeDevices,
    board: health.HealthBoard,
    node_health: nodehealth.NodeHealth,
    readiness: health_server.Readiness,
    metrics: metrics_mod.DriverMetrics,
    mig_minors: Mapping[str, int] | None,
    health_enabled: bool,
) -> driverwatch.DriverWatch | None:
    """Watch the driver for the device plugin (None: the backend has no NVML to watch)."""
    nvml_api = getattr(source, "nvml_api", None)
    if nvml_api is None:
        return None
    log = logs.get("deviceplugin.lifecycle")
    follow = follower(plugin, mig_minors=mig_minors, log=log)
    watch: driverwatch.DriverWatch | None = None

    def restart(now: model.NodeDevices) -> None:
        lifecycleparts.restart_watcher(
            node_health,
            now,
            published={d.unit.uuid for r in plugin.resources for d in r.devices},
            enabled=health_enabled,
            nvml_api=nvml_api,
            metrics=metrics,
            log=logs.get("deviceplugin.health"),
        )

    def changed(now: model.NodeDevices, changes: rediscovery.Changes, at_once: bool) -> None:
        follow(now, changes, at_once)
        if node_health.watcher is not None or (watch is not None and not watch.outage.gone):
            restart(now)

    watch = driverwatch.DriverWatch(
        api=nvml_api,
        discover=source.discover,
        devices=devices,
        board=board,
        log=log,
        on_devices=changed,
        on_outage=lambda outage: lifecycleparts.follow_outage(
            node_health, outage, restart=lambda: restart(watch.devices) if watch else None
        ),
        metrics=driverwatch.Metrics(metrics.registry),
    )
    node_health.lifecycle = lifecycleparts.fake_lifecycle(node_health, log)
    readiness.add_condition(
        lifecycleparts.READINESS_CONDITION, watch.available, reason=lambda: watch.outage.message()
    )
    watch.start()
    return watch


def follower(
    plugin: app.DevicePluginApp,
    *,
    mig_minors: Mapping[str, int] | None,
    log: structlog.typing.FilteringBoundLogger,
) -> driverwatch.DevicesChanged:
    """A :data:`~dra_driver.driverwatch.DevicesChanged` handler for ``plugin``."""

    def changed(devices: model.NodeDevices, changes: rediscovery.Changes, now: bool) -> None:
        config = plugin.config
        resources = inventory.build(
            devices,
            resource_name=config.resource_name,
            mig_strategy=config.mig_strategy,
            mig_minors=mig_minors,
            replicas=config.replicas,
        )
        units = [d.unit for r in resources for d in r.devices]
        spec = cdi.StaticSpec(
            root=config.cdi_root, kind=config.cdi_kind, units=units, fake_node=config.fake_node
        )
        spec.ensure()
        topo = topology.build(devices)
        by_name = {r.name: r for r in resources}
        for name, endpoint in plugin.endpoints.items():
            service = endpoint.service
            service.resource = by_name.get(name, inventory.Resource(name=name, devices=()))
            service._topo = topo
            service._spec = spec
        plugin.spec = spec
        plugin.resources = resources
        new = sorted(set(by_name) - set(plugin.endpoints))
        if new:
            log.warning("new device plugin resources are served after a restart", resources=new)
        if plugin.mps is not None and (changes.added or changes.vanished):
            log.warning("MPS replicas keep the GPUs they started with until a restart")
        log.info(
            "device plugin devices follow the rediscovered GPUs",
            devices={r.name: len(r.devices) for r in resources},
        )

    return changed
