"""Composition root of the node agent (``dra-driver kubelet-plugin``): the one place that wires
real parts together.

It picks the device backend, the Kubernetes API adapter and the host paths, builds the driver
core, recovers its checkpoint, serves the kubelet (DRA service, then registration), runs the
ResourceSlice publisher, the Node's GPU labels and the periodic claim clean-up, and on SIGTERM
shuts down in the order that keeps the kubelet informed: registration socket first (the kubelet
stops sending work), then the publisher, labels and clean-up, then the DRA service once in-flight
calls are answered.

Only one instance per node publishes (:mod:`~dra_driver.slices.leader`); readiness says whether
our slices are published: by us (``slices_published`` turns false once publishing has failed for
longer than ``publish_grace_s``, and true with the next success) or by the other instance.

With ``pod_uid`` set (seamless upgrades, contracts.md §8.2) the sockets carry the pod UID in
their names and the claim state is shared safely with the other instance through file locks
(:mod:`dra_driver.driver.instances`). Metrics and readiness are handed in by the CLI, which
serves them over HTTP.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

import structlog

from dra_driver import (
    driverrelease,
    driverwatch,
    gpumetrics,
    health_server,
    inventoryfollow,
    lifecycleparts,
    logs,
    nodehealth,
    shutdown,
)
from dra_driver import metrics as metrics_mod
from dra_driver.agentparts import (
    StartupError,
    Stoppable,
    build_driver,
    start_allocation_watch,
    start_node_labels,
    start_publisher,
)
from dra_driver.devices import backend as devices_backend
from dra_driver.devices import (
    health,
    holdings,
    passedthrough,
    passthrough,
)
from dra_driver.driver import driver as driver_mod
from dra_driver.driver import periodic
from dra_driver.kube import api as kube
from dra_driver.kubelet import dra_service, health_service, registration, server
from dra_driver.nodeparts import gpu_control_for, mig_control_for, mps_daemons_for
from dra_driver.pluginsettings import PluginSettings
from dra_driver.slices import build, leader, serverfeatures, taints, vfioslices
from dra_driver.slices.nodepublisher import NodePublisher

# PluginSettings and the part builders (:mod:`dra_driver.agentparts`) are re-exported: the CLI,
# the fault suite and the tests configure the agent through ``app``.
__all__ = [
    "PluginSettings",
    "StartupError",
    "build_driver",
    "gpu_control_for",
    "mig_control_for",
    "mps_daemons_for",
    "new_readiness",
    "run",
    "start_node_labels",
    "start_publisher",
]


def new_readiness(settings: PluginSettings) -> health_server.Readiness:
    """Ready = registered with the kubelet (and slices published, when we publish)."""
    conditions: tuple[str, ...] = health_server.KUBELET_PLUGIN_CONDITIONS
    if not settings.publish:
        conditions = tuple(c for c in conditions if c != "slices_published")
    return health_server.Readiness(conditions=conditions)


def run(
    settings: PluginSettings,
    *,
    backend: devices_backend.Backend,
    api: kube.KubeApi,
    stop: threading.Event,
    log: structlog.typing.FilteringBoundLogger | None = None,
    metrics: metrics_mod.DriverMetrics | None = None,
    readiness: health_server.Readiness | None = None,
    health_source: health.HealthBoard | None = None,
    probe: Callable[[], serverfeatures.Found] | None = None,
    server_version: Callable[[], str] | None = None,
    stopper: shutdown.Stopper | None = None,
) -> int:
    """Run the node agent until ``stop`` is set; returns the exit code.

    ``metrics`` and ``readiness`` (see :func:`new_readiness`) are fed as the agent runs;
    ``health_source`` is the board GPU health is tracked on (default: a new one), which feeds
    the kubelet's device health stream, the slices' taints and prepare's taint check.
    ``probe`` (:func:`dra_driver.kube.features.probe` on ``api``) learns which ResourceSlice
    fields the API server keeps, before the first publish; dynamic MIG or GPU shares asked
    for on a server that drops their fields raise :class:`StartupError` (``auto:`` ones are
    off instead). None: assume all kept. ``server_version`` (the server's ``gitVersion``):
    after an outage, re-probe only when it changed."""
    log = log or logs.get("kubelet-plugin")
    log = log.bind(driver=settings.driver_name, node=settings.node_name)
    metrics = metrics or metrics_mod.new()
    readiness = readiness or new_readiness(settings)
    mig_control = mig_control_for(settings, backend)  # before discovery: fake MIG state file
    try:
        devices = backend.discover()
    except devices_backend.DiscoveryError as exc:
        metrics.nvml_error("discover")
        raise StartupError(f"cannot discover GPUs: {exc}") from exc
    log.info(
        "discovered devices",
        gpus=len(devices.gpus),
        dynamic_mig=[g.name for g in settings.dynamic.dynamic_gpus(devices.gpus)],
    )
    features = serverfeatures.ServerFeatures(
        probe=probe if settings.publish else None,
        log=log.bind(component="features"),
        metrics=metrics,
        gpu_sets=settings.gpu_sets,
        auto=serverfeatures.auto_flags(dynamic_mig=settings.dynamic, shareable=settings.shareable),
        version=server_version,
    )
    kept = features.start()
    refused = serverfeatures.refusal(
        kept,
        gpus=devices.gpus,
        dynamic_mig=settings.dynamic,
        shareable=settings.shareable,
        server=str(getattr(api, "server", "") or ""),
    )
    refused = refused or vfioslices.refusal(  # --passthrough needs counters too
        kept.shared_counters, devices, settings.vfio, server=str(getattr(api, "server", "") or "")
    )
    if refused:
        raise StartupError(refused)
    # An auto: dynamic MIG selection the server cannot take is off for this run: the driver
    # prepares those GPUs as static ones (it comes on at the next start where the server keeps
    # shared counters). GPU shares need nothing of the driver: publishing follows re-probes.
    dynamic, _ = serverfeatures.resolve(
        kept, dynamic_mig=settings.dynamic, shareable=settings.shareable
    )
    settings = dataclasses.replace(settings, dynamic_mig=dynamic.text)
    vfio, unoffered = vfioslices.resolve(kept.shared_counters, settings.vfio), list[str]()
    settings = dataclasses.replace(settings, passthrough=vfio.text)
    devices = passthrough.mark(devices, vfio, unoffered)  # published twice (docs/passthrough.md)
    for line in unoffered:
        log.warning("GPU not offered for passthrough", reason=line)
    board = health_source or health.HealthBoard()
    held = holdings.HeldGpus()  # what prepared claims hold: the claim state writes, slices follow
    uuids = taints.published_uuids(
        devices,
        node_name=settings.node_name,
        driver_name=settings.driver_name,
        dynamic_mig=settings.dynamic,
    )
    try:
        driver = build_driver(
            settings,
            devices=devices,
            api=api,
            log=log,
            metrics=metrics,
            device_taints=taints.lookup(board, uuids, settings.driver_name),
            mig_control=mig_control,
            held_gpus=held,
        )
    except OSError as exc:
        raise StartupError(f"cannot set up the plugin's files: {exc}") from exc
    passed = passedthrough.PassedThrough(  # the GPUs on vfio-pci for a claim, asked live
        driver.state.vfio.passed_through if driver.state.vfio is not None else None
    )
    passedthrough.export(metrics.registry, passed, devices)
    gpu_metrics = gpumetrics.start(
        registry=metrics.registry,
        backend_=backend,
        devices=devices,
        claims=driver.state.prepared,
        interval_s=settings.gpu_metrics_interval_s,
        node_name=settings.node_name,
        log=log.bind(component="gpu-metrics"),
    )
    node_health = nodehealth.start(
        policy=settings.health,
        nvml_api=getattr(backend, "nvml_api", None),
        devices=devices,
        published={u for each in uuids.values() for u in each},
        board=board,
        log=log.bind(component="health"),
        metrics=metrics,
        socket=settings.health_socket,
        paused=passed.contains,
    )
    streams = health_service.HealthStreams(
        pool_name=settings.node_name,
        devices=inventoryfollow.stream_devices(devices, settings.dynamic),
        source=board,
        log=log.bind(component="health"),
        unknown_kinds=(driverwatch.CONDITION_KIND,),  # the driver away: health not known
    )
    dra = server.UnixServer(
        path=settings.dra_socket,
        services=[
            lambda s: dra_service.add_services(s, plugin=driver, log=log),
            lambda s: health_service.add_services(s, streams=streams),
        ],
        log=log,
        max_workers=settings.grpc_workers,
        stream_slots=streams.slots.limit,
    )
    reg_service = registration.RegistrationService(
        driver_name=settings.driver_name,
        endpoint=str(dra.path),
        log=log,
        versions=registration.ALL_VERSIONS,
        on_status=lambda status: readiness.set("registered", status.registered),
    )
    reg = server.UnixServer(
        path=settings.registration_socket, services=[reg_service.add_to], log=log, max_workers=2
    )
    cleanup = driver_mod.CleanupLoop(driver=driver, interval_s=settings.cleanup_interval_s, log=log)
    supervisor = (
        periodic.MpsSupervisor(
            check=driver.state.mps.check, interval_s=settings.mps_check_interval_s, log=log
        )
        if driver.state.mps is not None
        else None
    )
    slice_publisher: Stoppable | None = None
    allocations: Stoppable | None = None
    node_labels: Stoppable | None = None
    compute_domains: Stoppable | None = None
    labels = lifecycleparts.Slot(None)  # replaced when the GPUs change (docs/lifecycle.md)
    driver_watch: Stoppable | None = None
    try:
        dra.start()
        reg.start()
        watch = start_allocation_watch(settings, api=api, driver=driver, log=log)
        allocations = watch
        try:
            slice_publisher = start_publisher(
                settings,
                devices=devices,
                api=api,
                log=log,
                metrics=metrics,
                readiness=readiness,
                board=board,
                held=held,
                features=features,
                allocated=watch.allocated if watch is not None else None,
            )
        except build.BuildError as exc:  # keep serving: prepared claims still need unprepare
            log.error("cannot build this node's ResourceSlices; NOT publishing", error=str(exc))
        except leader.LockError as exc:
            log.error("cannot take part in publishing; NOT publishing", error=str(exc))
        node_labels = start_node_labels(settings, devices=devices, api=api, source=board, log=log)
        labels.part = node_labels
        release = driverrelease.Release(  # NVML let go of for a driver upgrade
            proc_dir=settings.proc_dir,
            deadline_s=settings.nvml_release_deadline_s,
            backend=backend,
            log=log.bind(component="driver-watch"),
            registry=metrics.registry,
            fake=node_health.fake,
        )
        node_health.release = release.handle
        driver_watch = lifecycleparts.start(
            settings,
            backend=backend,
            devices=devices,
            board=board,
            driver=driver,
            node_health=node_health,
            publisher=slice_publisher if isinstance(slice_publisher, NodePublisher) else None,
            labels=labels,
            start_labels=lambda d: start_node_labels(
                settings, devices=d, api=api, source=board, log=log
            ),
            readiness=readiness,
            api=api,
            log=log,
            metrics=metrics,
            features=features,
            discover=lambda: passthrough.mark(backend.discover(), vfio),
            hidden=passed.contains,
            follow=inventoryfollow.Followers(  # the health stream and GPU metrics follow too
                streams=streams,
                gpu_metrics=gpu_metrics,
                held=lambda: [
                    d.deviceName for r in driver.state.store.records() for d in r.devices
                ],
                dynamic=settings.dynamic,
                log=log.bind(component="driver-watch"),
            ),
            make_watch=release.make_watch,
        )
        if settings.compute_domains is not None:
            # The second driver, compute-domain.nvidia.com (docs/computedomains.md): its ~10
            # modules are loaded on the nodes that serve it only (memory per agent, #38).
            from dra_driver import cdagent

            try:
                compute_domains = cdagent.start(settings, api=api, devices=devices, log=log)
            except cdagent.StartError as exc:
                raise StartupError(str(exc)) from exc
        cleanup.start()
        if supervisor is not None:
            supervisor.start()
        log.info(
            "kubelet plugin ready", dra_socket=str(dra.path), registration_socket=str(reg.path)
        )
        stop.wait()
        log.info("shutting down")
    finally:
        (stopper or shutdown.Stopper(log=log, deadline_s=0)).run(
            [
                ("driver-watch", driver_watch.stop if driver_watch is not None else None),
                ("compute-domains", compute_domains.stop if compute_domains is not None else None),
                ("registration", lambda: reg.stop(grace_s=1.0)),
                ("allocation-watch", allocations.stop if allocations is not None else None),
                ("slice-publisher", slice_publisher.stop if slice_publisher is not None else None),
                ("node-labels", labels.stop),
                ("cleanup", cleanup.stop),
                ("mps-supervisor", supervisor.stop if supervisor is not None else None),
                ("node-health", node_health.stop),
                ("gpu-metrics", gpu_metrics.stop),
                ("health-streams", streams.stop),
                ("dra-service", lambda: dra.stop(grace_s=5.0)),
                ("driver", driver.close),
            ]
        )
    log.info("stopped")
    return 0


def install_signal_handlers(
    stop: threading.Event, on_signal: Callable[[], None] | None = None
) -> Callable[[], None]:
    """SIGTERM / SIGINT → orderly shutdown (call from the main thread); ``on_signal`` (e.g.
    :meth:`dra_driver.shutdown.Stopper.arm`) runs at each signal, before ``stop`` is set, one
    signal after the other. Returns what undoes this (the tests).

    Nothing of it runs in a Python signal handler: CPython runs those in the main thread between
    any two byte-codes, also while the main thread holds a lock. ``stop.set()`` there once
    deadlocked the agent for good: a SIGTERM that arrived as the main thread entered
    ``stop.wait()`` (which holds the event's own lock, a plain one, until it starts waiting) ran
    the handler inside ``wait()``, where ``set()`` waited for that lock forever, and the
    deadline (armed after it) never started; the second signal found the handler busy. So the
    signal only wakes a thread of its own, ``signal-watch``: CPython writes each signal's number
    to a pipe (:func:`signal.set_wakeup_fd`), in C, whatever the main thread is doing, and that
    thread arms the deadline and sets ``stop``."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    stopping = {signal.SIGTERM, signal.SIGINT}

    def watch() -> None:
        try:
            while chunk := os.read(read_fd, 64):
                for _ in range(sum(1 for signum in chunk if signum in stopping)):
                    if on_signal is not None:
                        on_signal()
                    stop.set()
        finally:
            os.close(read_fd)

    def noted(signum: int, frame: Any) -> None:
        """The number is already in the pipe; the handler itself must do nothing."""

    threading.Thread(target=watch, name="signal-watch", daemon=True).start()
    previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    previous = {sig: signal.signal(sig, noted) for sig in stopping}

    def undo() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(previous_fd)
        os.close(write_fd)  # the watch thread reads the end of the pipe and returns

    return undo
