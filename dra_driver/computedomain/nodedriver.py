"""The node side of ``compute-domain.nvidia.com``: prepare and unprepare channel and daemon claims.

Why it exists: this is what turns an allocated claim into an IMEX channel in a container. A
*channel* claim (a workload pod's, from the domain's ResourceClaimTemplate) joins this node to
the domain (its ``status.nodes`` entry, refused across cliques), binds the node with the label
the domain's daemon DaemonSet selects, and then waits — answering a retryable error the kubelet
retries — until this node's IMEX daemon is ready; then its CDI spec injects the channel. A
*daemon* claim (the daemon pod's) writes the IMEX configuration (:mod:`.imexconfig`), which
:mod:`.monitor` keeps current. Unprepare undoes it all: the last channel claim of a domain
leaves it (entry and label go), the daemon claim removes the IMEX files.

Crash safety: see :mod:`.nodestate` (recorded before any change, undone before the record
goes). :meth:`NodeDriver.recover` undoes the claims that disappeared while the agent was down,
removes IMEX directories no claim explains, and the label no claim explains. ``crash`` is a test
seam: called with the name of each step, it may end the process there.

Calls are serialized (one lock): they are rare, and the node-wide label allows one domain.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import structlog

from dra_driver import computedomain as cd
from dra_driver import logs
from dra_driver.computedomain import api as cdapi
from dra_driver.computedomain import cdspecs, imexconfig, membership, nodestate
from dra_driver.computedomain.nodestate import CHANNEL, DAEMON, PREPARED, Record
from dra_driver.driver import cdi, claims, results
from dra_driver.kube import api
from dra_driver.kube.objects import COMPUTE_DOMAINS, ObjectApi


class NotReady(claims.ClaimError):
    """This node's IMEX daemon of the domain is not ready yet (the kubelet retries)."""


