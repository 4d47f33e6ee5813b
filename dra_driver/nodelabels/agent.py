"""Node labels inside a node agent: compute from the discovered devices, follow health, reconcile.

Why it exists: both agents (the DRA kubelet plugin and the legacy device plugin) label their
Node the same way; only the settings differ (the device plugin's MIG strategy and time-slicing
replicas; the DRA agent's defaults). :func:`start` wires the pure computation, the health source
both agents already feed (:class:`~dra_driver.devices.health.HealthBoard`) and the
:class:`~dra_driver.nodelabels.reconcile.NodeLabeler` (a health change triggers it through
the board's change callback), and returns one handle to stop them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from dra_driver.devices import health, model
from dra_driver.kube import api
from dra_driver.nodelabels import compute, reconcile


class Followed(health.HealthSource, Protocol):
    """A health source that calls back on change (a :class:`~.health.HealthBoard`)."""

    def subscribe(self, callback: Callable[[health.Snapshot], None]) -> Callable[[], None]: ...


class Running:
    """A started labeler, triggered by the health source's change callback (no thread of its
    own: nothing wakes while health stays the same, and stopping waits for nothing)."""

    def __init__(
        self, labeler: reconcile.NodeLabeler, source: Followed, log: reconcile.Log
    ) -> None:
        self.labeler = labeler
        self._source = source
        self._log = log
        self._unsubscribe: Callable[[], None] | None = None

    def start(self) -> Running:
        self.labeler.start()
        self._unsubscribe = self._source.subscribe(self._changed)
        return self

    def stop(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self.labeler.stop()

    def _changed(self, snap: health.Snapshot) -> None:
        """On the thread that changed health: hand the work to the labeler's thread."""
        self._log.info("device health changed; re-checking node labels")
        self.labeler.trigger()


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
    source: Followed,
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
