"""The checkpoint record format: the bytes the pydantic models wrote, and strict decoding.

The records were pydantic models until issue #38 made them dataclasses with a hand-written codec.
Files written before must read back, and the in-place commit must find the state where it always
was, so the encoding is checked byte for byte against a frozen copy of those models (and against
files they wrote, kept here as bytes); every kind of bad input must be an error naming the file,
the field and the reason, and a corrupted file is still moved aside, never a crash.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, Literal

import pydantic
import pytest
import structlog

from dra_driver import logs
from dra_driver.driver import checkpoint

REPO = Path(__file__).resolve().parents[2]

# ---- a frozen copy of the models as they were (field lists, types, defaults) -------------------
_OLD = pydantic.ConfigDict(extra="forbid", frozen=True)


class OldMig(pydantic.BaseModel):
    model_config = _OLD
    parentUUID: str
    profile: str
    profileId: int
    placementStart: int
    placementSize: int
    gpuInstanceId: int | None = None
    computeInstanceId: int | None = None
    uuid: str | None = None


class OldDevice(pydantic.BaseModel):
    model_config = _OLD
    requestNames: tuple[str, ...]
    poolName: str
    deviceName: str
    cdiDeviceIds: tuple[str, ...]
    shareId: str | None = None
    adminAccess: bool = False
    config: dict[str, Any] = pydantic.Field(default_factory=dict)
    consumedCapacity: dict[str, str] = pydantic.Field(default_factory=dict)
    mpsDaemon: str | None = None
    mig: OldMig | None = None


class OldClaim(pydantic.BaseModel):
    model_config = _OLD
    version: Literal[1] = 1
    uid: str
    namespace: str
    name: str
    state: Literal["PrepareStarted", "PrepareCompleted"]
    bootId: str
    devices: tuple[OldDevice, ...]
    cdiSpec: dict[str, Any]


# Files the pydantic models wrote (model_dump_json; the second as a Started record, padded).
OLD_FILE: Final = (
    b'{"version":1,"uid":"5c2b0c56-3a8e-4d7e-9f7a-0b1c2d3e4f50","namespace":"team-\xc3'
    b'\xa4","name":"n\xc3\xb6n-ASCII \xe2\x9c\x93 \xf0\x9f\x98\x80 \\"q\\" \\\\ \\n\\t\\u'
    b'0000\\u001f\x7f \xe2\x80\xa8","state":"PrepareCompleted","bootId":"b1","devices":[{'
    b'"requestNames":["mig"],"poolName":"n1","deviceName":"gpu-0-mig-19-6-1","cdiDeviceId'
    b's":["k8s.gpu.nvidia.com/claim=5c2b-gpu-0-mig-19-6-1"],"shareId":null,"adminAccess":'
    b'false,"config":{"apiVersion":"gpu.nvidia.com/v1","kind":"GpuConfig","env":{"GREETIN'
    b'G":"n\xc3\xb6n-ASCII \xe2\x9c\x93 \xf0\x9f\x98\x80 \\"q\\" \\\\ \\n\\t\\u0000\\u001'
    b'f\x7f \xe2\x80\xa8"}},"consumedCapacity":{},"mpsDaemon":null,"mig":{"parentUUID":"G'
    b'PU-7f3c","profile":"1g.10gb","profileId":19,"placementStart":6,"placementSize":1,"g'
    b'puInstanceId":13,"computeInstanceId":0,"uuid":"MIG-0e4b"}},{"requestNames":["share"'
    b'],"poolName":"n1","deviceName":"gpu-1","cdiDeviceIds":["k8s.gpu.nvidia.com/claim=5c'
    b'2b-gpu-1"],"shareId":"0d8a","adminAccess":true,"config":{},"consumedCapacity":{"mem'
    b'ory":"40Gi"},"mpsDaemon":"mps-gpu-1","mig":null}],"cdiSpec":{"cdiVersion":"0.5.0","'
    b'kind":"k8s.gpu.nvidia.com/claim","devices":[{"name":"5c2b-gpu-1","containerEdits":{'
    b'"env":["X=n\xc3\xb6n-ASCII \xe2\x9c\x93 \xf0\x9f\x98\x80 \\"q\\" \\\\ \\n\\t\\u0000'
    b'\\u001f\x7f \xe2\x80\xa8"]}}]}}'
)
OLD_STARTED_FILE: Final = (
    b'{"version":1,"uid":"u1","namespace":"ns","name":"c","state":"PrepareStarted"  ,"boo'
    b'tId":"b1","devices":[{"requestNames":["gpu"],"poolName":"n1","deviceName":"gpu-0","'
    b'cdiDeviceIds":["k8s.gpu.nvidia.com/claim=u1-gpu-0"],"shareId":null,"adminAccess":fa'
    b'lse,"config":{},"consumedCapacity":{},"mpsDaemon":null,"mig":null}],"cdiSpec":{"cdi'
    b'Version":"0.3.0"}}\n'
)

# Every kind of character the two encoders could escape differently.
TRICKY: Final = ["a", "ä", "✓", "😀", '"', "\\", "\n", "\t", "\x00", "\x1f", "\x7f", "\u2028", "</"]


def full() -> dict[str, Any]:
    """A record's JSON with every field set (not one left to its default)."""
    return {
        "version": 1,
        "uid": "u1",
        "namespace": "ns",
        "name": "c",
        "state": "PrepareCompleted",
        "bootId": "b1",
        "devices": [
            {
                "requestNames": ["gpu", "more"],
                "poolName": "n1",
                "deviceName": "gpu-0-mig-19-6-1",
                "cdiDeviceIds": ["k8s.gpu.nvidia.com/claim=u1-gpu-0-mig-19-6-1"],
                "shareId": "0d8a",
                "adminAccess": True,
                "config": {"apiVersion": "gpu.nvidia.com/v1", "env": {"A": "b"}, "n": [1, None]},
                "consumedCapacity": {"memory": "10Gi"},
                "mpsDaemon": "mps-1",
                "mig": {
                    "parentUUID": "GPU-1",
                    "profile": "1g.10gb",
                    "profileId": 19,
                    "placementStart": 6,
                    "placementSize": 1,
                    "gpuInstanceId": 13,
                    "computeInstanceId": 0,
                    "uuid": "MIG-1",
                },
            }
        ],
        "cdiSpec": {"cdiVersion": "0.5.0", "devices": [{"name": "u1-gpu-0"}]},
    }


