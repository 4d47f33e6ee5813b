"""Keeps each prepared IMEX daemon's nodes config current, and reports its readiness.

Why it exists: the set of a domain's nodes changes after its daemon was prepared — peers join
as their workload pods land, leave as they end — and the daemon must always be configured with
the peers of its clique; the domain's status must say whether this node's daemon is ready
(workload prepares wait for it, the controller counts it). Every ``interval_s`` (and at once
when woken), for every prepared daemon claim of this node: read the domain, rewrite
``nodes.cfg`` if its peers changed, read the daemon's ``status.json`` and set this node's
``status.nodes`` entry Ready or NotReady accordingly. A failed round is logged and retried.
"""

from __future__ import annotations

import threading

import structlog

from dra_driver.computedomain import api as cdapi
from dra_driver.computedomain import imexconfig
from dra_driver.computedomain.nodedriver import NodeDriver
from dra_driver.computedomain.nodestate import DAEMON, PREPARED
from dra_driver.kube import api
from dra_driver.kube.objects import COMPUTE_DOMAINS


class Monitor:
    def __init__(
        self, *, driver: NodeDriver, interval_s: float, log: structlog.typing.FilteringBoundLogger
    ) -> None:
        self._driver = driver
        self.interval_s = interval_s
        self._log = log
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="cd-monitor", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except (api.ApiError, OSError) as exc:
                self._log.warning("IMEX daemon check failed; will retry", error=str(exc))
            self._wake.wait(self.interval_s)
            self._wake.clear()

    def step(self) -> None:
        """One round over this node's prepared daemon claims."""
        driver = self._driver
        with driver.lock:
            records = [
                r for r in driver.state.records.values() if r.kind == DAEMON and r.state == PREPARED
            ]
        for record in records:
            log = self._log.bind(domain=f"{record.domain_namespace}/{record.domain_name}")
            try:
                obj = driver.objects.get(
                    COMPUTE_DOMAINS, record.domain_name, namespace=record.domain_namespace
                )
            except api.NotFound:
                continue  # deleted: its daemon pod goes, and its claim with it
            domain = cdapi.Domain.from_obj(obj)
            if domain.uid != record.domain_uid:
                continue
            directory = driver.domain_dir(domain.uid)
            with driver.lock:  # never against an unprepare of the same claim
                if driver.state.get(record.uid) is None:
                    continue
                peers = driver.peers(domain)
                if imexconfig.write_nodes(directory, peers):
                    log.info("IMEX nodes config updated", peers=peers)
                ready = imexconfig.daemon_ready(directory)
                mine = domain.node(driver.node_name)
                if mine is None or (mine.status == cdapi.READY) == ready:
                    continue
                if driver.member.set_ready(domain.uid, domain.namespace, domain.name, ready):
                    log.info("IMEX daemon readiness reported", ready=ready, node=driver.node_name)
