"""Device metadata in the container: what a prepared claim got, as JSON files the spec mounts.

Two kinds of file per claim, side by side in one flat directory on the host: ``--metadata-dir``
(a tmpfs such as ``/run/dra-driver/claim-metadata``), else ``<plugin-dir>/claim-metadata/``;
a claim stays in the directory its spec mounts (:mod:`~dra_driver.driver.metadataroots`,
docs/metadata.md):

* ``<claim-uid>.claim.json``, our own format, mounted read-only at
  ``/var/run/nvidia-dra/claims/<uid>.json`` through the spec's claim-wide edits (every container
  given a device of the claim sees it): the claim, and per device its requests, GPUs (UUID,
  minor, PCI bus ID, NUMA node), MIG UUID and profile, share capacity; NVLink links among the
  claim's full GPUs.
* ``<claim-uid>.<request>.metadata.json``, KEP-5304's ``DeviceMetadata`` (v1alpha1), mounted
  read-only at the well-known path ``/var/run/kubernetes.io/dra-device-attributes/
  resourceclaims/<claim>/<request>/<driver>-metadata.json`` (``resourceclaimtemplates/
  <pod-claim-name>/...`` for a claim made from a template) through the devices of that request
  only, as the Go kubelet-plugin framework does it. Needs nothing from the kubelet.

The content is a pure function of the checkpoint record and the discovered device model, so
recovery rebuilds it from the record: files are written (a new one under its own name, one that
exists replaced atomically; never fsynced: a record of an earlier boot is dropped with them, and
a completed record of this boot gets them rewritten at start-up) before the spec, removed with
it, restored like it, and a file without a record is removed at start-up.

Flat on purpose (issue 37): no directory per claim, so a prepare makes no directory and an
unprepare removes exactly the files the record names, one ``unlink`` each, instead of a tree walk
with a ``rmdir`` per level — directory inodes are what made the old layout cost milliseconds on
ext4, in the unprepare itself and in the journal commit the next prepare's fsync waits for. A
claim prepared by an earlier version keeps its per-claim directory (its spec mounts it) until it
is unprepared. The files are not recycled (as checkpoint records are): a container may still
have one bind-mounted (a pod force-deleted on a partitioned node), and must never see another
claim's content through it.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dra_driver.devices import model, topology
from dra_driver.driver import atomicfile, checkpoint, claims, inventory

DIRECTORY = "claim-metadata"  # under the plugin directory
CLAIM_SUFFIX = ".claim.json"  # <uid>.claim.json
KEP_SUFFIX = ".metadata.json"  # <uid>.<request>.metadata.json
# The layout before issue 37: <uid>/claim.json, <uid>/requests/<request>/metadata.json.
LEGACY_CLAIM_FILE = "claim.json"
CONTAINER_DIR = "/var/run/nvidia-dra/claims"
FORMAT_VERSION = "gpu.nvidia.com/v1alpha1"
KIND = "ClaimMetadata"
# KEP-5304 (DRA device metadata): the container paths and the serialised type.
KEP_ROOT = "/var/run/kubernetes.io/dra-device-attributes"
KEP_API_VERSION = "metadata.resource.k8s.io/v1alpha1"
KEP_KIND = "DeviceMetadata"
POD_CLAIM_NAME = "resource.kubernetes.io/pod-claim-name"  # on claims made from a template
STANDARD = "resource.kubernetes.io"
MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "bind")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")  # request, claim names: DNS names


class MetadataError(claims.ClaimError):
    """A claim's metadata file cannot be written or removed; names the claim and the file."""


