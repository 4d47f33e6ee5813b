"""The DevicePlugin v1beta1 gRPC servicer for one extended resource: protobuf in, protobuf out.

Deliberately thin: device lists come from :mod:`inventory` and :mod:`health`, preferred sets from
:mod:`preferred`, container edits from :mod:`allocate`. This module only converts between
protobuf and those plain values and turns request errors into per-call gRPC errors
(``INVALID_ARGUMENT`` naming the bad ID or size), so one bad request never disturbs the server.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import NoReturn

import grpc

from dra_driver import grpcstreams, logs
from dra_driver.deviceplugin import allocate, cdi, inventory, preferred
from dra_driver.deviceplugin import mps as mps_replicas
from dra_driver.devices import health, topology
from dra_driver.pb.deviceplugin.v1beta1 import deviceplugin_pb2 as pb
from dra_driver.pb.deviceplugin.v1beta1 import deviceplugin_pb2_grpc as pb_grpc

_log = logs.get("deviceplugin.service")

HealthView = tuple[bool, ...]
MAX_DETAILS = 2048  # characters of an error's status details


class DevicePluginService(pb_grpc.DevicePluginServicer):
    """Serves one resource; survives server restarts (kubelet restarts) as the same object."""

    def __init__(
        self,
        *,
        resource: inventory.Resource,
        topo: topology.Topology,
        health_source: health.HealthSource,
        strategy: allocate.Strategy,
        cdi_kind: str,
        spec: cdi.StaticSpec | None,
        fake_node: str | None,
        stream_poll_s: float,
        slots: grpcstreams.StreamSlots | None = None,
        mps: mps_replicas.MpsReplicas | None = None,
    ) -> None:
        self.resource = resource
        self._mps = mps
        # ListAndWatch streams get their own threads (the server adds ``slots.limit``).
        self.slots = slots or grpcstreams.StreamSlots(what=f"{resource.name} ListAndWatch")
        self._topo = topo
        self._health = health_source
        self._strategy = strategy
        self._cdi_kind = cdi_kind
        self._spec = spec
        self._fake_node = fake_node
        self._poll = stream_poll_s
        self._stopping = threading.Event()
        self._log = _log.bind(resource=resource.name)

    def stop(self) -> None:
        """End all ListAndWatch streams (within ``stream_poll_s``); used at shutdown."""
        self._stopping.set()

    def device_list(self, snapshot: health.Snapshot) -> pb.ListAndWatchResponse:
        """The full device list with each device's health under ``snapshot``."""
        out = pb.ListAndWatchResponse()
        for dev in self.resource.devices:
            item = out.devices.add(ID=dev.id, health=_health(snapshot, dev))
            if dev.unit.numa_node is not None:
                item.topology.nodes.add(ID=dev.unit.numa_node)
        return out

    def _view(self, snapshot: health.Snapshot) -> HealthView:
        return tuple(_healthy(snapshot, d) for d in self.resource.devices)

    # --- gRPC methods -------------------------------------------------------------------------

    def GetDevicePluginOptions(
        self, request: pb.Empty, context: grpc.ServicerContext
    ) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=True
        )

    def ListAndWatch(
        self, request: pb.Empty, context: grpc.ServicerContext
    ) -> Iterator[pb.ListAndWatchResponse]:
        with self.slots.slot(context):
            yield from self._list_and_watch(context)

    def _list_and_watch(self, context: grpc.ServicerContext) -> Iterator[pb.ListAndWatchResponse]:
        snap = self._health.snapshot()
        last = self._view(snap)
        self._log.info("ListAndWatch started", devices=len(last), unhealthy=last.count(False))
        yield self.device_list(snap)
        while not self._stopping.is_set() and context.is_active():
            snap = self._health.wait_changed(snap.version, self._poll)
            view = self._view(snap)
            if view != last:
                last = view
                self._log.info(
                    "device health changed, sending list",
                    unhealthy=[
                        d.id for d, ok in zip(self.resource.devices, view, strict=True) if not ok
                    ],
                )
                yield self.device_list(snap)
        self._log.info("ListAndWatch ended")

    def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> pb.PreferredAllocationResponse:
        out = pb.PreferredAllocationResponse()
        for i, creq in enumerate(request.container_requests):
            try:
                ids = preferred.choose(
                    self.resource,
                    self._topo,
                    available=list(creq.available_deviceIDs),
                    must_include=list(creq.must_include_deviceIDs),
                    size=creq.allocation_size,
                )
            except inventory.RequestError as exc:
                self._reject(context, "GetPreferredAllocation", i, exc)
            out.container_responses.add(deviceIDs=ids)
            self._log.info(
                "preferred allocation", container=i, size=creq.allocation_size, devices=ids
            )
        return out

    def Allocate(
        self, request: pb.AllocateRequest, context: grpc.ServicerContext
    ) -> pb.AllocateResponse:
        snap = self._health.snapshot()
        out = pb.AllocateResponse()
        for i, creq in enumerate(request.container_requests):
            try:
                edits = allocate.container_edits(
                    self.resource,
                    list(creq.devices_ids),
                    strategy=self._strategy,
                    cdi_kind=self._cdi_kind,
                    snapshot=snap,
                    fake_node=self._fake_node,
                    mps=self._mps,
                )
            except allocate.UnhealthyDeviceError as exc:
                self._reject(context, "Allocate", i, exc, grpc.StatusCode.FAILED_PRECONDITION)
            except inventory.RequestError as exc:
                self._reject(context, "Allocate", i, exc)
            if edits.cdi_devices and self._spec is not None:
                try:
                    self._spec.ensure()
                except cdi.CdiError as exc:
                    self._log.error("CDI spec missing and cannot be written", error=str(exc))
                    context.abort(grpc.StatusCode.INTERNAL, str(exc))
            resp = out.container_responses.add()
            resp.envs.update(edits.envs)
            for node in edits.device_nodes:
                resp.devices.add(
                    container_path=node.container_path,
                    host_path=node.host_path,
                    permissions=node.permissions,
                )
            for name in edits.cdi_devices:
                resp.cdi_devices.add(name=name)
            for mount in edits.mounts:
                resp.mounts.add(container_path=mount.container_path, host_path=mount.host_path)
            self._log.info(
                "allocated",
                container=i,
                devices=list(creq.devices_ids),
                cdi_devices=list(edits.cdi_devices),
            )
        return out

    def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()

    def _reject(
        self,
        context: grpc.ServicerContext,
        call: str,
        container: int,
        exc: Exception,
        code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT,
    ) -> NoReturn:
        message = f"{self.resource.name}: container_requests[{container}]: {exc}"
        if len(message) > MAX_DETAILS:  # status details travel in metadata (limited in size)
            message = message[:MAX_DETAILS] + "..."
        self._log.warning(f"{call} rejected", error=message)
        context.abort(code, message)


def _healthy(snapshot: health.Snapshot, dev: inventory.PluginDevice) -> bool:
    """A unit that cannot be given out (``problem``) is always listed unhealthy."""
    return not dev.unit.problem and snapshot.is_healthy(dev.unit.health_keys)


def _health(snapshot: health.Snapshot, dev: inventory.PluginDevice) -> str:
    return health.HEALTHY if _healthy(snapshot, dev) else health.UNHEALTHY