def random_record(rng: random.Random) -> dict[str, Any]:
    def text() -> str:
        return "".join(rng.choice(TRICKY) for _ in range(rng.randrange(6)))

    def value(depth: int) -> Any:
        kind = rng.randrange(7 if depth < 3 else 4)
        if kind == 0:
            return text()
        if kind == 1:
            return rng.choice([0, -1, 7, 2**63, -(10**30)])
        if kind == 2:
            return rng.choice([True, False, None])
        if kind == 3:
            return {}
        if kind in (4, 5):
            return {text(): value(depth + 1) for _ in range(rng.randrange(4))}
        return [value(depth + 1) for _ in range(rng.randrange(4))]

    def maybe(make: Callable[[], Any]) -> Any:
        return make() if rng.random() < 0.5 else None

    def mig() -> dict[str, Any]:
        ids = {"gpuInstanceId": maybe(lambda: 3), "computeInstanceId": maybe(lambda: 0)}
        return {"parentUUID": text(), "profile": text(), "profileId": 19, "placementStart": 0,
                "placementSize": 1, **ids, "uuid": maybe(text)}  # fmt: skip

    devices = []
    for _ in range(rng.randrange(4)):
        dev: dict[str, Any] = {
            "requestNames": [text() for _ in range(rng.randrange(3))],
            "poolName": text(),
            "deviceName": text(),
            "cdiDeviceIds": [text()],
        }
        optional = {
            "shareId": maybe(text),
            "adminAccess": rng.random() < 0.5,
            "config": {text(): value(0) for _ in range(rng.randrange(3))},
            "consumedCapacity": {text(): text() for _ in range(rng.randrange(2))},
            "mpsDaemon": maybe(text),
            "mig": maybe(mig),
        }
        dev.update({k: v for k, v in optional.items() if rng.random() < 0.7})  # or defaults
        devices.append(dev)
    return {
        **({"version": 1} if rng.random() < 0.8 else {}),
        "uid": text(),
        "namespace": text(),
        "name": text(),
        "state": rng.choice(["PrepareStarted", "PrepareCompleted"]),
        "bootId": text(),
        "devices": devices,
        "cdiSpec": {text(): value(0) for _ in range(rng.randrange(4))},
    }


