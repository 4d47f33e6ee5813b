"""Container Device Interface specs: how a prepared claim reaches the container runtime.

Kubelet passes the CDI device IDs we return to the runtime, which reads our spec file and edits
the container (device nodes, mounts, environment). One transient spec per claim, named from the
claim UID (``k8s.gpu.nvidia.com-claim_<uid>.json``, devices ``<uid>-<device>``), so a device name is
never reused and runtimes' caches can never serve a stale spec. Files are written atomically.

The declared ``cdiVersion`` is the lowest one covering what the spec uses (older runtimes reject
newer version strings), and a spec is never written for a device whose node is missing on the
host: that claim fails instead of "succeeding" with a spec that gives the container nothing.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dra_driver import records
from dra_driver.driver import atomicfile, claims, config, driverfiles, inventory

CLASS = "claim"
# With a fake GPU backend every device node is backed by this harmless host node, so the specs
# stay consumable by a real runtime (the demo, CPU-only kind clusters).
FAKE_DEVICE_NODE = "/dev/null"
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")

# §7.4 of contracts.md: vendor and class (no dots in class, to suit kubelet's stricter copy).
_VENDOR = re.compile(r"^[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_CLASS = re.compile(r"^[A-Za-z](?:[A-Za-z0-9_-]*[A-Za-z0-9])?$")
_DEVICE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?$")
_KNOWN_VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")


class CdiError(claims.ClaimError):
    """A claim's spec cannot be built or written (e.g. a device node is missing)."""


@records.record
class HostDevices:
    """How container device nodes map to the host.

    Real mode (``fake_node`` None): every node must exist as a character device under
    ``dev_root`` (where this process sees the host's ``/dev``) and is passed through as is.
    Fake mode: every node is backed by ``fake_node`` (a harmless host node such as ``/dev/null``)
    through ``hostPath``, so the spec stays consumable by a real runtime without GPUs.
    """

    fake_node: str | None = None
    dev_root: Path = Path("/")

    def entry(self, path: str, *, ref: claims.ClaimRef, device: str) -> dict[str, Any]:
        if self.fake_node is not None:
            return {"path": path, "hostPath": self.fake_node}
        host = self.dev_root / path.lstrip("/")
        try:
            mode = os.stat(host).st_mode
        except FileNotFoundError:
            raise CdiError(
                f"{ref}: device node {path} needed by {device} does not exist on this node "
                f"(looked at {host}); is the NVIDIA kernel driver loaded?"
            ) from None
        if not stat.S_ISCHR(mode):
            raise CdiError(f"{ref}: {host} needed by {device} is not a character device")
        return {"path": path}


@records.record
class Planned:
    """One device of a claim as the spec will expose it."""

    device: inventory.PreparableDevice
    request: str  # main request name
    config: config.GpuConfig
    # More container edits for this device (``env`` entries, ``mounts``), e.g. its MPS daemon's.
    edits: Mapping[str, Any] = dataclasses.field(default_factory=dict)