class NodeDriver:
    """The :class:`~dra_driver.kubelet.dra_service.Plugin` of ``compute-domain.nvidia.com``."""

    def __init__(
        self,
        *,
        kube: api.KubeApi,
        objects: ObjectApi,
        node_name: str,
        node_ip: str,
        clique: str,
        plugin_dir: Path,
        specs: cdi.CdiSpecs,
        imex_port: int,
        channel_major: Callable[[], int | None],
        log: structlog.typing.FilteringBoundLogger,
        crash: Callable[[str], None] = lambda step: None,
    ) -> None:
        """``channel_major``: the IMEX channels' major (None: fake nodes, no real device)."""
        self._kube = kube
        self._objects = objects
        self.node_name = node_name
        self.clique = clique
        self.domains_dir = plugin_dir / "domains"
        self.specs = specs
        self.imex_port = imex_port
        self._major = channel_major
        self._log = log
        self._crash = crash
        self.state = nodestate.NodeState(plugin_dir)
        self.member = membership.Membership(
            kube=kube, objects=objects, node_name=node_name, node_ip=node_ip, clique=clique, log=log
        )
        self.lock = threading.RLock()
        self.on_change: Callable[[], None] = lambda: None  # a daemon claim was prepared

    @property
    def objects(self) -> ObjectApi:
        return self._objects

    def domain_dir(self, domain_uid: str) -> Path:
        return self.domains_dir / domain_uid

    # ------------------------------------------------------------------ the kubelet's calls
    def prepare(self, refs: Sequence[claims.ClaimRef]) -> Mapping[str, results.PrepareResult]:
        out = {}
        with self.lock:
            for ref in refs:
                log = logs.claim_logger(
                    self._log, uid=ref.uid, namespace=ref.namespace, name=ref.name
                )
                try:
                    out[ref.uid] = self._prepare(ref, log)
                    continue
                except NotReady as exc:
                    log.info("ComputeDomain channel waits for its IMEX daemon", error=str(exc))
                    error = str(exc)
                except claims.ClaimError as exc:
                    log.warning("ComputeDomain claim not prepared", error=str(exc))
                    error = str(exc)
                except (
                    membership.Refused,
                    imexconfig.NoChannelDevice,
                    api.ApiError,
                    OSError,
                ) as exc:
                    log.warning("ComputeDomain claim not prepared", error=str(exc))
                    error = f"{ref}: {exc}"
                out[ref.uid] = results.PrepareResult(error=error)
        return out

    def unprepare(self, refs: Sequence[claims.ClaimRef]) -> Mapping[str, str]:
        out = {}
        with self.lock:
            for ref in refs:
                log = logs.claim_logger(
                    self._log, uid=ref.uid, namespace=ref.namespace, name=ref.name
                )
                record = self.state.get(ref.uid)
                if record is None:
                    out[ref.uid] = ""
                    continue
                try:
                    self._undo(record, log)
                except (api.ApiError, OSError) as exc:
                    log.warning(
                        "ComputeDomain claim not unprepared; the kubelet retries", error=str(exc)
                    )
                    out[ref.uid] = f"{ref}: unprepare failed, will be retried: {exc}"
                    continue
                log.info(
                    "ComputeDomain claim unprepared", kind=record.kind, domain_uid=record.domain_uid
                )
                out[ref.uid] = ""
        return out

    # ------------------------------------------------------------------ prepare
    def _prepare(
        self, ref: claims.ClaimRef, log: structlog.typing.FilteringBoundLogger
    ) -> results.PrepareResult:
        record = self.state.get(ref.uid)
        if record is not None and record.state == PREPARED:
            return self._result(record)
        try:
            claim = self._kube.get_resource_claim(ref.namespace, ref.name)
        except api.NotFound:
            raise claims.ClaimError(f"{ref}: not found in the API server") from None
        (device,) = _one(
            claims.allocated_devices(claim, ref=ref, driver=cd.DRIVER_NAME, pool=self.node_name),
            ref,
        )
        kind = device.device.partition("-")[0]
        if kind not in (CHANNEL, DAEMON):
            raise claims.ClaimError(
                f"{ref}: device {device.device} is neither a channel nor a daemon"
            )
        domain_id, mode = _config(device, kind, ref)
        domain = self._domain(domain_id, ref)
        if domain.deleting:
            raise claims.ClaimError(f"{ref}: {domain} is being deleted")
        if not self.clique:
            raise claims.ClaimError(
                f"{ref}: node {self.node_name} is not in an NVLink fabric clique (its GPUs report "
                "none): it cannot take part in a ComputeDomain"
            )
        if record is None:
            record = Record(
                uid=ref.uid,
                namespace=ref.namespace,
                name=ref.name,
                kind=kind,
                domain_uid=domain.uid,
                domain_namespace=domain.namespace,
                domain_name=domain.name,
                device=device.device,
                request=claims.main_request(device.request),
            )
        if kind == CHANNEL:
            return self._prepare_channel(ref, record, domain, mode, log)
        return self._prepare_daemon(ref, record, domain, log)

    def _prepare_channel(
        self,
        ref: claims.ClaimRef,
        record: Record,
        domain: cdapi.Domain,
        mode: str,
        log: structlog.typing.FilteringBoundLogger,
    ) -> results.PrepareResult:
        if domain.namespace != ref.namespace:
            raise claims.ClaimError(
                f"{ref}: {domain} is in another namespace; a channel claim must be in its domain's"
            )
        bound = self.member.bound_to()
        if bound and bound != domain.uid:
            raise claims.ClaimError(
                f"{ref}: node {self.node_name} is bound to another ComputeDomain (uid {bound}); "
                "one node serves one domain at a time"
            )
        fresh = self.state.get(ref.uid) is None
        self.state.put(record)
        self._crash("recorded")
        try:
            domain = self.member.join(domain)
        except membership.Refused:
            if fresh:
                self.state.remove(ref.uid)  # refused before changing anything: forget it
            raise
        self._crash("joined")
        if bound != domain.uid:
            self.member.bind(domain.uid)
            log.info(
                "node bound to the ComputeDomain",
                domain=f"{domain.namespace}/{domain.name}",
                domain_uid=domain.uid,
            )
        self._crash("labelled")
        mine = domain.node(self.node_name)
        if mine is None or mine.status != cdapi.READY:
            raise NotReady(
                f"{ref}: waiting for the IMEX daemon of {domain} on node {self.node_name} to be "
                "ready (the node is bound to the domain and its daemon pod is starting); not an "
                "error, the kubelet retries"
            )
        channel = int(record.device.removeprefix("channel-"))
        channels = tuple(range(cd.MAX_CHANNELS)) if mode == cdapi.ALL else (channel,)
        spec = cdspecs.channel_spec(
            self.specs,
            ref,
            device=record.device,
            channels=channels,
            major=self._major(),
            domain=domain,
        )
        path = self.specs.write(ref.uid, spec)
        self._crash("spec-written")
        record = dataclasses.replace(record, state=PREPARED, channels=channels)
        self.state.put(record)
        log.info(
            "ComputeDomain channel prepared",
            domain_uid=domain.uid,
            channels=len(channels),
            cdi_spec=str(path),
        )
        return self._result(record)

    def _prepare_daemon(
        self,
        ref: claims.ClaimRef,
        record: Record,
        domain: cdapi.Domain,
        log: structlog.typing.FilteringBoundLogger,
    ) -> results.PrepareResult:
        if self.member.bound_to() != domain.uid:
            raise claims.ClaimError(f"{ref}: node {self.node_name} is not bound to {domain}")
        self.state.put(record)
        self._crash("recorded")
        directory = self.domain_dir(domain.uid)
        imexconfig.write_config(
            directory, port=self.imex_port, domain=f"{domain} (uid {domain.uid})"
        )
        imexconfig.write_nodes(directory, self.peers(domain))
        self._crash("configured")
        spec = cdspecs.daemon_spec(
            self.specs,
            ref,
            device=record.device,
            directory=directory,
            domain=domain,
            clique=self.clique,
            node_name=self.node_name,
            node_ip=self.member.node_ip,
        )
        path = self.specs.write(ref.uid, spec)
        self._crash("spec-written")
        record = dataclasses.replace(record, state=PREPARED)
        self.state.put(record)
        self.on_change()
        log.info(
            "ComputeDomain daemon prepared",
            domain_uid=domain.uid,
            directory=str(directory),
            cdi_spec=str(path),
        )
        return self._result(record)

    def peers(self, domain: cdapi.Domain) -> list[str]:
        """The nodes config: the domain's nodes of this node's clique, in index order."""
        same = sorted(
            (n for n in domain.nodes if n.clique_id == self.clique), key=lambda n: n.index
        )
        return [n.ip_address for n in same]

    def _result(self, record: Record) -> results.PrepareResult:
        device = results.PreparedDevice(
            request_names=(record.request,),
            pool_name=self.node_name,
            device_name=record.device,
            cdi_device_ids=(self.specs.device_id(record.uid, record.device),),
        )
        return results.PrepareResult(devices=(device,))

    def _domain(self, domain_id: str, ref: claims.ClaimRef) -> cdapi.Domain:
        items, _ = self._objects.list(COMPUTE_DOMAINS)
        for obj in items:
            if (obj.get("metadata") or {}).get("uid") == domain_id:
                return cdapi.Domain.from_obj(obj)
        raise claims.ClaimError(
            f"{ref}: ComputeDomain with uid {domain_id} does not exist (deleted?)"
        )

    # ------------------------------------------------------------------ undo and recovery
    def _undo(self, record: Record, log: structlog.typing.FilteringBoundLogger) -> None:
        """Remove everything ``record`` may have changed, then the record (idempotent)."""
        self.specs.remove(record.uid)
        others = [
            r for r in self.state.of_domain(record.domain_uid, record.kind) if r.uid != record.uid
        ]
        if not others and record.kind == CHANNEL:
            if self.member.unbind(record.domain_uid):
                log.info("node unbound from the ComputeDomain", domain_uid=record.domain_uid)
            self.member.leave(record.domain_uid, record.domain_namespace, record.domain_name)
        elif not others:
            imexconfig.remove(self.domain_dir(record.domain_uid))
            self.member.set_ready(
                record.domain_uid, record.domain_namespace, record.domain_name, False
            )
        self.state.remove(record.uid)

    def recover(self) -> None:
        """At start: load the checkpoint, undo the claims gone from the API server, and remove
        IMEX directories and a node label that no recorded claim explains."""
        with self.lock:
            self.state.load()
            self.specs.remove_stale_temporaries()
            for record in list(self.state.records.values()):
                log = logs.claim_logger(
                    self._log, uid=record.uid, namespace=record.namespace, name=record.name
                )
                try:
                    claim = self._kube.get_resource_claim(record.namespace, record.name)
                    gone = (claim.get("metadata") or {}).get("uid") != record.uid
                except api.NotFound:
                    gone = True
                if gone:
                    self._undo(record, log)
                    log.info(
                        "ComputeDomain claim gone while the agent was down; undone",
                        kind=record.kind,
                    )
            daemons = {r.domain_uid for r in self.state.records.values() if r.kind == DAEMON}
            if self.domains_dir.is_dir():
                for entry in self.domains_dir.iterdir():
                    if entry.name not in daemons:
                        imexconfig.remove(entry)
                        self._log.info("removed IMEX files no claim explains", directory=str(entry))
            bound = self.member.bound_to()
            if bound and not self.state.of_domain(bound, CHANNEL):
                self.member.unbind(bound)
                self._log.info("node unbound from the ComputeDomain", domain_uid=bound)