@pytest.mark.parametrize("seed", range(300))
def test_records_encode_to_the_bytes_the_pydantic_models_wrote(seed: int) -> None:
    data = full() if seed == 0 else random_record(random.Random(seed))
    new = checkpoint.ClaimRecord.from_json(copy.deepcopy(data), what="r")
    old = OldClaim.model_validate(data)
    assert new.encode() == old.model_dump_json().encode()
    assert new.encode(spec_json=checkpoint.encode_json(new.cdiSpec)) == new.encode()
    assert checkpoint.decode_record(new.encode(), what="r") == new


def test_files_the_pydantic_models_wrote_read_back_and_encode_the_same() -> None:
    record = checkpoint.decode_record(OLD_FILE, what="old.json")
    assert record.name == 'nön-ASCII ✓ 😀 "q" \\ \n\t\x00\x1f\x7f \u2028'
    assert record.devices[0].mig == checkpoint.MigRecord(
        parentUUID="GPU-7f3c", profile="1g.10gb", profileId=19, placementStart=6,
        placementSize=1, gpuInstanceId=13, computeInstanceId=0, uuid="MIG-0e4b",
    )  # fmt: skip
    assert record.devices[1].consumedCapacity == {"memory": "40Gi"}
    assert record.encode() == OLD_FILE
    started = checkpoint.decode_record(OLD_STARTED_FILE, what="u1.json")
    assert started.state == "PrepareStarted"
    assert dataclasses.replace(started, state="PrepareCompleted").encode() + b"\n" == (
        OLD_STARTED_FILE.replace(b'"PrepareStarted"  ', b'"PrepareCompleted"')
    )


def test_files_written_before_load_and_a_started_one_commits_in_place(tmp_path: Path) -> None:
    (tmp_path / "claims").mkdir()
    (tmp_path / "claims/5c2b0c56-3a8e-4d7e-9f7a-0b1c2d3e4f50.json").write_bytes(OLD_FILE)
    store = checkpoint.Checkpoint(directory=tmp_path, boot_id="b1", log=logs.get("test"))
    assert [r.encode() for r in store.load().records] == [OLD_FILE]
    started = checkpoint.decode_record(OLD_STARTED_FILE, what="u1.json")
    store.put(started)
    path = tmp_path / "claims/u1.json"
    assert path.read_bytes() == OLD_STARTED_FILE  # the same padded bytes as before
    inode = path.stat().st_ino
    store.put(dataclasses.replace(started, state="PrepareCompleted"))
    assert path.stat().st_ino == inode
    assert path.read_bytes() == OLD_STARTED_FILE.replace(
        b'"PrepareStarted"  ', b'"PrepareCompleted"'
    )


