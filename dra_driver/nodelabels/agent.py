"""Node labels inside a node agent: compute from the discovered devices, follow health, reconcile.

Why it exists: both agents (the DRA kubelet plugin and the legacy device plugin) label their
Node the same way; only the settings differ (the device plugin's MIG strategy and time-slicing
replicas; the DRA agent's defaults). :func:`start` wires the pure computation, the health source
both agents already feed (:class:`~dra_driver.devices.health.HealthBoard`) and the
:class:`~dra_driver.nodelabels.reconcile.NodeLabeler`, and returns one handle to stop them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from dra_driver.devices import health, model
from dra_driver.kube import api
from dra_driver.nodelabels import compute, reconcile

HEALTH_POLL_S = 1.0  # longest wait for a health change before checking for stop


class Running:
    """A started labeler plus the thread that triggers it on health changes."""

    def __init__(
        self, labeler: reconcile.NodeLabeler, source: health.HealthSource, log: reconcile.Log
    ) -> None:
        self.labeler = labeler
        self._source = source
        self._log = log
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="node-labels-health", daemon=True)

    def start(self) -> Running:
        self.labeler.start()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.labeler.stop()
        self._thread.join(HEALTH_POLL_S * 2)

    def _follow(self) -> None:
        version = self._source.snapshot().version
        while not self._stop.is_set():
            snap = self._source.wait_changed(version, timeout=HEALTH_POLL_S)
            if snap.version != version:
                version = snap.version
                self._log.info("device health changed; re-checking node labels")
                self.labeler.trigger()
            elif getattr(self._source, "closed", False):
                return  # a closed board answers at once from now on: nothing more to follow


def desired_labels(
    devices: model.NodeDevices, settings: compute.Settings, source: health.HealthSource
) -> Callable[[], dict[str, str]]:
    """The labels for the devices' current health, computed afresh on every call."""

    def labels() -> dict[str, str]:
        return compute.compute(devices, settings, unhealthy=source.snapshot().unhealthy).labels

    return labels


def start(
    *,
    kube: api.KubeApi,
    node_name: str,
    devices: model.NodeDevices,
    settings: compute.Settings,
    source: health.HealthSource,
    log: reconcile.Log,
    resync_s: float = 60.0,
    on_pass: Callable[[reconcile.Outcome | None], None] | None = None,
) -> Running:
    """Start keeping ``node_name``'s GPU labels; warnings about the choice are logged once."""
    for warning in compute.compute(devices, settings).warnings:
        log.warning("node labels", problem=warning)
    labeler = reconcile.NodeLabeler(
        kube=kube,
        node_name=node_name,
        desired=desired_labels(devices, settings, source),
        log=log,
        resync_s=resync_s,
        on_pass=on_pass,
    )
    return Running(labeler, source, log).start()
