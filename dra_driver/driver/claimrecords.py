"""The format of a claim's checkpoint record, and the careful reading of checkpoint files.

Why its own module: :mod:`~dra_driver.driver.checkpoint` is about *storing* records (two-phase
writes, the in-place commit, recycled files, boot scoping); what a record *is* — its versioned,
strict format — and how a file is read without trusting it (size cap, no symlinks or FIFOs,
too-deep JSON as corruption) are needed by more than the store: recovery compares specs on disk,
the MPS daemons read their own records, tests and tools decode records. Everything here is
re-exported by :mod:`~dra_driver.driver.checkpoint`, where callers have always found it.

Why not pydantic: every node agent reads and writes these records, and loading pydantic for
three flat record types cost each agent megabytes of resident memory (issue #38). The records
are frozen dataclasses; :meth:`ClaimRecord.encode` and :meth:`ClaimRecord.from_json` are the
codec. The bytes are the ones pydantic's ``model_dump_json`` wrote: compact JSON, fields in
declaration order, every field written (``null`` for an absent optional one), non-ASCII text as
UTF-8, so older files read back and the in-place commit finds the state where it always did.
Floats, which no record holds (configs and CDI specs are strings, integers and booleans), would
be written as the json module writes them (``1e-05``, ``NaN``; pydantic: ``0.00001``, ``null``).

Decoding is strict, stricter than pydantic was (it took ``"1"`` or ``true`` for an integer):
unknown or missing fields, a value of the wrong JSON type (a boolean is not an integer), another
``version`` or an unknown ``state`` are :class:`RecordError` (a ValueError, what every reader
catches: the store moves such a file aside), naming the file, the field and the reason.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final, Literal, TypeVar

from dra_driver import records
from dra_driver.driver import results

FORMAT_VERSION: Final = 1
BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")
UNKNOWN_BOOT: Final = "unknown"  # what read_boot_id gives without a readable boot ID
PREPARE_STARTED: Final = "PrepareStarted"
PREPARE_COMPLETED: Final = "PrepareCompleted"
State = Literal["PrepareStarted", "PrepareCompleted"]
# A record is a few KiB (a spec and up to 32 devices); anything this large is not one of ours.
MAX_FILE_BYTES: Final = 4 << 20
_UID = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,126}[A-Za-z0-9])?$")
# Compact, UTF-8 as it is: what pydantic's model_dump_json wrote (the C encoder does the work).
_ENCODER: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
_string: Final = json.encoder.encode_basestring  # a str as a JSON string (in C)
_integer: Final = int.__repr__  # a bool passed for an int still writes a number


def encode_json(value: Any) -> str:
    """``value`` (JSON data) as a record writes it: compact, non-ASCII text as it is."""
    if type(value) is dict and not value:  # most devices' consumedCapacity: skip the encoder
        return "{}"
    return _ENCODER.encode(value)


def _optional_string(value: str | None) -> str:
    return "null" if value is None else _string(value)


def _optional_integer(value: int | None) -> str:
    return "null" if value is None else _integer(value)


def _strings_json(values: tuple[str, ...]) -> str:
    return f"[{','.join(map(_string, values))}]"


class RecordError(ValueError):
    """A checkpoint record that does not decode; the text names the file, field and reason."""


@records.record(kw_only=True)
class MigRecord:
    """A dynamic MIG instance of a device: recorded (without ids) *before* it is created, so
    recovery can find and destroy it whatever happened next; ids and UUID once it exists."""

    parentUUID: str
    profile: str
    profileId: int
    placementStart: int
    placementSize: int
    gpuInstanceId: int | None = None
    computeInstanceId: int | None = None
    uuid: str | None = None

    def _json(self) -> str:
        return (
            f'{{"parentUUID":{_string(self.parentUUID)},"profile":{_string(self.profile)},'
            f'"profileId":{_integer(self.profileId)},'
            f'"placementStart":{_integer(self.placementStart)},'
            f'"placementSize":{_integer(self.placementSize)},'
            f'"gpuInstanceId":{_optional_integer(self.gpuInstanceId)},'
            f'"computeInstanceId":{_optional_integer(self.computeInstanceId)},'
            f'"uuid":{_optional_string(self.uuid)}}}'
        )


@records.record(kw_only=True)
class DeviceRecord:
    requestNames: tuple[str, ...]
    poolName: str
    deviceName: str
    cdiDeviceIds: tuple[str, ...]
    shareId: str | None = None
    adminAccess: bool = False
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    consumedCapacity: dict[str, str] = dataclasses.field(default_factory=dict)  # of a share
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

    def _json(self, config: str) -> str:
        """The device as stored, with its ``config`` already encoded."""
        mig = self.mig
        return (
            f'{{"requestNames":{_strings_json(self.requestNames)},'
            f'"poolName":{_string(self.poolName)},"deviceName":{_string(self.deviceName)},'
            f'"cdiDeviceIds":{_strings_json(self.cdiDeviceIds)},'
            f'"shareId":{_optional_string(self.shareId)},'
            f'"adminAccess":{"true" if self.adminAccess else "false"},"config":{config},'
            f'"consumedCapacity":{encode_json(self.consumedCapacity)},'
            f'"mpsDaemon":{_optional_string(self.mpsDaemon)},'
            f'"mig":{"null" if mig is None else mig._json()}}}'
        )


@records.record(kw_only=True)
class ClaimRecord:
    """Everything needed to answer a repeated prepare and to undo it, for one claim.

    A changed copy is ``dataclasses.replace(record, state=...)``."""

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

    def encode(self, *, spec_json: str | None = None) -> bytes:
        """The record as stored (without a trailing newline): see the module doc.
        ``spec_json``: :func:`encode_json` of :attr:`cdiSpec`, when the caller has it already
        (prepare encodes the spec once, for this record and for the CDI spec file)."""
        devices: list[str] = []
        config: dict[str, Any] | None = None
        config_json = ""
        for dev in self.devices:
            # The devices of a claim mostly share one config: encoded once, compared in C.
            if dev.config is not config and dev.config != config:
                config, config_json = dev.config, encode_json(dev.config)
            devices.append(dev._json(config_json))
        spec = encode_json(self.cdiSpec) if spec_json is None else spec_json
        return (
            f'{{"version":{_integer(self.version)},"uid":{_string(self.uid)},'
            f'"namespace":{_string(self.namespace)},"name":{_string(self.name)},'
            f'"state":{_string(self.state)},"bootId":{_string(self.bootId)},'
            f'"devices":[{",".join(devices)}],"cdiSpec":{spec}}}'
        ).encode()

    @classmethod
    def from_json(cls, value: object, *, what: str) -> ClaimRecord:
        """The record ``value`` (parsed JSON) holds; :class:`RecordError` naming ``what`` (the
        file), the field and the reason when it is not exactly one."""
        try:
            if type(value) is not dict:
                raise _got("a record (an object)", value)
            return _decode(cls, value)
        except _Invalid as exc:
            if not exc.where:
                raise RecordError(f"{what}: {exc.reason}") from None
            raise RecordError(f"{what}: field {exc.where[1:]}: {exc.reason}") from None


def decode_record(data: bytes, *, what: str) -> ClaimRecord:
    """The record in a file's ``data``; ValueError (:class:`RecordError` for a well-formed JSON
    document that is not a record) naming ``what`` and the reason."""
    return ClaimRecord.from_json(decode_json(data, what=what), what=what)


class _Invalid(Exception):
    """A wrong value; its field's path is added on the way up (built only when there is one)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason, self.where = reason, ""

    def at(self, step: str) -> _Invalid:
        self.where = f"{step}{self.where}"
        return self


