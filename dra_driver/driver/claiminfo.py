"""Who holds which physical GPU: the prepared claims, in memory, for the per-claim metrics.

Why it exists: ``/metrics`` labels GPU telemetry with the claim (and its pods) that holds each
GPU, and a scrape must neither call the API server nor read files. The claim state
(:class:`~dra_driver.driver.state.ClaimState`) writes a :class:`PreparedClaims` after every
prepare (with the pods of the claim's ``status.reservedFor``, read from the claim prepare
fetched anyway), after every unprepare, and at start-up recovery (from the checkpoint, which
does not keep pods: recovered claims have none until prepared afresh). Readers get an immutable
snapshot, so a scrape holds the lock only to copy one reference.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

from dra_driver import records
from dra_driver.driver import checkpoint, inventory


@records.record
class PhysicalGpu:
    """One physical GPU a prepared device uses (a MIG device: its parent GPU)."""

    device: str  # the published device name: gpu-3, gpu-3-mig-1g10gb-..., a set's name
    gpu_uuid: str
    gpu_minor: int
    mig_uuid: str = ""  # a MIG device: its own UUID


@records.record
class ClaimInfo:
    uid: str
    namespace: str
    name: str
    pods: tuple[str, ...]  # the pods reserving the claim when it was prepared (names)
    gpus: tuple[PhysicalGpu, ...]


def physical_gpus(
    record: checkpoint.ClaimRecord, devices: inventory.Inventory
) -> tuple[PhysicalGpu, ...]:
    """The GPUs behind a record's devices; unknown devices are left out."""
    found: list[PhysicalGpu] = []
    for dev in record.devices:
        name = dev.deviceName
        if dev.mig is not None and dev.mig.uuid:  # dynamic MIG: the instance prepare created
            parent = _by_uuid(devices, dev.mig.parentUUID)
            minor = parent.parent_minor if parent is not None else -1
            found.append(PhysicalGpu(name, dev.mig.parentUUID, minor, dev.mig.uuid))
            continue
        known = devices.get(name)
        if known is None:
            continue
        if known.members:
            found += [PhysicalGpu(name, m.uuid, m.parent_minor) for m in known.members]
        elif known.kind == "mig":
            parent = devices.get(f"gpu-{known.parent_minor}")
            uuid = parent.uuid if parent is not None else ""
            found.append(PhysicalGpu(name, uuid, known.parent_minor, known.uuid))
        else:
            found.append(PhysicalGpu(name, known.uuid, known.parent_minor))
    return tuple(found)


def _by_uuid(devices: inventory.Inventory, uuid: str) -> inventory.PreparableDevice | None:
    return next((d for d in devices.devices.values() if d.uuid == uuid), None)


class PreparedClaims:
    """Thread-safe: claim UID → :class:`ClaimInfo`; readers take :meth:`snapshot`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._claims: dict[str, ClaimInfo] = {}
        self._snap: tuple[ClaimInfo, ...] = ()

    def put(self, info: ClaimInfo) -> None:
        with self._lock:
            self._claims[info.uid] = info
            self._snap = tuple(self._claims.values())

    def remove(self, uid: str) -> None:
        with self._lock:
            if self._claims.pop(uid, None) is not None:
                self._snap = tuple(self._claims.values())

    def reset(self, infos: Iterable[ClaimInfo]) -> None:
        with self._lock:
            self._claims = {i.uid: i for i in infos}
            self._snap = tuple(self._claims.values())

    def snapshot(self) -> tuple[ClaimInfo, ...]:
        with self._lock:
            return self._snap

    def record(
        self,
        record: checkpoint.ClaimRecord,
        devices: inventory.Inventory,
        pods: Sequence[str] = (),
    ) -> None:
        """``record`` (a completed prepare) with ``pods``."""
        self.put(
            ClaimInfo(
                uid=record.uid,
                namespace=record.namespace,
                name=record.name,
                pods=tuple(pods),
                gpus=physical_gpus(record, devices),
            )
        )