def _one(
    devices: Sequence[claims.AllocatedDevice], ref: claims.ClaimRef
) -> Sequence[claims.AllocatedDevice]:
    if len(devices) != 1:
        raise claims.ClaimError(
            f"{ref}: {len(devices)} devices of {cd.DRIVER_NAME}; a claim holds one channel or "
            "one daemon"
        )
    return devices


def _config(device: claims.AllocatedDevice, kind: str, ref: claims.ClaimRef) -> tuple[str, str]:
    """The domain UID and allocation mode from the claim's opaque config (the last that applies)."""
    wanted = cd.CHANNEL_CONFIG_KIND if kind == CHANNEL else cd.DAEMON_CONFIG_KIND
    found = [c for c in device.configs if c.parameters.get("kind") == wanted]
    if not found:
        raise claims.ClaimError(
            f"{ref}: no {wanted} configuration for {device.device}: create the claim from the "
            "ResourceClaimTemplate its ComputeDomain names "
            "(spec.channel.resourceClaimTemplate.name)"
        )
    params = found[-1].parameters
    if params.get("apiVersion") != cd.API_VERSION:
        raise claims.ClaimError(
            f"{ref}: {wanted} of apiVersion {params.get('apiVersion')!r}, not {cd.API_VERSION}"
        )
    domain_id = params.get("domainID")
    if not cdapi.valid_domain_id(domain_id):
        raise claims.ClaimError(
            f"{ref}: {wanted}.domainID {domain_id!r} is not a ComputeDomain UID"
        )
    mode = str(params.get("allocationMode") or cdapi.SINGLE)
    if mode not in (cdapi.SINGLE, cdapi.ALL):
        raise claims.ClaimError(f"{ref}: {wanted}.allocationMode {mode!r}: Single or All")
    return str(domain_id), mode