_T = TypeVar("_T")
_Check = Callable[[Any], Any]  # a JSON value -> the field's value, or _Invalid
_JSON_KINDS: Final[Mapping[type, str]] = {
    dict: "an object",
    list: "an array",
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}


def _got(expected: str, value: object) -> _Invalid:
    kind = _JSON_KINDS.get(type(value), type(value).__name__)
    return _Invalid(f"expected {expected}, got {kind}")


def _exactly(kind: type[_T], expected: str) -> Callable[[Any], _T]:
    """A check for values of exactly ``kind`` (``type() is``: a bool is not an int)."""

    def check(value: Any) -> _T:
        if type(value) is not kind:
            raise _got(expected, value)
        return value

    return check


_str = _exactly(str, "a string")
_int = _exactly(int, "an integer")
_bool = _exactly(bool, "a boolean")


def _optional(check: _Check) -> _Check:
    return lambda value: None if value is None else check(value)


def _one_of(*allowed: object) -> _Check:
    def check(value: Any) -> Any:  # types compared too: True == 1, but it is no version
        if not any(type(value) is type(a) and value == a for a in allowed):
            raise _Invalid(f"expected {' or '.join(map(repr, allowed))}, got {value!r:.80}")
        return value

    return check


def _strings(value: Any) -> tuple[str, ...]:
    if type(value) is not list and type(value) is not tuple:
        raise _got("an array of strings", value)
    for i, item in enumerate(value):
        if type(item) is not str:
            raise _got("a string", item).at(f"[{i}]")
    return tuple(value)


