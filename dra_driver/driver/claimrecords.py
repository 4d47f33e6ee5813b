"""The format of a claim's checkpoint record, and the careful reading of checkpoint files.

Why its own module: :mod:`~dra_driver.driver.checkpoint` is about *storing* records (two-phase
writes, the in-place commit, recycled files, boot scoping); what a record *is* — its versioned,
strict pydantic model — and how a file is read without trusting it (size cap, no symlinks or
FIFOs, too-deep JSON as corruption) are needed by more than the store: recovery compares specs
on disk, the MPS daemons read their own records, tests and tools decode records. Everything here
is re-exported by :mod:`~dra_driver.driver.checkpoint`, where callers have always found it.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from pathlib import Path
from typing import Any, Final, Literal

import pydantic

from dra_driver.driver import results

FORMAT_VERSION: Final = 1
BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")
PREPARE_STARTED: Final = "PrepareStarted"
PREPARE_COMPLETED: Final = "PrepareCompleted"
State = Literal["PrepareStarted", "PrepareCompleted"]
# A record is a few KiB (a spec and up to 32 devices); anything this large is not one of ours.
MAX_FILE_BYTES: Final = 4 << 20
_UID = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,126}[A-Za-z0-9])?$")
_STRICT = pydantic.ConfigDict(extra="forbid", frozen=True)


class MigRecord(pydantic.BaseModel):
    """A dynamic MIG instance of a device: recorded (without ids) *before* it is created, so
    recovery can find and destroy it whatever happened next; ids and UUID once it exists."""

    model_config = _STRICT
    parentUUID: str
    profile: str
    profileId: int
    placementStart: int
    placementSize: int
    gpuInstanceId: int | None = None
    computeInstanceId: int | None = None
    uuid: str | None = None


class DeviceRecord(pydantic.BaseModel):
    model_config = _STRICT
    requestNames: tuple[str, ...]
    poolName: str
    deviceName: str
    cdiDeviceIds: tuple[str, ...]
    shareId: str | None = None
    adminAccess: bool = False
    config: dict[str, Any] = pydantic.Field(default_factory=dict)
    consumedCapacity: dict[str, str] = pydantic.Field(default_factory=dict)  # of a share
    mpsDaemon: str | None = None  # the MPS control daemon the device runs through
    mig: MigRecord | None = None  # dynamic MIG devices only

    def prepared(self) -> results.PreparedDevice:
        return results.PreparedDevice(
            request_names=self.requestNames,
            pool_name=self.poolName,
            device_name=self.deviceName,
            cdi_device_ids=self.cdiDeviceIds,
            share_id=self.shareId,
        )


class ClaimRecord(pydantic.BaseModel):
    """Everything needed to answer a repeated prepare and to undo it, for one claim."""

    model_config = _STRICT
    version: Literal[1] = FORMAT_VERSION
    uid: str
    namespace: str
    name: str
    state: State
    bootId: str
    devices: tuple[DeviceRecord, ...]
    cdiSpec: dict[str, Any]  # the spec as written, so a lost spec file can be restored

    def prepared(self) -> tuple[results.PreparedDevice, ...]:
        return tuple(d.prepared() for d in self.devices)


def decode_json(data: bytes, *, what: str) -> Any:
    """``data`` parsed as JSON; ValueError for anything that is not (too large, too deeply
    nested for the parser, not UTF-8, not JSON)."""
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"{what} is {len(data)} bytes, more than the {MAX_FILE_BYTES} allowed")
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError(f"{what} is nested too deeply to be a checkpoint") from None


def valid_uid(uid: str) -> bool:
    """A UID we can use in file and CDI device names (Kubernetes UIDs are UUIDs)."""
    return bool(_UID.match(uid))


def read_boot_id(path: Path = BOOT_ID_FILE) -> str:
    """The kernel's random ID of this boot; a fixed marker when the file is not readable."""
    try:
        return path.read_text().strip() or "unknown"
    except OSError:
        return "unknown"


def read_file(path: Path) -> bytes:
    """A regular file's bytes, at most one more than :data:`MAX_FILE_BYTES` (enough to refuse
    it). Symlinks, FIFOs and devices are refused with OSError: never followed, never blocked on.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_FILE_BYTES:
            chunk = os.read(fd, MAX_FILE_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
