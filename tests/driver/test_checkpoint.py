"""The checkpoint on disk: atomic per-claim records, boot ID, corrupted files moved aside."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest
import structlog

from dra_driver import logs
from dra_driver.driver import atomicfile, checkpoint


def record(uid: str, boot: str = "b1", state: str = "PrepareCompleted") -> checkpoint.ClaimRecord:
    return checkpoint.ClaimRecord.from_json(
        {
            "uid": uid,
            "namespace": "ns",
            "name": "c",
            "state": state,
            "bootId": boot,
            "devices": [
                {
                    "requestNames": ["gpu"],
                    "poolName": "n1",
                    "deviceName": "gpu-0",
                    "cdiDeviceIds": ["k8s.gpu.nvidia.com/claim=x-gpu-0"],
                }
            ],
            "cdiSpec": {"cdiVersion": "0.3.0"},
        },
        what="test record",
    )


def plain(r: checkpoint.ClaimRecord) -> dict[str, Any]:
    """The record as the JSON a file holds, decoded."""
    decoded: dict[str, Any] = json.loads(r.encode())
    return decoded


def store(tmp_path: Path, boot: str = "b1") -> checkpoint.Checkpoint:
    return checkpoint.Checkpoint(directory=tmp_path, boot_id=boot, log=logs.get("test"))


def test_put_load_delete_round_trip(tmp_path: Path) -> None:
    s = store(tmp_path)
    s.load()
    s.put(record("u1"))
    s.put(record("u2", state="PrepareStarted"))
    on_disk = json.loads((tmp_path / "claims/u1.json").read_text())
    assert on_disk["version"] == 1 and on_disk["bootId"] == "b1"
    again = store(tmp_path)
    report = again.load()
    assert sorted(r.uid for r in report.records) == ["u1", "u2"]
    assert again.get("u1") == record("u1")
    again.delete("u1")
    again.delete("u1")  # idempotent
    assert [r.uid for r in store(tmp_path).load().records] == ["u2"]
    assert not list((tmp_path / "claims").glob(".tmp-*"))


def test_records_of_an_earlier_boot_are_discarded(tmp_path: Path) -> None:
    s = store(tmp_path, "old-boot")
    s.load()
    s.put(record("u1", boot="old-boot"))
    s.put(record("u2", boot="old-boot", state="PrepareStarted"))
    (tmp_path / "claims/u3.json").write_bytes(b"\0\0torn by a power loss")
    report = store(tmp_path, "new-boot").load()
    assert report.records == [] and report.moved_aside == []
    assert sorted(report.other_boot) == ["u1", "u2", "u3"]
    assert list((tmp_path / "claims").iterdir()) == []
    meta = json.loads((tmp_path / "checkpoint.json").read_text())
    assert meta == {"version": 1, "kind": "GpuDraClaimCheckpoint", "bootId": "new-boot"}


def test_without_the_boot_marker_each_record_says_which_boot(tmp_path: Path) -> None:
    old = store(tmp_path, "old-boot")
    old.load()
    old.put(record("u1", boot="old-boot"))
    (tmp_path / "claims/u2.json").write_text(json.dumps(plain(record("u2", boot="new-boot"))))
    (tmp_path / "checkpoint.json").unlink()
    report = store(tmp_path, "new-boot").load()
    assert [r.uid for r in report.records] == ["u2"] and report.other_boot == ["u1"]


@pytest.mark.parametrize("meta", [b"{torn", b'{"version": 7, "kind": "GpuDraClaimCheckpoint"}'])
def test_unknown_boot_marker_is_moved_aside_and_records_still_load(
    tmp_path: Path, meta: bytes
) -> None:
    s = store(tmp_path)
    s.load()
    s.put(record("u1"))
    (tmp_path / "checkpoint.json").write_bytes(meta)
    with structlog.testing.capture_logs() as logged:
        report = store(tmp_path).load()
    assert [r.uid for r in report.records] == ["u1"]
    assert [p.read_bytes() for p in report.moved_aside] == [meta]
    assert any(e["log_level"] == "error" for e in logged)


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"",
        json.dumps({**plain(record("u1")), "version": 2}).encode(),
        json.dumps({**plain(record("u1")), "extra": 1}).encode(),
        json.dumps(plain(record("someone-else"))).encode(),
    ],
    ids=["garbage", "empty", "future-version", "unknown-field", "wrong-file-name"],
)
def test_corrupted_or_unknown_files_are_moved_aside_loudly(tmp_path: Path, content: bytes) -> None:
    s = store(tmp_path)
    s.load()
    s.put(record("good"))
    (tmp_path / "claims/u1.json").write_bytes(content)
    (tmp_path / "claims/.tmp-u9.json.abcd").write_text("half written")
    with structlog.testing.capture_logs() as logged:
        report = store(tmp_path).load()
    assert [r.uid for r in report.records] == ["good"]
    assert len(report.moved_aside) == 1
    aside = report.moved_aside[0]
    assert aside.parent == tmp_path / "claims-aside" and aside.read_bytes() == content
    assert not (tmp_path / "claims/u1.json").exists()
    assert not (tmp_path / "claims/.tmp-u9.json.abcd").exists()
    (line,) = [e for e in logged if e["log_level"] == "error"]
    assert "moved aside" in line["event"] and line["file"].endswith("u1.json")


def test_uid_validation_and_boot_id(tmp_path: Path) -> None:
    assert checkpoint.valid_uid("0b5e2c1a-77aa-4c1e-9d9e-2b7b1c9f0a11")
    for bad in ("", "../x", "a/b", "-a", "x" * 200):
        assert not checkpoint.valid_uid(bad)
    (tmp_path / "boot").write_text("abc\n")
    assert checkpoint.read_boot_id(tmp_path / "boot") == "abc"
    assert checkpoint.read_boot_id(tmp_path / "missing") == "unknown"
    with pytest.raises(checkpoint.CheckpointError):
        store(tmp_path).put(record("u1", boot="other"))


@pytest.mark.parametrize(
    ("boot", "syncs_wanted"),
    [
        # Boot scoping discards every record after a power loss: nothing to sync (issue 46).
        ("b1", 0),
        # Every boot looks the same: the file, then its directory (the name was never synced).
        (checkpoint.UNKNOWN_BOOT, 2),
    ],
)
def test_completion_flips_the_started_record_in_place_durably_only_without_a_boot_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, boot: str, syncs_wanted: int
) -> None:
    s = store(tmp_path, boot)
    assert s.durable is (boot == checkpoint.UNKNOWN_BOOT)
    s.load()
    started = record("u1", boot, state="PrepareStarted")
    s.put(started)
    path = tmp_path / "claims/u1.json"
    on_disk = json.loads(path.read_bytes())  # padded, but valid JSON
    assert on_disk["state"] == "PrepareStarted"
    assert checkpoint.ClaimRecord.from_json(on_disk, what="u1.json") == started
    inode = path.stat().st_ino
    syncs: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (syncs.append(fd), real_fsync(fd))[1])
    want = record("u1", boot)
    s.put(want)
    assert path.stat().st_ino == inode  # no new file: the state bytes were overwritten
    assert len(syncs) == syncs_wanted
    assert path.read_bytes() == want.encode() + b"\n"  # exactly a fresh record's bytes
    assert [r.state for r in store(tmp_path, boot).load().records] == ["PrepareCompleted"]


@pytest.mark.parametrize(("boot", "syncs_wanted"), [("b1", 0), (checkpoint.UNKNOWN_BOOT, 2)])
def test_a_whole_record_write_syncs_only_without_a_boot_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, boot: str, syncs_wanted: int
) -> None:
    s = store(tmp_path, boot)
    s.load()
    s.put(record("u1", boot, state="PrepareStarted"))
    syncs: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (syncs.append(fd), real_fsync(fd))[1])
    other = dataclasses.replace(record("u1", boot), name="renamed")  # not a flip in place
    s.put(other)
    assert len(syncs) == syncs_wanted  # the temporary file, then the directory after the rename
    assert store(tmp_path, boot).load().records == [other]


def test_a_completed_record_that_differs_replaces_the_file_whole(tmp_path: Path) -> None:
    s = store(tmp_path)
    s.load()
    s.put(record("u1", state="PrepareStarted"))
    inode = (tmp_path / "claims/u1.json").stat().st_ino
    other = dataclasses.replace(record("u1"), name="renamed")
    s.put(other)
    assert (tmp_path / "claims/u1.json").stat().st_ino != inode
    assert store(tmp_path).load().records == [other]
    s.put(record("u2", state="PrepareStarted"))
    s.delete("u2")  # rolled back in between: the completion writes a whole new file
    s.put(record("u2"))
    s.put(record("u3", state="PrepareStarted"))
    (tmp_path / "claims/u3.json").unlink()  # removed behind its back: never a lost commit
    s.put(record("u3"))
    assert sorted(r.uid for r in store(tmp_path).load().records) == ["u1", "u2", "u3"]


def test_a_file_failing_without_a_message_is_moved_aside_naming_the_error_type(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = store(tmp_path)
    s.load()
    s.put(record("u1"))
    real_read = checkpoint.read_file

    def silent(path: Path) -> bytes:
        if path.name == "u1.json":
            raise ValueError()  # an error with no text of its own
        return real_read(path)

    monkeypatch.setattr(checkpoint, "read_file", silent)
    with structlog.testing.capture_logs() as logged:
        report = store(tmp_path).load()
    assert report.records == [] and len(report.moved_aside) == 1
    [line] = [e for e in logged if e["log_level"] == "error"]
    assert line["reason"] == "ValueError" and line["moved_to"] == str(report.moved_aside[0])


def test_an_oversized_file_is_refused_even_when_reads_come_back_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_read = os.read
    monkeypatch.setattr(os, "read", lambda fd, n: real_read(fd, min(n, 1 << 20)))
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (checkpoint.MAX_FILE_BYTES + 10))
    assert len(checkpoint.read_file(big)) == checkpoint.MAX_FILE_BYTES + 1  # enough to refuse
    exact = tmp_path / "exact.json"
    exact.write_bytes(b" " * checkpoint.MAX_FILE_BYTES)
    assert len(checkpoint.read_file(exact)) == checkpoint.MAX_FILE_BYTES


def test_records_of_another_boot_are_removed_without_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = store(tmp_path)
    s.load()
    s.put(record("u1"))
    s.put(record("u2"))
    (tmp_path / "claims/u3.json").write_bytes(record("u3", boot="b0").encode())
    removed: list[tuple[str, bool]] = []
    real_remove = atomicfile.remove

    def remove(path: object, *, durable: bool = True) -> bool:
        removed.append((Path(str(path)).name, durable))
        return real_remove(path, durable=durable)  # type: ignore[arg-type]

    monkeypatch.setattr(atomicfile, "remove", remove)
    report = store(tmp_path).load()  # same boot: u3 is dropped by its record's boot id
    assert [r.uid for r in report.records] == ["u1", "u2"] and report.other_boot == ["u3"]
    report = store(tmp_path, "new-boot").load()  # a new boot: dropped by name, unread
    assert report.other_boot == ["u1", "u2"]
    assert removed == [("u3.json", False), ("u1.json", False), ("u2.json", False)]


def test_an_unreadable_boot_id_is_said_at_load_and_makes_commits_durable(tmp_path: Path) -> None:
    with structlog.testing.capture_logs() as logged:
        store(tmp_path, checkpoint.UNKNOWN_BOOT).load()
        store(tmp_path / "other", "b1").load()
    [line] = [e for e in logged if e["log_level"] == "warning"]
    assert "boot ID cannot be read" in line["event"] and line["durable"] is True
    assert line["checkpoint"] == str(tmp_path)
    assert checkpoint.read_boot_id(tmp_path / "missing") == checkpoint.UNKNOWN_BOOT
