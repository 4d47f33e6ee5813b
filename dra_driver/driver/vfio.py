"""Passthrough devices at prepare time: a GPU moved to ``vfio-pci`` for a VM claim and back.

Why it exists: a claim for ``gpu-vfio-<minor>`` (:mod:`dra_driver.devices.passthrough`) needs its
GPU taken from the nvidia driver and handed to ``vfio-pci``, the node's only GPU change that
leaves NVML blind to it; a crash half-way must never leave a GPU on ``vfio-pci`` without a claim,
nor a prepared claim without its GPU. :mod:`dra_driver.driver.state` calls this module at fixed
points, as it calls :mod:`dra_driver.driver.mig`:

* :meth:`VfioPart.targets` — the GPUs a claim's passthrough devices stand for (nothing touched).
* :meth:`VfioPart.apply`, after the ``PrepareStarted`` record — refusals first (one clear error,
  nothing changed): a process uses the GPU (NVML), or its IOMMU group holds another device.
  Then, each step journalled before it is taken (``<plugin-dir>/vfio/<bdf>.json``: the claim and
  the phase, ``binding``): unbind from nvidia, ``driver_override`` = vfio-pci, bind to vfio-pci,
  wait for the nodes; then the journal says ``bound``. Any failure puts the GPU back on nvidia
  before the claim gets its error.
* :meth:`VfioPart.release` at unprepare (and rollback) — journal ``releasing``, unbind from
  vfio-pci, clear ``driver_override``, bind to nvidia, journal removed. A failure raises and
  keeps the journal and the claim record, so the kubelet's retry or the next start finishes it.
* :meth:`VfioPart.recover` at start-up, from the journals and the claim records: a GPU whose
  claim is prepared (``PrepareCompleted``) and not being released is (re)bound to vfio-pci —
  finished; every other journal is undone (the GPU back on nvidia); a prepared claim whose GPU
  was being released is reported, for the caller to finish its unprepare. Last, any GPU offered
  for passthrough found on vfio-pci with no journal goes back to nvidia.

:meth:`VfioPart.passed_through` is the node's one answer to "which GPUs are on vfio-pci for a
claim now" (:class:`dra_driver.devices.passedthrough.PassedThrough` is fed from it).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from dra_driver import records
from dra_driver.devices import model, passthrough, vfiohost
from dra_driver.driver import atomicfile, cdi, checkpoint, claims, inventory

BINDING, BOUND, RELEASING = "binding", "bound", "releasing"
JOURNAL_DIR = "vfio"
VM_ENV = ("NVIDIA_VISIBLE_DEVICES=void",)  # no container GPU: the CDI hooks stay out of a VM pod


class VfioError(claims.ClaimError):
    """A passthrough device cannot be prepared (or given back); names the claim and the GPU."""


@records.record
class Target:
    """One GPU a claim passes through."""

    device: str  # gpu-vfio-<minor>
    gpu: str  # gpu-<minor>
    uuid: str
    bdf: str
    group: int | None


class VfioPart:
    """The passthrough GPUs of prepared claims."""

    def __init__(
        self,
        *,
        host: vfiohost.VfioHost,
        directory: Path,
        node: model.NodeDevices,
        processes: Callable[[str], list[int]] | None,
        log: structlog.typing.FilteringBoundLogger,
    ) -> None:
        """``processes(uuid)``: PIDs NVML lists on the GPU (None: not asked)."""
        self.host = host
        self.directory = directory
        self._processes = processes
        self._log = log
        self._gpus = {passthrough.device_name(g): g for g in passthrough.marked(node)}
        self._lock = threading.Lock()
        self._through: dict[str, str] = {}  # GPU UUID → claim UID, bound to vfio-pci for it

    # ---- queries -------------------------------------------------------------------------------

    def targets(self, names: Iterable[str]) -> list[Target]:
        out = []
        for name in names:
            gpu = self._gpus.get(name)
            if gpu is not None:
                out.append(Target(name, gpu.name, gpu.uuid, gpu.pci_bus_id, gpu.iommu_group))
        return out

    def passed_through(self) -> frozenset[str]:
        """UUIDs of the GPUs bound to vfio-pci for a claim (or on their way there or back)."""
        with self._lock:
            return frozenset(self._through)

    def _mark(self, target: Target, claim: str | None) -> None:
        with self._lock:
            if claim is None:
                self._through.pop(target.uuid, None)
            else:
                self._through[target.uuid] = claim

    # ---- prepare -------------------------------------------------------------------------------

    def apply(self, ref: claims.ClaimRef, targets: Sequence[Target]) -> dict[str, tuple[str, ...]]:
        """Pass ``targets`` through; device name → its container nodes. On failure every GPU of
        the claim is back on nvidia and the error names the GPU and why."""
        for target in targets:
            self._refusal(ref, target)
        done: dict[str, tuple[str, ...]] = {}
        try:
            for target in targets:
                done[target.device] = self._bind(ref, target)
        except BaseException:
            for target in targets:
                try:
                    self._give_back(target)
                except vfiohost.VfioHostError as exc:
                    self._log.error(
                        "cannot give a GPU back to nvidia",
                        gpu=target.bdf,
                        error=str(exc),
                        claim_uid=ref.uid,
                    )
            raise
        return done

    def _refusal(self, ref: claims.ClaimRef, target: Target) -> None:
        where = f"{ref}: GPU {target.gpu} ({target.bdf})"
        current = self.host.driver(target.bdf)
        if current not in (vfiohost.NVIDIA, vfiohost.VFIO, None):
            raise VfioError(f"{where} is bound to {current}, not nvidia: not passed through")
        others = [d for d in self.host.group_members(target.bdf) if d != target.bdf]
        if others:
            raise VfioError(
                f"{where}: its IOMMU group {target.group} also holds {', '.join(others)}, which "
                "a VM would get too; a GPU is passed through only alone in its group"
            )
        if current == vfiohost.NVIDIA:
            pids = self._pids(target)
            if pids:
                raise VfioError(
                    f"{where} is in use by process(es) {', '.join(map(str, pids))} (NVML): "
                    "not passed through while anything runs on it"
                )

    def _pids(self, target: Target) -> list[int]:
        if self._processes is None:
            return []
        try:
            return list(self._processes(target.uuid))
        except Exception as exc:  # NVML may be unable to answer; say so, do not guess
            self._log.warning("cannot list a GPU's processes", gpu=target.bdf, error=str(exc))
            return []

    def _bind(self, ref: claims.ClaimRef, target: Target) -> tuple[str, ...]:
        self._journal(target, ref.uid, BINDING)
        self._mark(target, ref.uid)
        host, bdf = self.host, target.bdf
        try:
            if host.driver(bdf) != vfiohost.VFIO:
                pids = self._pids(target)
                who = "process(es) " + ", ".join(map(str, pids)) if pids else ""
                host.unbind(bdf, who=who or "no process NVML lists: another holder of the GPU")
                host.set_override(bdf, vfiohost.VFIO)
                host.bind(bdf, vfiohost.VFIO)
            nodes = host.wait_nodes(bdf)
        except vfiohost.VfioHostError as exc:
            raise VfioError(f"{ref}: {exc}") from None
        self._journal(target, ref.uid, BOUND)
        return nodes

    # ---- unprepare -----------------------------------------------------------------------------

    def release(self, ref: claims.ClaimRef, targets: Sequence[Target]) -> None:
        """Give the claim's GPUs back to nvidia (idempotent)."""
        for target in targets:
            if self._read(target) is None and self.host.driver(target.bdf) != vfiohost.VFIO:
                self._mark(target, None)
                continue
            self._journal(target, ref.uid, RELEASING)
            try:
                self._give_back(target)
            except vfiohost.VfioHostError as exc:
                raise VfioError(f"{ref}: giving it back: {exc}") from None

    def _give_back(self, target: Target) -> None:
        host, bdf = self.host, target.bdf
        if host.driver(bdf) == vfiohost.VFIO:
            host.unbind(bdf)
        if host.override(bdf):
            host.set_override(bdf, None)
        host.bind(bdf, vfiohost.NVIDIA)
        self._forget(target)
        self._mark(target, None)

    # ---- start-up ------------------------------------------------------------------------------

    def recover(self, records_: Sequence[checkpoint.ClaimRecord]) -> set[str]:
        """Finish or undo every journalled step; returns the UIDs of prepared claims whose
        unprepare a crash cut short (their GPU is back on nvidia, or its journal already gone:
        the caller rolls them back)."""
        completed = {r.uid: r for r in records_ if r.state == checkpoint.PREPARE_COMPLETED}
        unprepared: set[str] = set()
        journalled: set[str] = set()
        for target in self.targets(self._gpus):
            entry = self._read(target)
            if entry is None:
                continue
            journalled.add(target.bdf)
            uid, phase = entry
            record = completed.get(uid)
            holds = record is not None and target.device in {d.deviceName for d in record.devices}
            try:
                if record is not None and holds and phase != RELEASING:
                    self._mark(target, uid)
                    self._bind(
                        claims.ClaimRef(uid=uid, namespace=record.namespace, name=record.name),
                        target,
                    )
                    self._log.warning(
                        "kept a GPU passed through for its prepared claim",
                        gpu=target.bdf,
                        claim_uid=uid,
                        phase=phase,
                    )
                    continue
                self._give_back(target)
                if holds:
                    unprepared.add(uid)
                self._log.warning(
                    "gave a GPU back to nvidia after a crash",
                    gpu=target.bdf,
                    claim_uid=uid,
                    phase=phase,
                )
            except (vfiohost.VfioHostError, claims.ClaimError) as exc:
                self._log.error(
                    "cannot recover a passed-through GPU",
                    gpu=target.bdf,
                    claim_uid=uid,
                    error=str(exc),
                )
        for uid, record in completed.items():  # journal gone: its release had finished
            mine = self.targets(d.deviceName for d in record.devices)
            if any(t.bdf not in journalled for t in mine):
                unprepared.add(uid)
        for target in self.targets(self._gpus):
            if target.bdf in journalled or self.host.driver(target.bdf) != vfiohost.VFIO:
                continue
            try:
                self._give_back(target)
                self._log.warning("gave back a GPU on vfio-pci that no claim holds", gpu=target.bdf)
            except vfiohost.VfioHostError as exc:
                self._log.error("cannot give a GPU back to nvidia", gpu=target.bdf, error=str(exc))
        return unprepared

    # ---- journal -------------------------------------------------------------------------------

    def _path(self, target: Target) -> Path:
        return self.directory / f"{target.bdf}.json"

    def _journal(self, target: Target, uid: str, phase: str) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        data = json.dumps({"claim": uid, "phase": phase, "device": target.device}).encode()
        atomicfile.write_bytes(self._path(target), data, durable=phase == BOUND)

    def _read(self, target: Target) -> tuple[str, str] | None:
        try:
            data = json.loads(self._path(target).read_bytes())
            return str(data["claim"]), str(data["phase"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self._log.error(
                "unreadable passthrough journal; undoing it", gpu=target.bdf, error=str(exc)
            )
            return "", BINDING

    def _forget(self, target: Target) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(target))


def claim_targets(
    part: VfioPart | None, ref: claims.ClaimRef, allocated: Sequence[claims.AllocatedDevice]
) -> list[Target]:
    """The GPUs a claim passes through; a claim mixing them with container devices is refused
    (its pod is a VM or it is not)."""
    if part is None:
        return []
    found = part.targets(d.device for d in allocated)
    if found and len(found) != len(allocated):
        raise VfioError(
            f"{ref}: mixes passthrough devices ({', '.join(t.device for t in found)}) with "
            "container devices; a claim's devices go either to a VM or to containers"
        )
    return found


def ownership_keys(
    devices: inventory.Inventory, allocated: Sequence[claims.AllocatedDevice]
) -> list[claims.AllocatedDevice]:
    """A passthrough device also owns its GPU's container devices (``gpu-<minor>``, every MIG
    device or placement of it), so that, should the scheduler ever hand out both, prepare
    refuses the second claim (the ownership check, the last line of defence)."""
    keys: list[claims.AllocatedDevice] = []
    for dev in allocated:
        gpu = passthrough.gpu_name_of(dev.device)
        known = devices.get(dev.device)
        if gpu is None or known is None or known.kind != passthrough.DEVICE_TYPE:
            continue
        names = [gpu] + [
            d.name
            for d in devices.devices.values()
            if d.kind == "mig" and d.parent_minor == known.parent_minor
        ]
        keys += [
            claims.AllocatedDevice(
                request=dev.request, pool=dev.pool, device=name, admin_access=False,
                share_id=None, configs=(),
            )
            for name in names
        ]  # fmt: skip
    return keys


def spec(
    specs: cdi.CdiSpecs,
    ref: claims.ClaimRef,
    planned: Sequence[cdi.Planned],
    nodes: Mapping[str, Sequence[str]],
    *,
    mounts: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The CDI spec of a VM claim: per device exactly its ``/dev/vfio`` nodes, and for the pod
    ``NVIDIA_VISIBLE_DEVICES=void`` (the NVIDIA container hooks inject no GPU into a VM's pod,
    as KubeVirt and Kata expect), the claim's name, its metadata mounts; no driver libraries,
    no ``/dev/nvidia*`` (the GPU is not the nvidia driver's any more)."""
    devices = []
    for item in planned:
        dev = item.device
        paths = nodes.get(dev.name)
        if not paths:
            raise cdi.CdiError(f"{ref}: device {dev.name} has no VFIO device nodes")
        edits: dict[str, Any] = {
            "deviceNodes": [
                {"path": p, "hostPath": specs.host.fake_node}
                if specs.host.fake_node
                else {"path": p}
                for p in paths
            ]
        }
        if item.edits.get("env"):
            edits["env"] = list(item.edits["env"])
        if item.edits.get("mounts"):
            edits["mounts"] = [dict(m) for m in item.edits["mounts"]]
        devices.append({"name": specs.device_name(ref.uid, dev.name), "containerEdits": edits})
    common: dict[str, Any] = {"env": [*VM_ENV, f"NVIDIA_DRA_CLAIM={ref.namespace}/{ref.name}"]}
    if mounts:
        common["mounts"] = [dict(m) for m in mounts]
    out: dict[str, Any] = {
        "cdiVersion": "",
        "kind": specs.kind,
        "devices": devices,
        "containerEdits": common,
    }
    out["cdiVersion"] = required = cdi.minimum_version(out)
    problems = cdi.check(out, required=required)
    if problems:
        raise cdi.CdiError(f"{ref}: generated CDI spec is invalid: {'; '.join(problems)}")
    return out