class ClaimMetadata:
    """Builds, writes, removes and restores the metadata files of claims."""

    def __init__(self, *, root: Path, driver_name: str, devices: inventory.Inventory) -> None:
        self.root = root
        self._root = os.fspath(root)
        self.driver_name = driver_name
        self.devices = devices
        node = devices.node
        self._gpus: dict[int, model.Gpu] = {g.minor: g for g in node.gpus} if node else {}
        self._links = topology.pair_links(node) if node else {}
        self._minor_of = {g.index: g.minor for g in node.gpus} if node else {}

    # ---- paths and mounts --------------------------------------------------------------------

    def claim_file(self, uid: str) -> str:
        return f"{self._root}/{uid}{CLAIM_SUFFIX}"

    def request_file(self, uid: str, request: str) -> str:
        return f"{self._root}/{uid}.{request}{KEP_SUFFIX}"

    def legacy_dir(self, uid: str) -> Path:
        """Where an earlier version kept the claim's files (one directory per claim)."""
        return self.root / uid

    def mounts(self, ref: claims.ClaimRef) -> list[dict[str, Any]]:
        """The claim-wide mount (the spec's common edits): ``<uid>.claim.json``."""
        return [_mount(self.claim_file(ref.uid), f"{CONTAINER_DIR}/{ref.uid}.json")]

    def plan(
        self, ref: claims.ClaimRef, claim: Mapping[str, Any], planned: Sequence[Any]
    ) -> list[Any]:
        """``planned`` (:class:`~dra_driver.driver.cdi.Planned`) with each device's mount of its
        request's KEP-5304 file added to its edits."""
        meta = claim.get("metadata") or {}
        pod_claim = (meta.get("annotations") or {}).get(POD_CLAIM_NAME)
        if pod_claim and _NAME.match(pod_claim):
            where = f"{KEP_ROOT}/resourceclaimtemplates/{pod_claim}"
        else:
            where = f"{KEP_ROOT}/resourceclaims/{ref.name}"
        out = []
        for item in planned:
            if not _NAME.match(item.request):
                out.append(item)
                continue
            mount = _mount(
                self.request_file(ref.uid, item.request),
                f"{where}/{item.request}/{self.driver_name}-metadata.json",
            )
            edits = dict(item.edits)
            edits["mounts"] = [*edits.get("mounts", ()), mount]
            out.append(_replace_edits(item, edits))
        return out

    # ---- content -----------------------------------------------------------------------------

    def files(self, record: checkpoint.ClaimRecord) -> dict[str, Any]:
        """Host path → JSON content of every file of ``record``'s claim (where its spec mounts
        them: the flat layout, or an earlier version's directory for a claim it prepared)."""
        legacy = self._legacy(record)
        devices = [self._device(d) for d in record.devices]
        out: dict[str, Any] = {
            os.fspath(self.legacy_dir(record.uid) / LEGACY_CLAIM_FILE)
            if legacy
            else self.claim_file(record.uid): {
                "apiVersion": FORMAT_VERSION,
                "kind": KIND,
                "driver": self.driver_name,
                "claim": {"namespace": record.namespace, "name": record.name, "uid": record.uid},
                "devices": devices,
                "nvlinks": self._nvlinks(record),
            }
        }
        by_request: dict[str, list[dict[str, Any]]] = {}
        for dev, facts in zip(record.devices, devices, strict=True):
            for request in dev.requestNames[:1]:
                if _NAME.match(request):
                    by_request.setdefault(request, []).append(self._kep_device(dev, facts))
        for request, kep_devices in by_request.items():
            path = (
                os.fspath(self.legacy_dir(record.uid) / "requests" / request / "metadata.json")
                if legacy
                else self.request_file(record.uid, request)
            )
            out[path] = {
                "apiVersion": KEP_API_VERSION,
                "kind": KEP_KIND,
                "metadata": {
                    "name": record.name,
                    "namespace": record.namespace,
                    "uid": record.uid,
                    "generation": 1,
                },
                "requests": [{"name": request, "devices": kep_devices}],
            }
        return out

    def paths(self, record: checkpoint.ClaimRecord) -> list[str]:
        """The host paths of :meth:`files` alone, without building their content (unprepare
        removes them: issue 46's profile had half of ``files``' cost there)."""
        legacy = self._legacy(record)
        root = self.legacy_dir(record.uid)
        out = [os.fspath(root / LEGACY_CLAIM_FILE) if legacy else self.claim_file(record.uid)]
        requests: dict[str, None] = {}
        for dev in record.devices:
            for request in dev.requestNames[:1]:
                if _NAME.match(request):
                    requests[request] = None
        for request in requests:
            out.append(
                os.fspath(root / "requests" / request / "metadata.json")
                if legacy
                else self.request_file(record.uid, request)
            )
        return out

    def _device(self, dev: checkpoint.DeviceRecord) -> dict[str, Any]:
        known = self.devices.get(dev.deviceName)
        out: dict[str, Any] = {"name": dev.deviceName, "requests": list(dev.requestNames)}
        if known is None:  # not on this node any more: what the record says
            return out
        out["type"] = known.kind
        out["gpus"] = [self._gpu(m) for m in known.gpu_minors]
        if known.kind == "mig":
            mig = self._mig(known, dev)
            if mig:
                out["mig"] = mig
        if dev.shareId is not None:
            capacity = dict(sorted(dev.consumedCapacity.items()))
            out["share"] = {"id": dev.shareId, "capacity": capacity}
        if dev.adminAccess:
            out["adminAccess"] = True
        return out

    def _gpu(self, minor: int) -> dict[str, Any]:
        gpu = self._gpus.get(minor)
        if gpu is None:
            known = self.devices.get(f"gpu-{minor}")
            return {"minor": minor, "uuid": known.uuid if known else ""}
        return {
            "uuid": gpu.uuid,
            "minor": gpu.minor,
            "index": gpu.index,
            "pciBusID": gpu.pci_bus_id,
            "numaNode": gpu.numa_node,
        }

    def _mig(self, known: inventory.PreparableDevice, dev: checkpoint.DeviceRecord) -> Any:
        if dev.mig is not None:  # dynamic: what prepare created
            return {"uuid": dev.mig.uuid or "", "profile": dev.mig.profile}
        parent = self._gpus.get(known.parent_minor)
        for mig in parent.mig_devices if parent else ():
            if model.mig_device_name(parent, mig) == known.name:  # type: ignore[arg-type]
                return {"uuid": mig.uuid, "profile": mig.profile}
        return {"uuid": known.uuid} if known.uuid else None

    def _nvlinks(self, record: checkpoint.ClaimRecord) -> list[dict[str, Any]]:
        """NVLink link counts between the claim's full GPUs (not MIG parents), per pair."""
        minors: set[int] = set()
        for dev in record.devices:
            known = self.devices.get(dev.deviceName)
            if known is not None and known.kind != "mig":
                minors.update(known.gpu_minors)
        pairs = []
        for (a, b), links in sorted(self._links.items()):
            ma, mb = self._minor_of.get(a), self._minor_of.get(b)
            if ma in minors and mb in minors and ma is not None and mb is not None:
                lo, hi = sorted((ma, mb))
                pairs.append(
                    {
                        "minors": [lo, hi],
                        "uuids": [self._gpus[lo].uuid, self._gpus[hi].uuid],
                        "links": links,
                    }
                )
        return sorted(pairs, key=lambda p: p["minors"])

    def _kep_device(self, dev: checkpoint.DeviceRecord, facts: Mapping[str, Any]) -> Any:
        """One device as KEP-5304's ``Device``: typed attribute values as in ResourceSlices."""
        attrs: dict[str, Any] = {}
        gpus = facts.get("gpus") or []
        mig = facts.get("mig")
        if "type" in facts:
            attrs["type"] = {"string": facts["type"]}
        if mig:
            attrs["uuid"] = {"string": mig.get("uuid", "")}
            if "profile" in mig:
                attrs["profile"] = {"string": mig["profile"]}
            if gpus:
                attrs["parentUUID"] = {"string": gpus[0].get("uuid", "")}
        elif len(gpus) == 1:
            attrs["uuid"] = {"string": gpus[0].get("uuid", "")}
        elif gpus:
            attrs["uuids"] = {"string": ",".join(g.get("uuid", "") for g in gpus)}
        if len(gpus) == 1 and gpus[0].get("pciBusID"):
            attrs[f"{STANDARD}/pciBusID"] = {"string": gpus[0]["pciBusID"]}
        if len(gpus) == 1 and gpus[0].get("numaNode") is not None:
            attrs[f"{STANDARD}/numaNode"] = {"int": gpus[0]["numaNode"]}
        return {
            "name": dev.deviceName,
            "driver": self.driver_name,
            "pool": dev.poolName,
            "attributes": dict(sorted(attrs.items())),
        }

    # ---- files -------------------------------------------------------------------------------

    def write(self, record: checkpoint.ClaimRecord) -> None:
        """Write every file of ``record``'s claim (not durable, see the module docstring). The
        directory is made only when it is missing (the first claim).

        A file that is not there yet is written under its own name (no temporary and rename:
        issue 46's profile): nothing reads it before the prepare returns (the spec that mounts
        it is written after it), and a crash mid-write leaves a claim whose files start-up
        restores from its record or rolls back. One that is there is replaced atomically (a
        container may have it mounted)."""
        ref = _ref(record)
        for path, content in self.files(record).items():
            data = (json.dumps(content, separators=(",", ":")) + "\n").encode()
            try:
                try:
                    atomicfile.write_new(path, data)
                except FileNotFoundError:  # the directory (or a legacy claim's) is missing
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    atomicfile.write_new(path, data)
            except OSError as exc:
                raise _problem(ref, "write", path, exc) from None

    def remove(self, ref: claims.ClaimRef, record: checkpoint.ClaimRecord | None = None) -> bool:
        """Remove the claim's files (idempotent): with its ``record``, exactly the files it
        names (one ``unlink`` each); without, whatever carries its UID. False when there was
        none."""
        if record is not None and record.uid == ref.uid:
            paths = self.paths(record)
        else:
            paths = self._files_of(ref.uid)
        found = False
        for path in paths:
            try:
                os.unlink(path)
                found = True
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise _problem(ref, "remove", path, exc) from None
        legacy = self.legacy_dir(ref.uid)
        if os.path.isdir(legacy):  # a claim an earlier version prepared: its whole directory
            try:
                shutil.rmtree(legacy)
                found = True
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise _problem(ref, "remove", legacy, exc) from None
        return found

    def restore(self, record: checkpoint.ClaimRecord) -> bool:
        """Rewrite what is missing or differs from ``record`` (files of its UID that it does not
        name removed too); returns whether anything changed."""
        wanted = self.files(record)
        changed = any(_read(Path(path)) != content for path, content in wanted.items())
        on_disk = set(self._files_of(record.uid))
        legacy = self.legacy_dir(record.uid)
        if legacy.is_dir():
            on_disk.update(os.fspath(p) for p in legacy.rglob("*") if not p.is_dir())
        if changed or on_disk - set(wanted):
            self.remove(_ref(record))
            self.write(record)
            return True
        return False

    def uids_on_disk(self) -> list[str]:
        """UIDs with files (or an earlier version's directory) here."""
        try:
            names = os.listdir(self.root)
        except (FileNotFoundError, NotADirectoryError):
            return []
        uids = {name.split(".", 1)[0] for name in names if not name.startswith(".")}
        return sorted(uid for uid in uids if checkpoint.valid_uid(uid))

    def remove_stale_temporaries(self) -> list[Path]:
        """Temporaries of writes a crash interrupted (start-up)."""
        return atomicfile.remove_stale_temporaries(self.root)

    def _files_of(self, uid: str) -> list[str]:
        """The flat files named for ``uid`` (a UID has no dot, so ``<uid>.`` is its prefix)."""
        try:
            names = os.listdir(self.root)
        except (FileNotFoundError, NotADirectoryError):
            return []
        prefix = f"{uid}."
        return [f"{self._root}/{n}" for n in names if n.startswith(prefix)]

    def _legacy(self, record: checkpoint.ClaimRecord) -> bool:
        """Whether ``record``'s spec mounts an earlier version's per-claim directory."""
        edits = record.cdiSpec.get("containerEdits")
        mounts = edits.get("mounts") if isinstance(edits, dict) else None
        if not mounts:
            return False
        old = os.fspath(self.legacy_dir(record.uid) / LEGACY_CLAIM_FILE)
        return any(isinstance(m, dict) and m.get("hostPath") == old for m in mounts)


def _mount(host: str, container: str) -> dict[str, Any]:
    return {"hostPath": host, "containerPath": container, "options": list(MOUNT_OPTIONS)}


def _replace_edits(item: Any, edits: dict[str, Any]) -> Any:
    return dataclasses.replace(item, edits=edits)


def _read(path: Path) -> Any:
    try:
        return checkpoint.decode_json(checkpoint.read_file(path), what=path.name)
    except (OSError, ValueError):
        return None


def _ref(record: checkpoint.ClaimRecord) -> claims.ClaimRef:
    return claims.ClaimRef(uid=record.uid, namespace=record.namespace, name=record.name)


def _problem(ref: claims.ClaimRef, action: str, path: object, exc: OSError) -> MetadataError:
    code = errno.errorcode.get(exc.errno or 0, "")
    reason = exc.strerror or str(exc)
    return MetadataError(
        f"{ref}: cannot {action} metadata file {path}: {reason}" + (f" ({code})" if code else "")
    )