class CdiSpecs:
    """Builds, writes and removes our per-claim specs in one CDI directory."""

    def __init__(
        self,
        *,
        root: Path,
        driver_name: str,
        host: HostDevices,
        driver_files: Sequence[driverfiles.Mount] = (),
    ) -> None:
        self.root = root
        self.vendor = f"k8s.{driver_name}"
        self.kind = f"{self.vendor}/{CLASS}"
        self.host = host
        self.driver_files = tuple(driver_files)
        if not _VENDOR.match(self.vendor) or len(self.vendor) > 253:
            raise ValueError(f"driver name {driver_name!r} gives an invalid CDI vendor")
        # The same for every claim: built once (specs are never modified after build).
        self._mounts = [
            {
                "hostPath": m.host_path,
                "containerPath": m.container_path,
                "options": list(driverfiles.MOUNT_OPTIONS),
            }
            for m in self.driver_files
        ]
        self._files = f"{os.fspath(root)}/{self.file_prefix}"

    # ---- names -------------------------------------------------------------------------------

    @property
    def file_prefix(self) -> str:
        return f"{self.vendor}-{CLASS}_"

    def spec_path(self, claim_uid: str) -> Path:
        return self.root / f"{self.file_prefix}{claim_uid.replace('/', '_')}.json"

    def device_name(self, claim_uid: str, device: str) -> str:
        return f"{claim_uid}-{device}"

    def device_id(self, claim_uid: str, device: str) -> str:
        return f"{self.kind}={self.device_name(claim_uid, device)}"

    def remove_stale_temporaries(self) -> list[Path]:
        """Half-written specs of ours left by a crash (never read by runtimes: dot files)."""
        return atomicfile.remove_stale_temporaries(self.root, target_prefix=self.file_prefix)

    def claim_uids_on_disk(self) -> list[str]:
        """UIDs of the claims whose spec files of ours are in the directory."""
        if not self.root.is_dir():
            return []
        uids = []
        for entry in self.root.iterdir():
            name = entry.name
            if name.startswith(self.file_prefix) and name.endswith(".json"):
                uids.append(name[len(self.file_prefix) : -len(".json")])
        return sorted(uids)

    # ---- build, write, remove ----------------------------------------------------------------

    def build(
        self,
        ref: claims.ClaimRef,
        planned: Sequence[Planned],
        *,
        mounts: Sequence[Mapping[str, Any]] = (),
    ) -> dict[str, Any]:
        """The spec for ``ref``'s devices; raises :class:`CdiError` for a missing device node.
        ``mounts``: more claim-wide mounts (the claim's metadata file, docs/metadata.md)."""
        if not planned:
            raise CdiError(f"{ref}: no devices to put in a CDI spec")
        devices = []
        for item in planned:
            dev = item.device
            edits: dict[str, Any] = {
                "deviceNodes": [
                    self.host.entry(path, ref=ref, device=dev.name) for path in dev.device_nodes
                ]
            }
            if item.config.env:
                edits["env"] = [f"{k}={v}" for k, v in sorted(item.config.env.items())]
            if item.edits.get("env"):
                edits["env"] = [*edits.get("env", ()), *item.edits["env"]]
            if item.edits.get("mounts"):
                edits["mounts"] = [dict(m) for m in item.edits["mounts"]]
            entry = {"name": self.device_name(ref.uid, dev.name), "containerEdits": edits}
            if entry in devices:  # two shares of one device in the claim: one CDI device
                continue
            devices.append(entry)
        common: dict[str, Any] = {
            "env": [
                f"NVIDIA_VISIBLE_DEVICES={_visible_devices(planned)}",
                f"NVIDIA_DRA_CLAIM={ref.namespace}/{ref.name}",
            ],
            "deviceNodes": [
                self.host.entry(path, ref=ref, device="every GPU") for path in CONTROL_NODES
            ],
        }
        if self._mounts or mounts:
            common["mounts"] = [*self._mounts, *(dict(m) for m in mounts)]
        spec: dict[str, Any] = {
            "cdiVersion": "",
            "kind": self.kind,
            "devices": devices,
            "containerEdits": common,
        }
        spec["cdiVersion"] = required = minimum_version(spec)
        problems = check(spec, required=required)
        if problems:  # a bug of ours, not of the claim, but never write a spec runtimes reject
            raise CdiError(f"{ref}: generated CDI spec is invalid: {'; '.join(problems)}")
        return spec

    def write(self, claim_uid: str, spec: Mapping[str, Any], *, text: str | None = None) -> Path:
        """Write ``spec``; ``text``: it already encoded for the claim's checkpoint record
        (compact, non-ASCII as it is), used as it is when json.dumps would write the same bytes
        (ASCII without DEL: no escapes differ), which spares encoding it twice per prepare."""
        path = self._file(claim_uid)
        usable = text is not None and text.isascii() and "\x7f" not in text
        data = f"{text}\n".encode() if usable else None

        def put() -> None:
            if data is None:
                atomicfile.write_json(path, spec, durable=False)
            else:
                atomicfile.write_bytes(path, data, durable=False)

        # Named temporary file + rename (atomicfile): the rename is what makes runtimes with a
        # watching spec cache (containerd 2, CRI-O) reload the directory. Not fsynced:
        # /var/run/cdi is a tmpfs, and a spec is only valid for this boot anyway.
        try:
            put()
        except FileNotFoundError:  # the directory is created on first use (or re-created)
            self.root.mkdir(parents=True, exist_ok=True)
            put()
        return Path(path)

    def remove(self, claim_uid: str) -> bool:
        return atomicfile.remove(self._file(claim_uid), durable=False)

    def _file(self, claim_uid: str) -> str:
        return f"{self._files}{claim_uid.replace('/', '_')}.json"

    def read(self, claim_uid: str) -> Any:
        return json.loads(self.spec_path(claim_uid).read_text())


