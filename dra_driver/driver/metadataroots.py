"""Which directory a claim's metadata files live in, when that directory can be configured.

Why it exists: the metadata files (:mod:`~dra_driver.driver.devicemeta`) are never fsynced and
are rebuilt from the checkpoint record at start-up, so they need no disk; ``--metadata-dir``
(issue 46) puts them on a tmpfs such as the node's ``/run``, away from the kubelet disk's
journal. But a prepared claim's CDI spec, stored in its record, mounts its files by host path,
so a claim keeps its files where its spec says until it is unprepared, whatever the setting is
now. :class:`MetadataRoots` presents one :class:`~dra_driver.driver.devicemeta.ClaimMetadata`
to the claim state and recovery, and behind it keeps one per directory:

* the **primary** root (the configured directory, or the default ``<plugin-dir>/claim-metadata``
  when none is) gets new claims: their mounts, and the files of a record whose spec names none;
* an existing record goes to the root its spec's claim-wide mount names (``<root>/<uid>.claim
  .json``, or ``<root>/<uid>/claim.json`` of the layout before issue 37), made on first use
  when it is neither the primary nor the default (a directory configured once and changed
  since);
* what no record names (start-up's sweep of files without a record, a UID alone) covers the
  primary and the default root: the two a claim of this or the previous setting can be in.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dra_driver.driver import checkpoint, claims, inventory
from dra_driver.driver.devicemeta import CLAIM_SUFFIX, LEGACY_CLAIM_FILE, ClaimMetadata


class MetadataRoots:
    """The claim metadata files of every directory a prepared claim may have them in."""

    def __init__(
        self,
        *,
        default: Path,
        driver_name: str,
        devices: inventory.Inventory,
        primary: Path | None = None,
    ) -> None:
        """``default``: where the files went before the directory could be configured (and go
        while it is not); ``primary``: the configured directory (None: ``default``)."""
        self._driver_name = driver_name
        self._devices = devices
        self._lock = threading.Lock()  # roots made on first use, devices changed
        self.default = ClaimMetadata(root=default, driver_name=driver_name, devices=devices)
        self.primary = self.default
        if primary is not None and os.fspath(primary) != os.fspath(default):
            self.primary = ClaimMetadata(root=primary, driver_name=driver_name, devices=devices)
        self._roots: dict[str, ClaimMetadata] = {
            os.fspath(self.default.root): self.default,
            os.fspath(self.primary.root): self.primary,
        }

    @property
    def devices(self) -> inventory.Inventory:
        return self._devices

    @devices.setter
    def devices(self, now: inventory.Inventory) -> None:
        """The device model changed (rediscovery): every root builds content from ``now``."""
        with self._lock:
            self._devices = now
            for root in self._roots.values():
                root.devices = now

    def root_of(self, record: checkpoint.ClaimRecord) -> ClaimMetadata:
        """The root ``record``'s spec mounts its files from (the primary when it names none)."""
        where = spec_root(record)
        return self.primary if where is None else self._root(where)

    def local(self) -> tuple[ClaimMetadata, ...]:
        """The primary and the default root, once each."""
        if self.primary is self.default:
            return (self.primary,)
        return (self.primary, self.default)

    # ---- new claims: the primary root ----------------------------------------------------------

    def mounts(self, ref: claims.ClaimRef) -> list[dict[str, Any]]:
        return self.primary.mounts(ref)

    def plan(
        self, ref: claims.ClaimRef, claim: Mapping[str, Any], planned: Sequence[Any]
    ) -> list[Any]:
        return self.primary.plan(ref, claim, planned)

    # ---- a record's files: the root its spec names ---------------------------------------------

    def files(self, record: checkpoint.ClaimRecord) -> dict[str, Any]:
        return self.root_of(record).files(record)

    def paths(self, record: checkpoint.ClaimRecord) -> list[str]:
        return self.root_of(record).paths(record)

    def write(self, record: checkpoint.ClaimRecord) -> None:
        self.root_of(record).write(record)

    def restore(self, record: checkpoint.ClaimRecord) -> bool:
        return self.root_of(record).restore(record)

    def remove(self, ref: claims.ClaimRef, record: checkpoint.ClaimRecord | None = None) -> bool:
        """Remove the claim's files (idempotent): those of its ``record`` from the root its spec
        names; without a record, or one whose spec names none (an interrupted prepare's, whose
        spec is not built yet), from the primary and the default root. False when none was
        there."""
        if record is not None and record.uid == ref.uid:
            where = spec_root(record)
            if where is not None:
                return self._root(where).remove(ref, record)
        found = False
        for root in self.local():
            found = root.remove(ref, record) or found
        return found

    # ---- start-up: the primary and the default root --------------------------------------------

    def uids_on_disk(self) -> list[str]:
        """UIDs with files in the primary or the default root."""
        return sorted({uid for root in self.local() for uid in root.uids_on_disk()})

    def remove_stale_temporaries(self) -> list[Path]:
        return [path for root in self.local() for path in root.remove_stale_temporaries()]

    def _root(self, where: str) -> ClaimMetadata:
        found = self._roots.get(where)
        if found is not None:
            return found
        with self._lock:
            found = self._roots.get(where)
            if found is None:
                found = ClaimMetadata(
                    root=Path(where), driver_name=self._driver_name, devices=self._devices
                )
                self._roots[where] = found
            return found


def spec_root(record: checkpoint.ClaimRecord) -> str | None:
    """The directory of the claim file ``record``'s spec mounts in its claim-wide edits
    (``<root>/<uid>.claim.json``, or ``<root>/<uid>/claim.json`` of the layout before issue 37);
    None when it mounts none (an interrupted prepare's empty spec)."""
    edits = record.cdiSpec.get("containerEdits")
    mounts = edits.get("mounts") if isinstance(edits, dict) else None
    if not isinstance(mounts, list):
        return None
    tails = (f"/{record.uid}{CLAIM_SUFFIX}", f"/{record.uid}/{LEGACY_CLAIM_FILE}")
    for mount in mounts:
        host = mount.get("hostPath") if isinstance(mount, dict) else None
        if not isinstance(host, str) or not host.startswith("/"):
            continue
        for tail in tails:
            if host.endswith(tail) and len(host) > len(tail):
                return host[: -len(tail)]
    return None