def test_a_missing_version_is_the_first_as_it_always_was() -> None:
    data = full()
    del data["version"]
    assert checkpoint.ClaimRecord.from_json(data, what="r").version == 1


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """A change to a record's JSON: ``value`` at ``path`` (dots and [i]); ``...`` deletes."""

    def change(data: dict[str, Any]) -> None:
        *parents, last = path.replace("[", ".").replace("]", "").split(".")
        target: Any = data
        for key in parents:
            target = target[int(key)] if isinstance(target, list) else target[key]
        key: Any = int(last) if isinstance(target, list) else last
        if value is ...:
            del target[key]
        else:
            target[key] = value

    return change


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (_set("extra", 1), "field extra: unknown field"),
        (_set("uid", ...), "field uid: missing"),
        (_set("version", 2), "field version: expected 1, got 2"),
        (_set("version", True), "field version: expected 1, got True"),
        (_set("version", "1"), "field version: expected 1, got '1'"),
        (
            _set("state", "Prepared"),
            "field state: expected 'PrepareStarted' or 'PrepareCompleted', got 'Prepared'",
        ),
        (_set("uid", 5), "field uid: expected a string, got an integer"),
        (_set("bootId", None), "field bootId: expected a string, got null"),
        (_set("devices", {}), "field devices: expected an array of devices, got an object"),
        (_set("devices[0]", 1), "field devices[0]: expected an object, got an integer"),
        (_set("devices[0].deviceName", ...), "field devices[0].deviceName: missing"),
        (_set("devices[0].typo", 1), "field devices[0].typo: unknown field"),
        (
            _set("devices[0].adminAccess", 1),
            "field devices[0].adminAccess: expected a boolean, got an integer",
        ),
        (
            _set("devices[0].requestNames", "gpu"),
            "field devices[0].requestNames: expected an array of strings, got a string",
        ),
        (
            _set("devices[0].requestNames[1]", 1),
            "field devices[0].requestNames[1]: expected a string, got an integer",
        ),
        (
            _set("devices[0].config", []),
            "field devices[0].config: expected an object, got an array",
        ),
        (
            _set("devices[0].consumedCapacity.memory", 10),
            "field devices[0].consumedCapacity['memory']: expected a string, got an integer",
        ),
        (_set("devices[0].mig", "MIG-1"), "field devices[0].mig: expected an object, got a string"),
        (
            _set("devices[0].mig.profileId", True),
            "field devices[0].mig.profileId: expected an integer, got a boolean",
        ),
        (
            _set("devices[0].mig.profileId", "19"),
            "field devices[0].mig.profileId: expected an integer, got a string",
        ),
        (
            _set("devices[0].mig.gpuInstanceId", 13.0),
            "field devices[0].mig.gpuInstanceId: expected an integer, got a number",
        ),
        (_set("devices[0].mig.uuid", ...), None),  # optional: its default
        (_set("cdiSpec", None), "field cdiSpec: expected an object, got null"),
    ],
)
def test_decoding_is_strict_and_names_the_file_the_field_and_the_reason(
    change: Callable[[dict[str, Any]], None], reason: str | None
) -> None:
    data = full()
    change(data)
    if reason is None:
        checkpoint.ClaimRecord.from_json(data, what="u1.json")
        return
    with pytest.raises(checkpoint.RecordError) as err:
        checkpoint.ClaimRecord.from_json(data, what="u1.json")
    assert str(err.value) == f"u1.json: {reason}"
    assert isinstance(err.value, ValueError)  # what every reader of records catches


@pytest.mark.parametrize("value", [[], "x", None, 1])
def test_a_document_that_is_no_record_is_an_error(value: Any) -> None:
    with pytest.raises(checkpoint.RecordError, match=r"^f\.json: expected a record \(an object\)"):
        checkpoint.decode_record(json.dumps(value).encode(), what="f.json")


def test_a_record_with_a_wrong_type_is_moved_aside_naming_the_field(tmp_path: Path) -> None:
    data = full()
    data["devices"][0]["mig"]["profileId"] = True
    (tmp_path / "claims").mkdir()
    (tmp_path / "claims/u1.json").write_text(json.dumps(data))
    store = checkpoint.Checkpoint(directory=tmp_path, boot_id="b1", log=logs.get("test"))
    with structlog.testing.capture_logs() as logged:
        report = store.load()
    assert report.records == [] and report.unreadable == [tmp_path / "claims/u1.json"]
    (line,) = [e for e in logged if e["log_level"] == "error"]
    assert line["reason"] == (
        "u1.json: field devices[0].mig.profileId: expected an integer, got a boolean"
    )
    assert Path(line["moved_to"]).read_text() == json.dumps(data)


def test_floats_no_record_holds_still_read_back_as_written() -> None:
    data = full()
    data["cdiSpec"]["x"] = [0.1, 1e-05, 1e20, -0.0]
    record = checkpoint.ClaimRecord.from_json(data, what="r")
    assert checkpoint.decode_record(record.encode(), what="r") == record


def test_loading_the_checkpoint_loads_no_pydantic() -> None:
    code = "import sys, dra_driver.driver.checkpoint\nprint([m for m in sys.modules if 'pyd' in m])"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert done.stdout.strip() == "[]"
