"""Checkpoint fault paths: a failed write is never indexed as written, no file descriptor
outlives the record it was opened for, and several bad files are all moved aside."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from dra_driver.driver import atomicfile, checkpoint

from .test_checkpoint import record, store


def record_fds(claims: Path) -> list[str]:
    """Descriptors this process holds on files inside ``claims`` (the directory itself, kept
    open on purpose for group-committed fsyncs, does not count)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the listing's own descriptor, closed by now
        if target.startswith(f"{claims}/"):
            found.append(target)
    return found


def test_a_failed_started_write_raises_and_is_not_indexed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = store(tmp_path)
    s.load()

    def fail(*_: object, **__: object) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(s, "_write_started", fail)  # where the Started record reaches disk
    with pytest.raises(checkpoint.CheckpointError, match=r"claim u1: .*No space left"):
        s.put(record("u1", state="PrepareStarted"))
    assert s.get("u1") is None and s.records() == []


def test_a_failed_completed_write_raises_and_keeps_the_old_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = store(tmp_path)
    s.load()
    s.put(record("u1", state="PrepareStarted"))
    s.delete("u1")  # no Started record left to commit in place: the whole file is written
    calls: list[str] = []

    def fail(path: str, *_: object, **__: object) -> None:
        calls.append(str(path))
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(atomicfile, "write_bytes", fail)
    with pytest.raises(checkpoint.CheckpointError, match="Input/output error"):
        s.put(record("u1"))
    assert calls == [str(tmp_path / "claims/u1.json")]
    assert s.get("u1") is None
    assert not (tmp_path / "claims/u1.json").exists()


def test_no_descriptor_outlives_its_record(tmp_path: Path) -> None:
    s = store(tmp_path)
    s.load()
    claims = tmp_path / "claims"
    s.put(record("u1", state="PrepareStarted"))
    assert len(record_fds(claims)) == 1  # held open for the commit in place
    s.put(record("u1"))  # committed in place: closed
    assert record_fds(claims) == []
    s.put(record("u2", state="PrepareStarted"))
    s.put(record("u2", state="PrepareStarted"))  # written again: the first one is closed
    assert len(record_fds(claims)) == 1
    s.delete("u2")  # rolled back: closed
    assert record_fds(claims) == []
    s.put(record("u3", state="PrepareStarted"))
    s.put(dataclasses.replace(record("u3"), name="renamed"))  # not in place: still closed
    assert record_fds(claims) == []
    s.put(record("u4", state="PrepareStarted"))
    (claims / "u4.json").unlink()
    s.put(record("u4"))  # removed behind its back: written whole, descriptor closed
    assert record_fds(claims) == []


def test_every_bad_file_is_moved_aside(tmp_path: Path) -> None:
    s = store(tmp_path)
    s.load()
    s.put(record("good"))
    claims = tmp_path / "claims"
    for name in ("a", "b", "c"):
        (claims / f"{name}.json").write_bytes(b"{not json")
    (tmp_path / "checkpoint.json").write_bytes(b"[]")  # an unknown marker, moved aside too
    report = store(tmp_path).load()
    assert [r.uid for r in report.records] == ["good"]
    assert len(report.moved_aside) == 4
    aside = sorted(p.name.split(".json", 1)[0] for p in (tmp_path / "claims-aside").iterdir())
    assert aside == ["a", "b", "c", "checkpoint"]
    assert sorted(p.name for p in claims.iterdir()) == ["good.json"]
