"""The node agent's set-capacity gauges: will the next N-GPU job fit here, and how well?

Why it exists apart from :mod:`dra_driver.metrics`: the four gauges and their update rule (a
size that loses its last free set loses its ``best_set_links`` series, so a dashboard shows a
gap rather than a stale value) are one unit, kept out of the request metrics' module. They live
in the agent's one registry (:class:`~dra_driver.metrics.DriverMetrics` creates them); the
numbers come from :mod:`dra_driver.devices.setcapacity`, the meaning is in docs/metrics.md.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import prometheus_client as prom

if TYPE_CHECKING:
    from dra_driver.devices import setcapacity

GPU_STATES = ("free", "held", "unhealthy")


class SetCapacityGauges:
    """``gpus{state}``, ``placeable_sets{size}``, ``best_set_links{size}`` and
    ``best_set_links_max{size}`` in ``registry``."""

    def __init__(self, *, registry: prom.CollectorRegistry, namespace: str) -> None:
        self.gpus = prom.Gauge(
            "gpus",
            "Full GPUs of this node by state: free, held by prepared claims, unhealthy.",
            ["state"],
            namespace=namespace,
            registry=registry,
        )
        self.placeable_sets = prom.Gauge(
            "placeable_sets",
            "Disjoint sets of N free GPUs on this node (N-GPU claims that still fit here).",
            ["size"],
            namespace=namespace,
            registry=registry,
        )
        self.best_set_links = prom.Gauge(
            "best_set_links",
            "NVLink links among the best free set of N GPUs (as the set ranks pick it).",
            ["size"],
            namespace=namespace,
            registry=registry,
        )
        self.best_set_links_max = prom.Gauge(
            "best_set_links_max",
            "NVLink links among the best set of N GPUs of this node when all are free.",
            ["size"],
            namespace=namespace,
            registry=registry,
        )
        self._lock = threading.Lock()
        self._best_sizes: set[int] = set()

    def set(self, cap: setcapacity.SetCapacity) -> None:
        """GPUs by state, placeable sets and the links of the best free set per size now."""
        with self._lock:
            for state, count in zip(GPU_STATES, (cap.free, cap.held, cap.unhealthy), strict=True):
                self.gpus.labels(state=state).set(count)
            for size, count in cap.placeable.items():
                self.placeable_sets.labels(size=str(size)).set(count)
            for size, links in cap.best_links_max.items():
                self.best_set_links_max.labels(size=str(size)).set(links)
            for size in self._best_sizes - set(cap.best_links):
                self.best_set_links.remove(str(size))
            for size, links in cap.best_links.items():
                self.best_set_links.labels(size=str(size)).set(links)
            self._best_sizes = set(cap.best_links)
