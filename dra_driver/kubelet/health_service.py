"""The kubelet DRA health stream (``DRAResourceHealth``, v1alpha1 and v1) on the DRA socket.

Why it exists: with the ``ResourceHealthStatus`` feature the kubelet opens one long-lived
``NodeWatchResources`` stream per DRA plugin and shows what it hears in the pod status
(``allocatedResourcesStatus``), so a workload's owner can see that a GPU failed under it. The
stream carries the *complete* list of this node's devices (pool = node name, names as in our
ResourceSlices) each time: at once when it opens, whenever a device's health changes, and every
``resend_s`` seconds so the kubelet's per-device timeout never turns a quiet device "Unknown".

Health comes from a :class:`~dra_driver.devices.health.HealthSource` (the board the device plugin
reads too); this module only turns it into the stream's messages (written by
:mod:`~dra_driver.kubelet.wire`). Both API versions have identical messages and are served by
the same code under their two service names. Streams run in their own slots
(:mod:`~dra_driver.grpcstreams`), never on the workers that serve NodePrepareResources.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping, Sequence

import grpc
import structlog

from dra_driver import grpcstreams
from dra_driver.devices import health
from dra_driver.kubelet import wire

# Advertised in GetInfo's supported_versions after the DRAPlugin versions (contracts.md §2.3),
# and the services' full names: kubelets 1.37+ prefer v1, 1.34 to 1.36 know only v1alpha1.
HEALTH_VERSIONS = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
RESEND_S = 20.0
TIMEOUT_S = 60  # health_check_timeout_seconds: three resends may be lost before "Unknown"
MAX_MESSAGE = 1024


class HealthStreams:
    """What both servicers share: the device list, the health source and a stop switch."""

    def __init__(
        self,
        *,
        pool_name: str,
        devices: Mapping[str, Sequence[str]],
        source: health.HealthSource,
        log: structlog.typing.FilteringBoundLogger,
        resend_s: float = RESEND_S,
        poll_s: float = 1.0,
        slots: grpcstreams.StreamSlots | None = None,
    ) -> None:
        self.pool_name = pool_name
        self.slots = slots or grpcstreams.StreamSlots(what="DRA health stream")
        self.devices = {name: tuple(keys) for name, keys in sorted(devices.items())}
        self.source = source
        self.log = log
        self.resend_s = resend_s
        self.poll_s = poll_s
        self._stopping = threading.Event()

    def stop(self) -> None:
        """End every open stream within ``poll_s`` (shutdown: the server need not wait)."""
        self._stopping.set()

    def response(self, snapshot: health.Snapshot, now: float) -> list[wire.DeviceHealth]:
        """The full device list under ``snapshot`` (a NodeWatchResourcesResponse)."""
        out = []
        for name, keys in self.devices.items():
            reason = snapshot.reason(keys)
            out.append(
                wire.DeviceHealth(
                    pool_name=self.pool_name,
                    device_name=name,
                    health=wire.HEALTHY if reason is None else wire.UNHEALTHY,
                    last_updated_time=int(now),
                    health_check_timeout_seconds=TIMEOUT_S,
                    message=(reason or "")[:MAX_MESSAGE],
                )
            )
        return out

    def stream(
        self, request: wire.Empty, context: grpc.ServicerContext
    ) -> Iterator[list[wire.DeviceHealth]]:
        """``NodeWatchResources`` (either version)."""
        with self.slots.slot(context):
            yield from self._stream(context)

    def _stream(self, context: grpc.ServicerContext) -> Iterator[list[wire.DeviceHealth]]:
        snap = self.source.snapshot()
        sent_at = time.monotonic()
        self.log.info("health stream opened", devices=len(self.devices))
        yield self.response(snap, time.time())
        while not self._stopping.is_set() and context.is_active():
            wait = min(self.poll_s, max(0.0, self.resend_s - (time.monotonic() - sent_at)))
            new = self.source.wait_changed(snap.version, wait)
            changed = new.version != snap.version
            if changed or time.monotonic() - sent_at >= self.resend_s:
                if changed:
                    self.log.info(
                        "device health changed, sending list",
                        unhealthy=[n for n, k in self.devices.items() if not new.is_healthy(k)],
                    )
                snap, sent_at = new, time.monotonic()
                yield self.response(snap, time.time())
        self.log.info("health stream ended")


def add_services(server: grpc.Server, *, streams: HealthStreams) -> None:
    """Register both health service versions on ``server`` (the DRA socket's server)."""
    for name in HEALTH_VERSIONS:
        handler = wire.streaming(streams.stream, wire.decode_empty, wire.encode_health_list)
        wire.add_service(server, name, [("NodeWatchResources", handler)])