def _visible_devices(planned: Sequence[Planned]) -> str:
    """UUIDs when every device serves the same request (so every container gets all of them);
    ``void`` otherwise, which also stops legacy NVIDIA hooks from adding GPUs on their own."""
    if len({p.request for p in planned}) == 1:
        return ",".join(dict.fromkeys(p.device.uuid for p in planned))
    return "void"


# ---- versions and validation ----------------------------------------------------------------


def _parse(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.lstrip("v").split("."))


def minimum_version(spec: Mapping[str, Any]) -> str:
    """The lowest ``cdiVersion`` covering the features ``spec`` uses (contracts.md §7.3)."""
    needs = {"0.3.0"}
    kind = str(spec.get("kind", ""))
    if "." in kind.partition("/")[2] or spec.get("annotations"):
        needs.add("0.6.0")
    all_edits = [spec.get("containerEdits") or {}]
    for dev in spec.get("devices") or []:
        if str(dev.get("name", ""))[:1].isdigit():
            needs.add("0.5.0")
        if dev.get("annotations"):
            needs.add("0.6.0")
        all_edits.append(dev.get("containerEdits") or {})
    for edits in all_edits:
        if any("type" in m for m in edits.get("mounts") or []):
            needs.add("0.4.0")
        if any("hostPath" in n for n in edits.get("deviceNodes") or []):
            needs.add("0.5.0")
        if "intelRdt" in edits or edits.get("additionalGids"):
            needs.add("0.7.0")
        rdt = edits.get("intelRdt") or {}
        if edits.get("netDevices") or "schemata" in rdt or "enableMonitoring" in rdt:
            needs.add("1.1.0")
    return max(needs, key=_parse)


def check(spec: Mapping[str, Any], *, required: str | None = None) -> list[str]:
    """Checks the JSON schema does not make (contracts.md §7): names, version, edits.
    ``required``: :func:`minimum_version` of ``spec`` if the caller has it already."""
    problems: list[str] = []
    version = str(spec.get("cdiVersion", ""))
    required = required or minimum_version(spec)
    if version.lstrip("v") not in _KNOWN_VERSIONS:
        problems.append(f"cdiVersion {version!r} is not a known CDI version")
    elif _parse(version) < _parse(required):
        problems.append(f"cdiVersion {version} is below the required {required}")
    vendor, slash, cls = str(spec.get("kind", "")).partition("/")
    if not slash or not _VENDOR.match(vendor) or not _CLASS.match(cls) or len(cls) > 63:
        problems.append(f"kind {spec.get('kind')!r} is not a valid vendor/class")
    seen: set[str] = set()
    devices = spec.get("devices") or []
    if not devices:
        problems.append("spec has no devices")
    for index, dev in enumerate(devices):
        name = str(dev.get("name", ""))
        if not _DEVICE.match(name):
            problems.append(f"devices[{index}].name {name!r} is not a valid CDI device name")
        if name in seen:
            problems.append(f"devices[{index}].name {name!r} is not unique")
        seen.add(name)
        edits = dev.get("containerEdits") or {}
        if not any(edits.get(k) for k in ("env", "deviceNodes", "mounts", "hooks")):
            problems.append(f"devices[{index}] ({name}) has empty containerEdits")
    for where, edits in [("containerEdits", spec.get("containerEdits") or {})] + [
        (f"devices[{i}].containerEdits", d.get("containerEdits") or {})
        for i, d in enumerate(devices)
    ]:
        for env in edits.get("env") or []:
            if "=" not in env or env.startswith("="):
                problems.append(f"{where}.env entry {env!r} is not NAME=VALUE")
        for node in edits.get("deviceNodes") or []:
            if not str(node.get("path", "")).startswith("/"):
                problems.append(f"{where}.deviceNodes path {node.get('path')!r} is not absolute")
    return problems
