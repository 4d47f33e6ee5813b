"""The ComputeDomain driver's checkpoint: which claims this node prepares, and how far.

Why it exists: preparing a claim changes things outside the agent's memory — the domain's
``status.nodes``, the Node's domain label, the IMEX files, the CDI spec. A claim is recorded
(``preparing``) *before* the first of those and marked ``prepared`` after the last, and undoing
it removes them all before the record goes. So whatever moment the agent dies at, the record
on disk names every change that may exist, and the agent that starts next can finish or undo
it (:meth:`~.nodedriver.NodeDriver.recover`). Written atomically and durably (one small JSON
file in the driver's plugin directory).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from dra_driver import records
from dra_driver.driver import atomicfile

PREPARING, PREPARED = "preparing", "prepared"
CHANNEL, DAEMON = "channel", "daemon"
FILE = "checkpoint.json"
VERSION = 1


class CheckpointError(Exception):
    """The checkpoint file cannot be read or is not ours."""


@records.record
class Record:
    """One claim of this driver on this node."""

    uid: str
    namespace: str
    name: str
    kind: str  # CHANNEL or DAEMON
    domain_uid: str
    domain_namespace: str
    domain_name: str
    device: str  # the allocated device, e.g. channel-0
    request: str  # its request's main name
    state: str = PREPARING
    channels: tuple[int, ...] = ()  # the channels injected (CHANNEL, prepared)

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["channels"] = list(self.channels)
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Record:
        return cls(**{**raw, "channels": tuple(raw.get("channels") or ())})


class NodeState:
    """The records, loaded at start and written through on every change (not thread-safe:
    the driver serializes its calls)."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / FILE
        self.records: dict[str, Record] = {}

    def load(self) -> None:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            self.records = {}
            return
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"cannot read {self.path}: {exc}") from exc
        if not isinstance(raw, dict) or raw.get("version") != VERSION:
            raise CheckpointError(f"{self.path} is not a version {VERSION} checkpoint of ours")
        try:
            self.records = {
                uid: Record.from_json(rec) for uid, rec in (raw.get("claims") or {}).items()
            }
        except TypeError as exc:
            raise CheckpointError(f"{self.path}: malformed record: {exc}") from exc

    def get(self, uid: str) -> Record | None:
        return self.records.get(uid)

    def put(self, record: Record) -> None:
        self.records[record.uid] = record
        self._save()

    def remove(self, uid: str) -> None:
        if self.records.pop(uid, None) is not None:
            self._save()

    def of_domain(self, domain_uid: str, kind: str) -> list[Record]:
        return [r for r in self.records.values() if r.domain_uid == domain_uid and r.kind == kind]

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        body = {"version": VERSION, "claims": {u: r.to_json() for u, r in self.records.items()}}
        atomicfile.write_json(self.path, body)
