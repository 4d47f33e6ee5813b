"""The kubelet DRA service (v1 and v1beta1): protobuf in, plain driver calls, protobuf out.

Both API versions are served on the same socket by one thin servicer each; the messages are
identical except that v1 devices may carry a ``share_id``. The messages are read and written by
:mod:`~dra_driver.kubelet.wire`, not the protobuf runtime (issue 46: ~1.9 MiB per agent).
Every claim of a request gets an entry in the response map, keyed by claim UID; failures are
that entry's ``error`` string. The call itself only fails (a gRPC status) on a bug of ours, and
then the whole answer is an error the kubelet retries, never a crashed server.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import grpc
import structlog

from dra_driver.driver import claims, results
from dra_driver.kubelet import wire

V1 = "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
V1BETA1 = "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"


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
    """Servicer for one DRA API version (``name``: its full service name; ``share_ids``:
    whether its devices carry a ``share_id``, v1 only)."""

    def __init__(
        self,
        *,
        plugin: Plugin,
        name: str,
        share_ids: bool,
        log: structlog.typing.FilteringBoundLogger,
    ) -> None:
        self.plugin = plugin
        self.name = name
        self.share_ids = share_ids
        self.log = log
        # Whether the per-call debug line is wanted (building its claim list for nothing
        # showed up in the profile) is looked up once.
        self._debug = log.is_enabled_for(logging.DEBUG)

    def NodePrepareResources(
        self, request: wire.ClaimsRequest, context: grpc.ServicerContext
    ) -> dict[str, wire.Prepared]:
        refs = claim_refs(request)
        if self._debug:
            self.log.debug("NodePrepareResources", claims=[r.uid for r in refs])
        answers = self.plugin.prepare(refs)
        response: dict[str, wire.Prepared] = {}
        for ref in refs:
            answer = answers.get(ref.uid) or results.PrepareResult(
                error=f"{ref}: no result (internal error)"
            )
            if answer.error:
                response[ref.uid] = wire.Prepared(error=answer.error)
                continue
            response[ref.uid] = wire.Prepared(
                devices=tuple(
                    wire.Device(
                        request_names=tuple(device.request_names),
                        pool_name=device.pool_name,
                        device_name=device.device_name,
                        cdi_device_ids=tuple(device.cdi_device_ids),
                        share_id=device.share_id if self.share_ids and device.share_id else None,
                    )
                    for device in answer.devices
                )
            )
        return response

    def NodeUnprepareResources(
        self, request: wire.ClaimsRequest, context: grpc.ServicerContext
    ) -> dict[str, str]:
        refs = claim_refs(request)
        if self._debug:
            self.log.debug("NodeUnprepareResources", claims=[r.uid for r in refs])
        answers = self.plugin.unprepare(refs)
        return {ref.uid: answers.get(ref.uid, f"{ref}: no result (internal error)") for ref in refs}

    def add_to(self, server: grpc.Server) -> None:
        """Serve this version on ``server``."""
        wire.add_service(
            server,
            self.name,
            [
                (
                    "NodePrepareResources",
                    wire.unary(
                        self.NodePrepareResources,
                        wire.decode_claims_request,
                        wire.encode_prepare_response,
                    ),
                ),
                (
                    "NodeUnprepareResources",
                    wire.unary(
                        self.NodeUnprepareResources,
                        wire.decode_claims_request,
                        wire.encode_unprepare_response,
                    ),
                ),
            ],
        )


def add_services(
    server: grpc.Server, *, plugin: Plugin, log: structlog.typing.FilteringBoundLogger
) -> None:
    """Register the v1 and v1beta1 DRA services on ``server``."""
    DraService(plugin=plugin, name=V1, share_ids=True, log=log.bind(api="v1")).add_to(server)
    DraService(plugin=plugin, name=V1BETA1, share_ids=False, log=log.bind(api="v1beta1")).add_to(
        server
    )
