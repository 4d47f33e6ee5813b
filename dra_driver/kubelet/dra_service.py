"""The kubelet DRA service (v1 and v1beta1): protobuf in, plain driver calls, protobuf out.

Both API versions are served on the same socket by one thin servicer each; the messages are
identical except that v1 devices may carry a ``share_id``. Every claim of a request gets an
entry in the response map, keyed by claim UID; failures are that entry's ``error`` string. The
call itself only fails (a gRPC status) on a bug of ours, and then the whole answer is an error the
kubelet retries, never a crashed server.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any, Protocol

import grpc
import structlog

from dra_driver.driver import claims, results
from dra_driver.pb.dra.v1 import dra_pb2 as v1_pb2
from dra_driver.pb.dra.v1 import dra_pb2_grpc as v1_grpc
from dra_driver.pb.dra.v1beta1 import dra_pb2 as v1beta1_pb2
from dra_driver.pb.dra.v1beta1 import dra_pb2_grpc as v1beta1_grpc


class Plugin(Protocol):
    """What the service needs from the driver core (:class:`dra_driver.driver.driver.Driver`)."""

    def prepare(self, refs: Sequence[claims.ClaimRef]) -> Mapping[str, results.PrepareResult]: ...

    def unprepare(self, refs: Sequence[claims.ClaimRef]) -> Mapping[str, str]: ...


def claim_refs(request: Any) -> list[claims.ClaimRef]:
    """The claims of a prepare/unprepare request, as plain data; a claim listed more than once
    is kept once (its first entry), since the answer has one entry per claim UID."""
    refs: dict[str, claims.ClaimRef] = {}
    for c in request.claims:
        if c.uid not in refs:
            refs[c.uid] = claims.ClaimRef(uid=c.uid, namespace=c.namespace, name=c.name)
    return list(refs.values())


class DraService:
    """Servicer for one DRA API version (``pb`` = that version's generated message module)."""

    def __init__(
        self,
        *,
        plugin: Plugin,
        pb: ModuleType,
        share_ids: bool,
        log: structlog.typing.FilteringBoundLogger,
    ) -> None:
        self.plugin = plugin
        self.pb = pb
        self.share_ids = share_ids
        self.log = log
        # Per call only what must be: the response classes and whether the per-call debug
        # line is wanted (building its claim list for nothing showed up in the profile) are
        # looked up once.
        self._debug = log.is_enabled_for(logging.DEBUG)
        self._prepare_response = pb.NodePrepareResourcesResponse
        self._unprepare_response = pb.NodeUnprepareResourcesResponse

    def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        refs = claim_refs(request)
        if self._debug:
            self.log.debug("NodePrepareResources", claims=[r.uid for r in refs])
        answers = self.plugin.prepare(refs)
        response = self._prepare_response()
        claims_out = response.claims
        for ref in refs:
            answer = answers.get(ref.uid) or results.PrepareResult(
                error=f"{ref}: no result (internal error)"
            )
            entry = claims_out[ref.uid]
            if answer.error:
                entry.error = answer.error
                continue
            add = entry.devices.add
            for device in answer.devices:
                out = add(
                    request_names=device.request_names,
                    pool_name=device.pool_name,
                    device_name=device.device_name,
                    cdi_device_ids=device.cdi_device_ids,
                )
                if self.share_ids and device.share_id:
                    out.share_id = device.share_id
        return response

    def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        refs = claim_refs(request)
        if self._debug:
            self.log.debug("NodeUnprepareResources", claims=[r.uid for r in refs])
        answers = self.plugin.unprepare(refs)
        response = self._unprepare_response()
        claims_out = response.claims
        for ref in refs:
            entry = claims_out[ref.uid]
            error = answers.get(ref.uid, f"{ref}: no result (internal error)")
            if error:
                entry.error = error
        return response


class V1Service(DraService, v1_grpc.DRAPluginServicer):
    """``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin``."""


class V1beta1Service(DraService, v1beta1_grpc.DRAPluginServicer):
    """``k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin``."""


def add_services(
    server: grpc.Server, *, plugin: Plugin, log: structlog.typing.FilteringBoundLogger
) -> None:
    """Register the v1 and v1beta1 DRA services on ``server``."""
    v1_grpc.add_DRAPluginServicer_to_server(
        V1Service(plugin=plugin, pb=v1_pb2, share_ids=True, log=log.bind(api="v1")), server
    )
    v1beta1_grpc.add_DRAPluginServicer_to_server(
        V1beta1Service(plugin=plugin, pb=v1beta1_pb2, share_ids=False, log=log.bind(api="v1beta1")),
        server,
    )
