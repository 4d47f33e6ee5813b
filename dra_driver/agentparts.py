"""The node agent's long-lived parts, each built from the settings: the driver core with its
checkpoint recovered, the ResourceSlice publisher and the Node's GPU labeller.

Why it exists apart from :mod:`dra_driver.app`: ``app.run`` composes these parts, orders their
start and shutdown and answers signals; building each part is a job of its own, which tests,
the fault suite and the demo also do one part at a time (``app`` re-exports the builders).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import structlog

from dra_driver import health_server
from dra_driver import metrics as metrics_mod
from dra_driver.devices import (
    control,
    health,
    holdings,
    migcontrol,
    model,
    passedthrough,
    passthrough,
    vfiohost,
)
from dra_driver.driver import (
    cdi,
    checkpoint,
    claimstatus,
    driverfiles,
    instances,
    inventory,
    sharing,
    state,
    vanished,
)
from dra_driver.driver import driver as driver_mod
from dra_driver.driver import mig as mig_mod
from dra_driver.driver import vfio as vfio_mod
from dra_driver.driver.mps import lazymps
from dra_driver.kube import api as kube
from dra_driver.kube import client, impersonation, objectclient
from dra_driver.nodelabels import agent as nodelabels
from dra_driver.nodelabels import compute as labels_compute
from dra_driver.nodeparts import gpu_control_for, mps_daemons_for, mps_root
from dra_driver.pluginsettings import ALLOCATION_SOURCES, PluginSettings
from dra_driver.slices import allocwatch, claimcache, leader, nodepublisher, serverfeatures

if TYPE_CHECKING:
    from dra_driver.driver.mps import mpsclaims


class Stoppable(Protocol):
    def stop(self) -> None: ...


class StartupError(Exception):
    """The agent cannot start; the message says what to fix."""


def build_driver(
    settings: PluginSettings,
    *,
    devices: model.NodeDevices,
    api: kube.KubeApi,
    log: structlog.typing.FilteringBoundLogger,
    gpu_control: control.GpuControl | None = None,
    metrics: metrics_mod.DriverMetrics | None = None,
    device_taints: state.DeviceTaints | None = None,
    mig_control: migcontrol.MigControl | None = None,
    held_gpus: holdings.HeldGpus | None = None,
) -> driver_mod.Driver:
    """The driver core for ``devices``, with its checkpoint recovered (usable without gRPC).

    ``gpu_control`` (for tests) replaces the one :func:`gpu_control_for` picks;
    ``device_taints`` (a device's taints now) makes prepare refuse untolerated taints;
    ``mig_control`` (:func:`mig_control_for`) creates and destroys dynamic MIG instances;
    ``held_gpus`` hears which full GPUs the prepared claims hold (from recovery on)."""
    mig_minors = None if settings.fake else inventory.read_mig_minors()
    files = driverfiles.discover(settings.driver_root, mount=settings.driver_root_mount)
    if not files:
        log.warning(
            "no NVIDIA driver libraries found; containers get device nodes only",
            driver_root=str(settings.driver_root),
            searched=str(settings.driver_root_mount or settings.driver_root),
        )
    specs = cdi.CdiSpecs(
        root=settings.cdi_root,
        driver_name=settings.driver_name,
        host=cdi.HostDevices(
            fake_node=cdi.FAKE_DEVICE_NODE if settings.fake else None, dev_root=settings.dev_root
        ),
        driver_files=files,
    )
    # Shared with another instance (seamless upgrade): locks, and state re-read from disk.
    locks = instances.ClaimFileLocks(directory=settings.lock_dir) if settings.pod_uid else None
    store = (instances.SharedCheckpoint if locks else checkpoint.Checkpoint)(
        directory=settings.plugin_dir,
        boot_id=checkpoint.read_boot_id(settings.boot_id_file),
        log=log,
    )
    control_ = gpu_control or gpu_control_for(settings, devices=devices, files=files)
    preparable = inventory.build(devices, mig_minors=mig_minors, dynamic=settings.dynamic)
    claim_state = state.ClaimState(
        api=api,
        driver_name=settings.driver_name,
        pool_name=settings.node_name,
        devices=preparable,
        specs=specs,
        store=store,
        log=log,
        gpu_sharing=sharing.GpuSharing(
            gpu_control=control_,
            log=log,
            others=(
                instances.SharedSharing(store=store, locks=locks, devices=preparable)
                if locks
                else None
            ),
        ),
        mps=lazymps.LazyMpsClaims(
            build=lambda: _mps_claims(
                settings,
                files=files,
                gpu_control=control_,
                log=log,
                api=api,
                devices=devices,
                preparable=preparable,
                store=store,
                metrics=metrics,
            ),
            root=mps_root(settings),
            store=store,
            eager=bool(settings.mps_daemon_image),
        ),
        mig_instances=mig_mod.MigInstances(control=mig_control, devices=preparable, log=log),
        device_taints=device_taints,
        held_gpus=held_gpus,
        vfio=_vfio_part(settings, devices, mig_control, log),
        metadata_dir=settings.metadata_dir,
    )
    # A GPU on vfio-pci for a claim is invisible to NVML on purpose: never a vanished GPU.
    vfio = claim_state.vfio
    hidden = passedthrough.PassedThrough(vfio.passed_through if vfio else None).contains
    if locks is None:
        claim_state.recover()
        vanished.clean_at_start(
            claim_state,
            api=api,
            driver_name=settings.driver_name,
            node_name=settings.node_name,
            hidden=hidden,
        )
    else:
        claim_state.ownership = instances.SharedOwnership(store=store, locks=locks)
        with locks.exclusive():  # never while the other instance is inside a claim
            claim_state.recover()
            vanished.clean_at_start(
                claim_state,
                api=api,
                driver_name=settings.driver_name,
                node_name=settings.node_name,
                hidden=hidden,
            )
    driver = driver_mod.Driver(
        claim_state=claim_state,
        log=log,
        workers=settings.workers,
        serial=settings.serial,
        metrics=metrics,
        claim_lock=locks.hold if locks else None,
        status=claimstatus.StatusWriter(
            api=api,
            store=store,
            devices=preparable,
            gpus=claimstatus.gpu_facts(devices),
            driver_name=settings.driver_name,
            log=log.bind(component="claim-status"),
            metrics=metrics,
        ),
    )
    driver.update_gauges()
    return driver


def _mps_claims(
    settings: PluginSettings,
    *,
    files: tuple[driverfiles.Mount, ...],
    gpu_control: control.GpuControl,
    log: structlog.typing.FilteringBoundLogger,
    api: kube.KubeApi,
    devices: model.NodeDevices,
    preparable: inventory.Inventory,
    store: checkpoint.Checkpoint,
    metrics: metrics_mod.DriverMetrics | None,
) -> mpsclaims.MpsClaims:
    """MPS for claims, with its daemons (built when a claim first needs them: lazymps)."""
    from dra_driver.driver.mps import mpsclaims

    daemons = mps_daemons_for(
        settings,
        files=files,
        gpu_control=gpu_control,
        log=log,
        api=api,
        devices=preparable,
        metrics=metrics,
    )
    return mpsclaims.MpsClaims(
        daemons=daemons,
        store=store,
        devices=preparable,
        gpu_memory=mpsclaims.gpu_memory(devices),
        driver_name=settings.driver_name,
        log=log,
    )


def start_publisher(
    settings: PluginSettings,
    *,
    devices: model.NodeDevices,
    api: kube.KubeApi,
    log: structlog.typing.FilteringBoundLogger,
    metrics: metrics_mod.DriverMetrics | None = None,
    readiness: health_server.Readiness | None = None,
    board: health.HealthBoard | None = None,
    held: holdings.HeldGpus | None = None,
    features: serverfeatures.ServerFeatures | None = None,
    allocated: holdings.HeldGpus | None = None,
) -> nodepublisher.NodePublisher | None:
    """Keep this node's ResourceSlices published (unless ``settings.publish`` is off), as the
    one publishing instance of the node, with the taints of ``board``'s unhealthy GPUs and the
    set ranks of the GPUs ``held`` and ``allocated`` leave free, re-published whenever any
    changes;
    ``readiness``'s ``slices_published`` follows it. ``features``: what the API server keeps
    (probed already); publishing adapts to it and to what re-probes find."""
    if not settings.publish:
        log.info("not publishing ResourceSlices (disabled)")
        return None
    node = nodepublisher.NodePublisher(
        driver_name=settings.driver_name,
        node_name=settings.node_name,
        devices=devices,
        api=api,
        lock_file=settings.plugin_dir / leader.LOCK_FILE,
        grace_s=settings.publish_grace_s,
        watch_timeout_s=settings.watch_timeout_s,
        log=log.bind(component="publisher"),
        metrics=metrics,
        board=board,
        dynamic_mig=settings.dynamic,
        shareable=settings.shareable,
        gpu_sets=settings.gpu_sets,
        held=held,
        features=features,
        allocated=allocated,
    )
    if readiness is not None:
        readiness.set_check("slices_published", node.published)
    node.start()
    return node


def start_allocation_watch(
    settings: PluginSettings,
    *,
    api: kube.KubeApi,
    driver: driver_mod.Driver,
    log: structlog.typing.FilteringBoundLogger,
) -> allocwatch.AllocationWatch | None:
    """Watch the claims allocated on this node so the set ranks follow them (unless publishing,
    the ranks or ``settings.watch_allocations`` are off, or ``api`` gives no Pod watch)."""
    if not (settings.publish and settings.gpu_sets and settings.watch_allocations):
        return None
    try:
        objects = objectclient.objects_for(_pod_reader(settings, api))
    except ValueError as exc:
        log.warning("cannot watch this node's pods; set ranks follow prepares only", error=str(exc))
        return None
    devices = driver.state.devices

    def gpus_of(name: str) -> tuple[str, ...]:
        known = devices.get(name)
        return known.gpu_names if known is not None else ()

    watch = allocwatch.start(
        objects=objects,
        get_claim=api.get_resource_claim,
        node_name=settings.node_name,
        driver_name=settings.driver_name,
        gpus_of=gpus_of,
        log=log.bind(component="allocation-watch"),
        watch_timeout_s=settings.watch_timeout_s,
        acting_as_node=settings.allocation_source == "node" and isinstance(api, client.KubeClient),
    )
    # Prepare takes the claim from the watch where that copy is provably current (claimcache).
    driver.state.cached_claim = claimcache.ClaimCache(
        watch=watch, driver_name=settings.driver_name, pool=settings.node_name
    ).current
    return watch


def _pod_reader(settings: PluginSettings, api: kube.KubeApi) -> object:
    """The connection the allocation watch reads Pods through: one acting as this node
    (``allocation_source`` "node", docs/security.md) over HTTP, else ``api`` itself (the agent's
    own identity; an in-process fake has no identities)."""
    if settings.allocation_source not in ALLOCATION_SOURCES:
        raise ValueError(f"unknown allocation source {settings.allocation_source!r}")
    if settings.allocation_source == "node" and isinstance(api, client.KubeClient):
        return impersonation.as_node(api, settings.node_name)
    return api


def start_node_labels(
    settings: PluginSettings,
    *,
    devices: model.NodeDevices,
    api: kube.KubeApi,
    source: health.HealthBoard,
    log: structlog.typing.FilteringBoundLogger,
) -> Stoppable | None:
    """Keep this node's GPU labels on its Node (unless ``settings.node_labels`` is off)."""
    if not settings.node_labels:
        log.info("not labelling the Node (disabled)")
        return None
    return nodelabels.start(
        kube=api,
        node_name=settings.node_name,
        devices=devices,
        settings=labels_compute.Settings(),  # DRA: whole GPUs and MIG devices side by side
        source=source,
        log=log.bind(component="node-labels"),
        resync_s=settings.node_labels_resync_s,
    )


def _vfio_part(
    settings: PluginSettings,
    devices: model.NodeDevices,
    mig_control: migcontrol.MigControl | None,
    log: structlog.typing.FilteringBoundLogger,
) -> vfio_mod.VfioPart | None:
    """The passthrough part when GPUs are offered to VMs (docs/passthrough.md); NVML's process
    list of a GPU (through the MIG control's) is what refuses a GPU in use."""
    if not passthrough.marked(devices):
        return None
    return vfio_mod.VfioPart(
        host=vfiohost.VfioHost(settings.vfio_root),
        directory=settings.plugin_dir / vfio_mod.JOURNAL_DIR,
        node=devices,
        processes=mig_control.processes if mig_control is not None else None,
        log=log.bind(component="vfio"),
    )
