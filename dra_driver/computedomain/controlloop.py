"""The controller's main loop: lead, watch, reconcile.

Why it exists apart from :mod:`.controller`: reconciliation is a pure "make it so" round; when
to run one is this module's business. The loop renews (or tries to take) the leader Lease every
``renew_s``; while it leads, it runs a round whenever a watched ComputeDomain or DaemonSet
changes and at least every ``resync_s`` (a missed event costs at most that). A follower only
keeps trying for the Lease. On stop the Lease is released so a standby takes over at once.
"""

from __future__ import annotations

import threading
import time

import structlog

from dra_driver.computedomain import controller as controller_mod
from dra_driver.computedomain import leader as leader_mod
from dra_driver.kube import api
from dra_driver.kube.objects import COMPUTE_DOMAINS, Kind, ObjectApi

LEASE_NAME = "dra-driver-compute-domain-controller"


class ControlLoop:
    """``run()`` until ``stop`` is set (one instance per process)."""

    def __init__(
        self,
        *,
        objects: ObjectApi,
        controller: controller_mod.Controller,
        elector: leader_mod.LeaderElector,
        log: structlog.typing.FilteringBoundLogger,
        resync_s: float = 30.0,
        renew_s: float = 5.0,
        watch_timeout_s: float = 60.0,
    ) -> None:
        self._objects = objects
        self.controller = controller
        self.elector = elector
        self._log = log
        self.resync_s = resync_s
        self.renew_s = renew_s
        self.watch_timeout_s = watch_timeout_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.rounds = 0

    def run(self, stop: threading.Event) -> None:
        threading.Thread(
            target=self._watch, args=(COMPUTE_DOMAINS, stop), name="watch-domains", daemon=True
        ).start()
        metrics = self.controller.metrics
        last_round = 0.0
        next_renew = 0.0
        try:
            while not stop.is_set():
                now = time.monotonic()
                if now >= next_renew:
                    leading = self.elector.step()
                    metrics.leader.set(1 if leading else 0)
                    next_renew = now + self.renew_s
                if self.elector.is_leader() and (
                    self._wake.is_set() or now - last_round >= self.resync_s
                ):
                    self._wake.clear()
                    last_round = now
                    self._round()
                wait = max(0.0, min(next_renew, last_round + self.resync_s) - time.monotonic())
                self._wake.wait(
                    wait if self.elector.is_leader() else max(0.0, next_renew - time.monotonic())
                )
                if stop.is_set():
                    break
        finally:
            self._stop.set()
            self._wake.set()
            self.elector.release()
            metrics.leader.set(0)

    def _round(self) -> None:
        try:
            self.controller.reconcile_all()
        except api.ApiError as exc:
            self._log.warning("ComputeDomain round failed; will retry", error=str(exc))
        self.rounds += 1

    def _watch(self, kind: Kind, stop: threading.Event) -> None:
        """Wake the loop on every change of ``kind`` (re-listing when the watch breaks)."""
        version = ""
        while not stop.is_set() and not self._stop.is_set():
            try:
                if not version:
                    _, version = self._objects.list(kind, namespace=None)
                for event in self._objects.watch(
                    kind, resource_version=version, timeout_s=self.watch_timeout_s
                ):
                    if stop.is_set() or self._stop.is_set():
                        return
                    if event.type == "ERROR":
                        version = ""
                        break
                    version = str(
                        event.object.get("metadata", {}).get("resourceVersion") or version
                    )
                    if event.type != "BOOKMARK":
                        self._wake.set()
            except api.ApiError as exc:
                version = ""
                self._log.debug("watch ended; watching again", kind=kind.kind, error=str(exc))
                stop.wait(1.0)
            except OSError as exc:
                version = ""
                self._log.debug("watch ended; watching again", kind=kind.kind, error=str(exc))
                stop.wait(1.0)
