"""Recycled checkpoint record files: unprepare leaves a spare, the next prepare reuses its inode."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from dra_driver import logs
from dra_driver.driver import checkpoint


def record(uid: str, state: str = "PrepareCompleted", pad: int = 0) -> checkpoint.ClaimRecord:
    return checkpoint.ClaimRecord.from_json(
        {
            "uid": uid,
            "namespace": "ns",
            "name": "c" + "x" * pad,
            "state": state,
            "bootId": "b1",
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


def store(tmp_path: Path) -> checkpoint.Checkpoint:
    s = checkpoint.Checkpoint(directory=tmp_path, boot_id="b1", log=logs.get("test"))
    s.load()
    return s


def prepare(s: checkpoint.Checkpoint, uid: str, pad: int = 0) -> None:
    completed = record(uid, pad=pad)
    s.put(dataclasses.replace(completed, state=checkpoint.PREPARE_STARTED))
    s.put(completed)


def spares(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "claims").glob(f"{checkpoint.SPARE_PREFIX}*"))


def test_an_unprepared_claims_file_is_reused_for_the_next_claim(tmp_path: Path) -> None:
    s = store(tmp_path)
    prepare(s, "u1", pad=500)  # a long record...
    inode = (tmp_path / "claims/u1.json").stat().st_ino
    s.delete("u1")
    assert not (tmp_path / "claims/u1.json").exists()
    (spare,) = spares(tmp_path)
    assert spare.stat().st_ino == inode
    assert s.get("u1") is None
    prepare(s, "u2")  # ...and a short one in its file: no new inode, no stale tail
    path = tmp_path / "claims/u2.json"
    assert path.stat().st_ino == inode
    assert not spares(tmp_path)
    assert path.read_bytes() == record("u2").encode() + b"\n"
    assert [r.uid for r in store(tmp_path).load().records] == ["u2"]


def test_spares_are_capped_and_removed_at_start_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoint, "MAX_SPARES", 2)
    s = store(tmp_path)
    for uid in ("u1", "u2", "u3"):
        prepare(s, uid)
    for uid in ("u1", "u2", "u3"):
        s.delete(uid)
    assert len(spares(tmp_path)) == 2  # the third file was unlinked
    assert not list((tmp_path / "claims").glob("*.json"))
    again = store(tmp_path)  # a restart: spares are never records, and all go
    assert again.records() == []
    assert not spares(tmp_path)


def test_a_spare_removed_behind_our_back_is_skipped(tmp_path: Path) -> None:
    s = store(tmp_path)
    prepare(s, "u1")
    prepare(s, "u2")
    kept, gone = ((tmp_path / f"claims/{u}.json").stat().st_ino for u in ("u1", "u2"))
    s.delete("u1")
    s.delete("u2")  # the spare the next prepare takes first...
    (taken,) = [p for p in spares(tmp_path) if p.stat().st_ino == gone]
    taken.unlink()  # ...is removed, e.g. by another plugin instance's start-up
    prepare(s, "u3")
    assert (tmp_path / "claims/u3.json").stat().st_ino == kept
    prepare(s, "u4")  # no spare left: a new file
    assert sorted(p.name for p in (tmp_path / "claims").glob("*.json")) == ["u3.json", "u4.json"]
    assert [r.state for r in store(tmp_path).load().records] == ["PrepareCompleted"] * 2


def test_a_failed_started_write_leaves_no_file_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = store(tmp_path)
    prepare(s, "u1")
    s.delete("u1")

    def refuse(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "rename", refuse)
    with pytest.raises(checkpoint.CheckpointError, match=r"claim u2: .*No space left"):
        s.put(record("u2", state=checkpoint.PREPARE_STARTED))
    monkeypatch.undo()
    assert list((tmp_path / "claims").iterdir()) == []
    assert s.get("u2") is None
