"""The second DRA driver of the node agent, ``compute-domain.nvidia.com``, wired up.

Why it exists: :mod:`dra_driver.app` wires the GPU driver; this module wires the ComputeDomain
driver beside it with a few lines there (:func:`start`, then ``stop()``). A composition root
like ``app`` (it reads the agent's :class:`~dra_driver.pluginsettings.PluginSettings`), so it
lives beside it, above :mod:`dra_driver.computedomain`, whose parts it puts together. It gets
its own plugin directory, DRA socket and registration socket (the kubelet sees two drivers), its
checkpoint recovered before the sockets appear, its slice (channels and the daemon device, only
on a node in an NVLink clique), and the monitor of its IMEX daemons. Fake GPU nodes back the
channel device with the fake device node; real ones need the channels' major from
``/proc/devices``.

Test seam: ``DRA_DRIVER_CD_CRASH_AT=<step>`` in the environment ends the process (exit 137, as
a SIGKILL would) when a prepare reaches that step (:mod:`.nodedriver`), so tests can crash the
real agent process between any two changes.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import structlog

from dra_driver import computedomain as cd
from dra_driver.computedomain import cdslices, imexconfig, monitor, nodedriver, nodestate
from dra_driver.devices import model
from dra_driver.driver import cdi
from dra_driver.kube import api as kube
from dra_driver.kube.objects import ObjectApi
from dra_driver.kubelet import dra_service, registration, server
from dra_driver.pluginsettings import PluginSettings
from dra_driver.slices import publisher

CRASH_ENV = "DRA_DRIVER_CD_CRASH_AT"


class StartError(Exception):
    """The ComputeDomain driver cannot start; the message says what to fix."""


class Running:
    """The started driver: its servers, publisher and monitor; :meth:`stop` in reverse."""

    def __init__(self) -> None:
        self.driver: nodedriver.NodeDriver | None = None
        self._stops: list[Callable[[], None]] = []

    def add(self, stop: Callable[[], None]) -> None:
        self._stops.append(stop)

    def stop(self) -> None:
        while self._stops:
            self._stops.pop()()


def objects_for(api: kube.KubeApi) -> ObjectApi:
    """The generic object verbs over the agent's API connection."""
    from dra_driver.kube import objectclient  # the client library, only when it is needed

    try:
        return objectclient.objects_for(api)
    except ValueError as exc:
        raise StartError(f"ComputeDomains need generic object access: {exc}") from exc


def start(
    settings: PluginSettings,
    *,
    api: kube.KubeApi,
    devices: model.NodeDevices,
    log: structlog.typing.FilteringBoundLogger,
) -> Running | None:
    """Serve ``compute-domain.nvidia.com`` if ``settings.compute_domains`` is set."""
    config = settings.compute_domains
    if config is None:
        return None
    if settings.pod_uid:
        raise StartError(
            "--compute-domains does not support seamless upgrades (--pod-uid) yet: the two "
            "instances would share the ComputeDomain driver's sockets and checkpoint"
        )
    if not config.node_ip:
        raise StartError("--compute-domains needs this node's IP (--node-ip, env NODE_IP)")
    mine = dataclasses.replace(settings, driver_name=cd.DRIVER_NAME)
    log = log.bind(driver=cd.DRIVER_NAME)
    clique = cdslices.clique_of(devices)
    major: Callable[[], int | None]
    if settings.fake:
        major = lambda: None  # noqa: E731 - fake channels are backed by the fake device node
    else:
        major = lambda: imexconfig.channel_major(config.proc_devices)  # noqa: E731
    specs = cdi.CdiSpecs(
        root=settings.cdi_root,
        driver_name=cd.DRIVER_NAME,
        host=cdi.HostDevices(dev_root=settings.dev_root),
    )
    driver = nodedriver.NodeDriver(
        kube=api,
        objects=objects_for(api),
        node_name=settings.node_name,
        node_ip=config.node_ip,
        clique=clique,
        plugin_dir=mine.plugin_dir,
        specs=specs,
        imex_port=config.imex_port,
        channel_major=major,
        log=log,
        crash=_crash_point(os.environ.get(CRASH_ENV, "")),
    )
    try:
        driver.recover()
    except (nodestate.CheckpointError, OSError) as exc:
        raise StartError(f"cannot recover the ComputeDomain driver's state: {exc}") from exc
    running = Running()
    running.driver = driver
    try:
        watcher = monitor.Monitor(
            driver=driver,
            interval_s=config.check_interval_s,
            log=log.bind(component="imex-monitor"),
        )
        driver.on_change = watcher.wake
        watcher.start()
        running.add(watcher.stop)
        dra = server.UnixServer(
            path=mine.dra_socket,
            services=[lambda s: dra_service.add_services(s, plugin=driver, log=log)],
            log=log,
            max_workers=4,
        )
        dra.start()
        running.add(lambda: dra.stop(grace_s=5.0))
        reg_service = registration.RegistrationService(
            driver_name=cd.DRIVER_NAME,
            endpoint=str(dra.path),
            log=log,
            versions=registration.DRA_VERSIONS,
        )
        reg = server.UnixServer(
            path=mine.registration_socket, services=[reg_service.add_to], log=log, max_workers=2
        )
        reg.start()
        running.add(lambda: reg.stop(grace_s=1.0))
        if settings.publish:
            slices = publisher.Publisher(
                kube=api,
                driver_name=cd.DRIVER_NAME,
                node_name=settings.node_name,
                watch_timeout_s=settings.watch_timeout_s,
                log=log.bind(component="publisher"),
            )
            slices.set_desired(cdslices.desired(settings.node_name, clique))
            slices.start()
            running.add(slices.stop)
    except Exception:
        running.stop()
        raise
    log.info(
        "ComputeDomain driver ready",
        clique=clique or "none",
        node_ip=config.node_ip,
        dra_socket=str(mine.dra_socket),
        registration_socket=str(mine.registration_socket),
    )
    return running


def _crash_point(step: str) -> Callable[[str], None]:
    def crash(at: str) -> None:
        if step and at == step:
            os._exit(137)

    return crash
