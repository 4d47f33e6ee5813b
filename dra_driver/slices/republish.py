"""Re-hand the node's desired ResourceSlices to the publisher whenever GPU health changes.

Why it exists: an unhealthy GPU must show up as a device taint in the published slices within
seconds, and a recovered one must lose it. The publisher is declarative (``set_desired``: the
complete desired set; it writes only what differs and bumps the pool generation once per
change), so all this does is rebuild the desired set under the board's current health and hand it
over — in its own thread, because board subscribers must return at once. Health changes that do
not change any taint rebuild byte-identical slices, and the publisher writes nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import structlog

from dra_driver.devices import health, migprofiles, model
from dra_driver.slices import build, shares, taints

Obj = dict[str, Any]


class Desired(Protocol):
    def set_desired(self, slices: Iterable[Obj]) -> None: ...

    def stop(self) -> None: ...


class HealthRepublisher:
    """Follows ``board``; on each change hands ``rebuild(snapshot)`` to ``publisher``.
    :meth:`stop` stops following, then the publisher."""

    def __init__(
        self,
        *,
        publisher: Desired,
        rebuild: Callable[[health.Snapshot], list[Obj]],
        board: health.HealthBoard,
        log: structlog.typing.FilteringBoundLogger,
        built_at_version: int,
    ) -> None:
        """``built_at_version``: the board version the publisher's current desired set was
        built from (a change between that build and :meth:`start` is not missed)."""
        self._publisher = publisher
        self._rebuild = rebuild
        self._board = board
        self._log = log
        self._version = built_at_version
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._unsubscribe: Callable[[], None] | None = None
        self._thread = threading.Thread(target=self._run, name="slice-health", daemon=True)

    def start(self) -> None:
        self._unsubscribe = self._board.subscribe(lambda snap: self._wake.set())
        if self._board.snapshot().version != self._version:
            self._wake.set()
        self._thread.start()

    def stop(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(5.0)
        self._publisher.stop()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            if self._stop.is_set():
                return
            self._wake.clear()
            snap = self._board.snapshot()
            if snap.version == self._version:
                continue
            try:
                slices = self._rebuild(snap)
            except Exception as exc:  # keep following; the last good set stays published
                self._log.error(
                    "cannot rebuild ResourceSlices after a health change", error=repr(exc)
                )
                continue
            self._version = snap.version
            self._log.info(
                "GPU health changed; re-publishing ResourceSlices",
                health_version=snap.version,
                unhealthy=sorted(snap.unhealthy),
            )
            self._publisher.set_desired(slices)


def follow(
    publisher: Desired,
    *,
    board: health.HealthBoard,
    built_at_version: int,
    devices: model.NodeDevices,
    node_name: str,
    driver_name: str,
    log: structlog.typing.FilteringBoundLogger,
    dynamic_mig: migprofiles.DynamicMig = migprofiles.STATIC,
    shareable: shares.Shareable = shares.NONE,
    gpu_sets: bool = True,
) -> HealthRepublisher:
    """Start re-publishing ``devices``' slices with the taints of ``board`` on every change
    (``shareable`` GPUs stay published with their consumable capacity)."""

    def rebuild(snapshot: health.Snapshot) -> list[Obj]:
        return build.build(
            devices,
            node_name=node_name,
            driver_name=driver_name,
            decorate=taints.decorator(snapshot, driver_name),
            dynamic_mig=dynamic_mig,
            shareable=shareable,
            gpu_sets=gpu_sets,
        ).slices

    follower = HealthRepublisher(
        publisher=publisher,
        rebuild=rebuild,
        board=board,
        log=log,
        built_at_version=built_at_version,
    )
    follower.start()
    return follower
