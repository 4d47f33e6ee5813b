"""This node's ResourceSlice publishing, as the node agent runs it.

Why it exists: the agent does not just run a :class:`~dra_driver.slices.publisher.Publisher`.
It runs it only while it holds the node's publisher lock (:mod:`~dra_driver.slices.leader`: one
publisher among the node's agent instances), keeps the desired set following GPU health and the
GPUs prepared claims hold (:mod:`~dra_driver.slices.republish`: device taints, set ranks), and
turns what the publisher reports into readiness: :meth:`NodePublisher.published` is true while
our slices are published — by us, with reconciles succeeding and the watch open, failures
tolerated for ``grace_s`` (:class:`~dra_driver.health_server.Grace`) — or by the other instance
while we stand by.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from dra_driver import health_server
from dra_driver import metrics as metrics_mod
from dra_driver.devices import health, holdings, migprofiles, model
from dra_driver.kube import api as kube
from dra_driver.slices import leader, publisher, republish, serverfeatures, shares


class NodePublisher:
    """This node's publisher, run only while this instance holds the node's publisher lock,
    and what readiness reads from it."""

    def __init__(
        self,
        *,
        driver_name: str,
        node_name: str,
        devices: model.NodeDevices,
        api: kube.KubeApi,
        lock_file: Path,
        grace_s: float,
        watch_timeout_s: float,
        log: structlog.typing.FilteringBoundLogger,
        metrics: metrics_mod.DriverMetrics | None = None,
        board: health.HealthBoard | None = None,
        dynamic_mig: migprofiles.DynamicMig = migprofiles.STATIC,
        shareable: shares.Shareable = shares.NONE,
        gpu_sets: bool = True,
        held: holdings.HeldGpus | None = None,
        features: serverfeatures.ServerFeatures | None = None,
        allocated: holdings.HeldGpus | None = None,
    ) -> None:
        """Raises :class:`~dra_driver.slices.build.BuildError` when no slice can be built.
        ``grace_s``: how long publishing may fail before :meth:`published` says no;
        ``board``: GPU health, published as device taints; ``held``: the full GPUs prepared
        claims hold, left out of the set ranks (both re-published on every change);
        ``allocated``: the full GPUs of claims allocated on this node (not prepared yet), also
        left out of the ranks (:mod:`~dra_driver.slices.allocwatch`);
        ``features``: what the API server keeps (publishing adapts, re-probed when the
        publisher reconnects or a write comes back without fields we sent)."""
        self.metrics = metrics
        self.reconciles = health_server.Grace(grace_s)
        self.watches = health_server.Grace(grace_s, ready=True)
        inputs = republish.current(
            board, held, allocated
        )  # the first build's; the follower goes on
        kept = features.kept if features is not None else serverfeatures.ALL_KEPT
        first, first_dynamic, first_shareable = serverfeatures.publishable(
            kept, devices, dynamic_mig=dynamic_mig, shareable=shareable
        )
        self.publisher = publisher.start_node_publisher(
            start=False,
            api=api,
            devices=first,
            driver_name=driver_name,
            node_name=node_name,
            log=log,
            on_pass=self._passed,
            on_watch=lambda ok: self.watches.ok() if ok else self.watches.failed(),
            watch_timeout_s=watch_timeout_s,
            decorate=republish.decoration(inputs.health if board else None, driver_name, kept),
            dynamic_mig=first_dynamic,
            shareable=first_shareable,
            gpu_sets=gpu_sets,
            taken=inputs.taken,
            on_reconnect=features.reconnected if features is not None else None,
            on_dropped=features.fields_dropped if features is not None else None,
        )
        self.follower: republish.Republisher | None = None
        if board is not None or held is not None or allocated is not None:  # follow them always
            self.follower = republish.follow(
                self.publisher,
                board=board,
                held=held,
                allocated=allocated,
                built_from=inputs,
                devices=devices,
                node_name=node_name,
                driver_name=driver_name,
                log=log,
                dynamic_mig=dynamic_mig,
                shareable=shareable,
                gpu_sets=gpu_sets,
                metrics=metrics,
                kept=(lambda: features.kept) if features is not None else None,
            )
        if features is not None:
            rebuild = republish.rebuilder(
                devices,
                node_name=node_name,
                driver_name=driver_name,
                tainted=board is not None,
                dynamic_mig=dynamic_mig,
                shareable=shareable,
                gpu_sets=gpu_sets,
                kept=lambda: features.kept,
            )
            features.subscribe(lambda kept: self._features_changed(board, held, allocated, rebuild))
        self.lock = leader.PublisherLock(lock_file, log=log)

    def start(self) -> None:
        self.lock.start(on_acquired=self.publisher.start)

    def stop(self) -> None:
        if self.follower is not None:
            self.follower.stop()  # stops the publisher too
        else:
            self.publisher.stop()
        self.lock.release()

    def published(self) -> bool:
        """Readiness: published by us (failures within the grace period), or by the other
        instance while we stand by."""
        return self.lock.standby or (self.reconciles() and self.watches())

    def _features_changed(
        self,
        board: health.HealthBoard | None,
        held: holdings.HeldGpus | None,
        allocated: holdings.HeldGpus | None,
        rebuild: Callable[[republish.Inputs], list[dict[str, Any]]],
    ) -> None:
        """What the API server keeps changed: rebuild the desired set for it."""
        if self.follower is not None:
            self.follower.refresh()
        else:
            self.publisher.set_desired(rebuild(republish.current(board, held, allocated)))

    def _passed(self, outcome: publisher.Outcome | None) -> None:
        if self.metrics is not None:
            self.metrics.slice_publish(
                ok=outcome is not None, slices=outcome.slices if outcome else None
            )
        if outcome is None:
            self.reconciles.failed()
        else:
            self.reconciles.ok()