def _object(value: Any) -> dict[str, Any]:
    if type(value) is not dict:
        raise _got("an object", value)
    for key in value:
        if type(key) is not str:
            raise _got("a string", key).at(f" key {key!r:.80}")
    return value


def _string_map(value: Any) -> dict[str, str]:
    for key, item in _object(value).items():
        if type(item) is not str:
            raise _got("a string", item).at(f"[{key!r:.80}]")
    return value  # type: ignore[no-any-return]


def _devices(value: Any) -> tuple[DeviceRecord, ...]:
    if type(value) is not list and type(value) is not tuple:
        raise _got("an array of devices", value)
    found = []
    for i, item in enumerate(value):
        try:
            found.append(_decode(DeviceRecord, item))
        except _Invalid as exc:
            raise exc.at(f"[{i}]") from None
    return tuple(found)


# What each field of each record must be, in declaration order.
_FIELDS: Final[Mapping[type, Mapping[str, _Check]]] = {
    MigRecord: {
        "parentUUID": _str,
        "profile": _str,
        "profileId": _int,
        "placementStart": _int,
        "placementSize": _int,
        "gpuInstanceId": _optional(_int),
        "computeInstanceId": _optional(_int),
        "uuid": _optional(_str),
    },
    DeviceRecord: {
        "requestNames": _strings,
        "poolName": _str,
        "deviceName": _str,
        "cdiDeviceIds": _strings,
        "shareId": _optional(_str),
        "adminAccess": _bool,
        "config": _object,
        "consumedCapacity": _string_map,
        "mpsDaemon": _optional(_str),
        "mig": _optional(lambda value: _decode(MigRecord, value)),
    },
    ClaimRecord: {
        "version": _one_of(FORMAT_VERSION),
        "uid": _str,
        "namespace": _str,
        "name": _str,
        "state": _one_of(PREPARE_STARTED, PREPARE_COMPLETED),
        "bootId": _str,
        "devices": _devices,
        "cdiSpec": _object,
    },
}
_REQUIRED: Final[Mapping[type, tuple[str, ...]]] = {
    cls: tuple(
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    )
    for cls in _FIELDS
}


def _decode(cls: type[_T], value: Any) -> _T:
    """An instance of the record class ``cls`` from ``value``."""
    if type(value) is not dict:
        raise _got("an object", value)
    checks = _FIELDS[cls]
    for key in _REQUIRED[cls]:
        if key not in value:
            raise _Invalid("missing").at(f".{key}")
    fields: dict[str, Any] = {}
    for key, item in value.items():
        check = checks.get(key)
        if check is None:
            raise _Invalid("unknown field").at(f".{key!s:.80}")
        try:
            fields[key] = check(item)
        except _Invalid as exc:
            raise exc.at(f".{key}") from None
    return cls(**fields)


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
    """The kernel's random ID of this boot; :data:`UNKNOWN_BOOT` when the file is not readable
    (then every boot looks the same, and the checkpoint syncs its commits)."""
    try:
        return path.read_text().strip() or UNKNOWN_BOOT
    except OSError:
        return UNKNOWN_BOOT


def read_file(path: Path) -> bytes:
    """A regular file's bytes, at most one more than :data:`MAX_FILE_BYTES` (enough to refuse
    it). Symlinks, FIFOs and devices are refused with OSError: never followed, never blocked on."""
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
