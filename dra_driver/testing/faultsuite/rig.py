"""The node the fault scenarios run on, its claims, and the audit of what is on disk.

A fake ``dgx-h100`` node (8 GPUs) under a short temporary directory, with a set of claims that
exercises every kind of preparation: single GPUs, a two-GPU claim time-sliced ``Short``, and an
admin-access claim holding the same GPUs with the same interval. :func:`audit` compares the
plugin's files with what the kubelet was told, after the plugin's start-up recovery.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dra_driver import app
from dra_driver.devices import fake, model
from dra_driver.driver import checkpoint, claims, inventory, sharing
from dra_driver.testing.fakeapi import memory

DRIVER = "gpu.nvidia.com"
NODE = "n1"
PROFILE = "dgx-h100"
SPEC_PREFIX = "k8s.gpu.nvidia.com-claim_"


def devices() -> model.NodeDevices:
    return fake.FakeBackend.from_name(PROFILE).discover()


def settings(base: Path, **changes: Any) -> app.PluginSettings:
    """Plugin settings with every path under ``base`` (fake GPUs, no publishing)."""
    (base / "boot_id").parent.mkdir(parents=True, exist_ok=True)
    if not (base / "boot_id").exists():
        (base / "boot_id").write_text("boot-1\n")
    found = app.PluginSettings(
        node_name=NODE,
        driver_name=DRIVER,
        registry_dir=base / "registry",
        plugins_dir=base / "plugins",
        cdi_root=base / "cdi",
        driver_root=base / "no-driver",
        fake=True,
        boot_id_file=base / "boot_id",
        cleanup_interval_s=0,
        publish=False,
    )
    return dataclasses.replace(found, **changes)


def claim(
    name: str,
    gpus: list[str],
    *,
    interval: str | None = None,
    admin: bool = False,
    namespace: str = "faults",
) -> dict[str, Any]:
    """A ResourceClaim allocated ``gpus`` of this node (time-sliced with ``interval``)."""
    results: list[dict[str, Any]] = []
    for gpu in gpus:
        result: dict[str, Any] = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": gpu}
        if admin:
            result["adminAccess"] = True
        results.append(result)
    config = []
    if interval is not None:
        params = {
            "apiVersion": "gpu.nvidia.com/v1",
            "kind": "GpuConfig",
            "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": interval}},
        }
        config.append({"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": params}})
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4())},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {"deviceClassName": DRIVER, "count": len(gpus)},
                    }
                ]
            }
        },
        "status": {"allocation": {"devices": {"results": results, "config": config}}},
    }


def standard_claims() -> list[dict[str, Any]]:
    """Claims that never conflict with each other: all of them may be prepared at once."""
    found = [claim(f"c{i}", [f"gpu-{i}"]) for i in range(6)]
    found.append(claim("sliced", ["gpu-6", "gpu-7"], interval="Short"))
    found.append(claim("admin", ["gpu-6", "gpu-7"], interval="Short", admin=True))
    return found


def ref_of(obj: Mapping[str, Any]) -> claims.ClaimRef:
    meta = obj["metadata"]
    return claims.ClaimRef(uid=meta["uid"], namespace=meta["namespace"], name=meta["name"])


def api_with(objs: list[dict[str, Any]]) -> memory.InMemoryApi:
    api = memory.InMemoryApi(use_default_cel=False)
    api.put_node(NODE)
    for obj in objs:
        api.put_resource_claim(obj)
    return api


@dataclasses.dataclass(slots=True)
class Audit:
    """What is wrong on disk (empty lists: nothing)."""

    prepared: set[str]  # claim UIDs with a completed record and its spec
    leaked: list[str] = dataclasses.field(default_factory=list)  # specs without a record
    lost: list[str] = dataclasses.field(default_factory=list)  # told prepared, not on disk
    problems: list[str] = dataclasses.field(default_factory=list)  # anything else

    @property
    def ok(self) -> bool:
        return not (self.leaked or self.lost or self.problems)

    def describe(self) -> str:
        parts = []
        if self.leaked:
            parts.append(f"leaked specs {self.leaked[:3]}")
        if self.lost:
            parts.append(f"lost claims {self.lost[:3]}")
        parts += self.problems[:3]
        return "; ".join(parts)


def audit(
    where: app.PluginSettings,
    *,
    told: Mapping[str, bool] | None = None,
    node: model.NodeDevices | None = None,
) -> Audit:
    """Disk after recovery: every record completed with its spec (same content), no spec or
    temporary without a record, GPU sharing as the records want, and each claim in ``told``
    (uid → the kubelet was last told: prepared / unprepared) as it was told."""
    claims_dir = where.plugin_dir / "claims"
    records: dict[str, dict[str, Any]] = {}
    result = Audit(prepared=set())
    for path in sorted(claims_dir.glob("*.json")) if claims_dir.is_dir() else []:
        record = _json_file(path)
        if isinstance(record, dict):
            records[path.stem] = record
        else:
            result.problems.append(f"unreadable record {path.name}")
    cdi = where.cdi_root
    names = sorted(p.name for p in cdi.iterdir()) if cdi.is_dir() else []
    specs = {n[len(SPEC_PREFIX) : -len(".json")] for n in names if n.startswith(SPEC_PREFIX)}
    result.leaked += [n for n in names if n.startswith(".")]
    result.leaked += sorted(specs - set(records))
    for uid, record in records.items():
        if record.get("state") != checkpoint.PREPARE_COMPLETED:
            result.problems.append(f"record {uid} is {record.get('state')} after recovery")
        elif uid not in specs:
            result.problems.append(f"record {uid} has no CDI spec")
        elif _json_file(cdi / f"{SPEC_PREFIX}{uid}.json") != record["cdiSpec"]:
            result.problems.append(f"CDI spec of {uid} differs from its record (or is unreadable)")
        else:
            result.prepared.add(uid)
    for uid, prepared in (told or {}).items():
        if prepared and uid not in result.prepared:
            result.lost.append(uid)
        elif not prepared and uid in records:
            result.problems.append(f"claim {uid} was unprepared but is back")
    result.problems += _sharing_drift(where, records, node or devices())
    return result


def _sharing_drift(
    where: app.PluginSettings, records: Mapping[str, dict[str, Any]], node: model.NodeDevices
) -> list[str]:
    """GPUs whose time-slice setting is not what the prepared claims want."""
    state_file = where.plugin_dir / "fake-gpu-control.json"
    try:
        state = json.loads(state_file.read_text()) if state_file.exists() else {}
    except ValueError as exc:
        return [f"fake GPU state unreadable: {exc}"]
    known = inventory.build(node, mig_minors=None)
    wanted: dict[str, int] = {}
    for uid, raw in records.items():
        try:
            record = checkpoint.ClaimRecord.from_json(raw, what=f"claims/{uid}.json")
        except ValueError:
            continue
        for target in sharing.recorded_targets(record, known):
            wanted[target.uuid] = sharing.INTERVALS[target.interval]
    problems = []
    for gpu in node.gpus:
        have = int((state.get(gpu.uuid) or {}).get("timeslice", 0))
        if have != wanted.get(gpu.uuid, 0):
            problems.append(
                f"{gpu.name} time-slice {have}, prepared claims want {wanted.get(gpu.uuid, 0)}"
            )
    return problems


def _json_file(path: Path) -> Any:
    """A regular file's JSON (never blocking on a FIFO); None when it is not that."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(os.dup(fd), "rb") as file:
            return json.loads(file.read())
    except (OSError, ValueError, RecursionError):
        return None
    finally:
        os.close(fd)


def double_allocations(found: Audit, results: Mapping[str, list[dict[str, Any]]]) -> list[str]:
    """A line for each device that more than one prepared claim holds (admin access aside:
    it may share a device by design), from the claims' allocation ``results`` by UID."""
    holders: dict[str, list[str]] = {}
    for uid in found.prepared:
        for result in results[uid]:
            if not result.get("adminAccess"):
                holders.setdefault(result["device"], []).append(uid)
    return [
        f"{device} is held by {len(uids)} claims at once (double allocation)"
        for device, uids in holders.items()
        if len(uids) > 1
    ]
