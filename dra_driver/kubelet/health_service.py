"""The kubelet DRA health stream (``DRAResourceHealth``, v1alpha1 and v1) on the DRA socket.

Why it exists: with the ``ResourceHealthStatus`` feature the kubelet opens one long-lived
``NodeWatchResources`` stream per DRA plugin and shows what it hears in the pod status
(``allocatedResourcesStatus``), so a workload's owner can see that a GPU failed under it. The
stream carries the *complete* list of this node's devices (pool = node name, names as in our
ResourceSlices) each time: at once when it opens, whenever a device's health changes, and every
``resend_s`` seconds so the kubelet's per-device timeout never turns a quiet device "Unknown".

Health comes from a :class:`~dra_driver.devices.health.HealthSource` (the board the device plugin
reads too); this module only turns it into protobuf. Both API versions have identical messages
and are served by one servicer class each. Streams run in their own slots
(:mod:`~dra_driver.grpcstreams`), never on the workers that serve NodePrepareResources.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from types import ModuleType
from typing import Any

import grpc
import structlog

from dra_driver import grpcstreams
from dra_driver.devices import health
from dra_driver.pb.dra_health.v1 import health_pb2 as v1_pb2
from dra_driver.pb.dra_health.v1 import health_pb2_grpc as v1_grpc
from dra_driver.pb.dra_health.v1alpha1 import health_pb2 as v1alpha1_pb2
from dra_driver.pb.dra_health.v1alpha1 import health_pb2_grpc as v1alpha1_grpc

# Advertised in GetInfo's supported_versions after the DRAPlugin versions (contracts.md §2.3).
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

    def response(self, pb: ModuleType, snapshot: health.Snapshot, now: float) -> Any:
        """The full device list under ``snapshot`` as ``pb``'s NodeWatchResourcesResponse."""
        out = pb.NodeWatchResourcesResponse()
        for name, keys in self.devices.items():
            reason = snapshot.reason(keys)
            item = out.devices.add(
                health=pb.HEALTHY if reason is None else pb.UNHEALTHY,
                last_updated_time=int(now),
                health_check_timeout_seconds=TIMEOUT_S,
                message=(reason or "")[:MAX_MESSAGE],
            )
            item.device.pool_name = self.pool_name
            item.device.device_name = name
        return out

    def stream(self, pb: ModuleType, context: grpc.ServicerContext) -> Iterator[Any]:
        with self.slots.slot(context):
            yield from self._stream(pb, context)

    def _stream(self, pb: ModuleType, context: grpc.ServicerContext) -> Iterator[Any]:
        snap = self.source.snapshot()
        sent_at = time.monotonic()
        self.log.info("health stream opened", devices=len(self.devices))
        yield self.response(pb, snap, time.time())
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
                yield self.response(pb, snap, time.time())
        self.log.info("health stream ended")


class V1HealthService(v1_grpc.DRAResourceHealthServicer):
    """``v1.DRAResourceHealth`` (kubelets 1.37+ prefer it)."""

    def __init__(self, streams: HealthStreams) -> None:
        self.streams = streams

    def NodeWatchResources(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        return self.streams.stream(v1_pb2, context)


class V1alpha1HealthService(v1alpha1_grpc.DRAResourceHealthServicer):
    """``v1alpha1.DRAResourceHealth`` (the only one kubelets 1.34 to 1.36 know)."""

    def __init__(self, streams: HealthStreams) -> None:
        self.streams = streams

    def NodeWatchResources(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        return self.streams.stream(v1alpha1_pb2, context)


def add_services(server: grpc.Server, *, streams: HealthStreams) -> None:
    """Register both health service versions on ``server`` (the DRA socket's server)."""
    v1_grpc.add_DRAResourceHealthServicer_to_server(V1HealthService(streams), server)
    v1alpha1_grpc.add_DRAResourceHealthServicer_to_server(V1alpha1HealthService(streams), server)
