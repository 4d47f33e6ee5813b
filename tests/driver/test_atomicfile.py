"""Atomic writes (named temporary + rename; unnamed file + link only for create_open) and the
group-committed directory sync, on real files."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.driver import atomicfile


@pytest.fixture(params=["unnamed", "named"])
def how(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """create_open's two ways: O_TMPFILE + link where supported, and the portable fallback
    (write_bytes must behave the same, always named, whichever is available)."""
    if request.param == "named":
        monkeypatch.setitem(atomicfile._unnamed, "supported", False)
    elif not atomicfile._unnamed["supported"]:
        pytest.skip("this filesystem/kernel has no O_TMPFILE")  # the other param still runs
    yield request.param


def calls(monkeypatch: pytest.MonkeyPatch, *names: str) -> list[str]:
    seen: list[str] = []
    for name in names:
        real = getattr(os, name)

        def spy(*args: object, _real: object = real, _name: str = name, **kw: object) -> object:
            seen.append(_name)
            return _real(*args, **kw)  # type: ignore[operator]

        monkeypatch.setattr(os, name, spy)
    return seen


@pytest.mark.parametrize("durable", [False, True])
def test_new_and_replaced_files_have_exactly_the_content(
    tmp_path: Path, how: str, durable: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "a.json"
    seen = calls(monkeypatch, "link", "replace", "fsync")
    atomicfile.write_bytes(target, b"one\n", durable=durable, mode=0o600)
    assert target.read_bytes() == b"one\n"
    assert target.stat().st_mode & 0o777 == 0o600
    # Always a named temporary renamed into place (never a link: watchers need the rename).
    assert seen == (["fsync", "replace", "fsync"] if durable else ["replace"])
    seen.clear()
    atomicfile.write_bytes(target, b"two\n", durable=durable)
    assert target.read_bytes() == b"two\n"
    assert seen.count("replace") == 1 and seen.count("fsync") == 2 * durable
    atomicfile.write_json(target, {"k": [1, 2]})
    assert target.read_text() == '{"k":[1,2]}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]  # no temporaries left
    assert atomicfile.remove(target, durable=durable) and not atomicfile.remove(target)


def test_a_failed_write_leaves_the_old_file_and_no_temporary(
    tmp_path: Path, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "a.json"
    target.write_bytes(b"old")

    def broken(*args: object, **kw: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError, match="No space"):
        atomicfile.write_bytes(target, b"new", durable=False)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]
    with pytest.raises(FileNotFoundError):
        atomicfile.write_bytes(tmp_path / "missing-dir" / "x", b"x")


def test_stale_named_temporaries_are_swept_by_prefix(tmp_path: Path) -> None:
    (tmp_path / ".tmp-ours_1.json.ab12").write_text("half")
    (tmp_path / ".tmp-theirs.json.cd34").write_text("half")
    removed = atomicfile.remove_stale_temporaries(tmp_path, target_prefix="ours_")
    assert [p.name for p in removed] == [".tmp-ours_1.json.ab12"]
    assert [p.name for p in tmp_path.iterdir()] == [".tmp-theirs.json.cd34"]


def test_directory_sync_is_shared_by_concurrent_committers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.fsync

    def slow_fsync(fd: int) -> None:
        time.sleep(0.05)  # a slow disk: everyone arriving meanwhile joins the next sync
        real(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    group = atomicfile.DirSync(tmp_path)
    group.sync()
    assert group.syncs == 1  # alone: exactly one sync each time
    group.sync()
    assert group.syncs == 2
    threads = [
        threading.Thread(
            target=atomicfile.write_bytes,
            args=(tmp_path / f"{i}", b"x"),
            kwargs={"dir_sync": group},
        )
        for i in range(16)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(int(p.name) for p in tmp_path.iterdir()) == list(range(16))
    assert 3 <= group.syncs <= 5  # 16 durable writes, at most three more syncs


def test_a_write_after_a_sync_began_gets_its_own_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other direction of the group-commit rule: never skip a sync a write still needs."""
    group = atomicfile.DirSync(tmp_path)
    results: list[int] = []
    release = threading.Event()
    entered = threading.Event()
    real = os.fsync

    def held(fd: int) -> None:
        entered.set()
        release.wait(5)
        real(fd)

    monkeypatch.setattr(os, "fsync", held)
    first = threading.Thread(target=lambda: (group.sync(), results.append(1)))
    first.start()
    assert entered.wait(5)
    second = threading.Thread(target=lambda: (group.sync(), results.append(2)))
    second.start()
    time.sleep(0.05)
    assert results == []  # the second waits: the running sync may predate its write
    release.set()
    first.join(5)
    second.join(5)
    assert sorted(results) == [1, 2] and group.syncs == 2


def test_create_open_gives_a_descriptor_for_updates_in_place(tmp_path: Path, how: str) -> None:
    target = tmp_path / "r.json"
    fd = atomicfile.create_open(target, b'{"state":"A"}\n')
    try:
        assert target.read_bytes() == b'{"state":"A"}\n'
        os.pwrite(fd, b"B", 10)
    finally:
        os.close(fd)
    assert target.read_bytes() == b'{"state":"B"}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_create_open_links_an_unnamed_file_where_it_can_with_the_mode_asked(
    tmp_path: Path, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = calls(monkeypatch, "link", "replace")
    target = tmp_path / "r.json"
    os.close(atomicfile.create_open(target, b"{}\n", mode=0o600))
    assert target.read_bytes() == b"{}\n" and target.stat().st_mode & 0o777 == 0o600
    # O_TMPFILE: one link, no temporary name; the portable way: a named file renamed.
    assert seen == (["link"] if how == "unnamed" else ["replace"])


def test_a_temporary_already_gone_does_not_hide_the_write_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def vanished(src: str, dst: str) -> None:
        os.unlink(src)  # e.g. swept by another instance's start-up
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", vanished)
    with pytest.raises(OSError, match="No space"):
        atomicfile.write_bytes(tmp_path / "a.json", b"new", durable=False)
    assert list(tmp_path.iterdir()) == []


def test_short_writes_are_continued_until_everything_is_written(
    tmp_path: Path, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data[:3])))
    atomicfile.write_bytes(tmp_path / "a.json", b"0123456789", durable=False)
    assert (tmp_path / "a.json").read_bytes() == b"0123456789"
    os.close(atomicfile.create_open(tmp_path / "b.json", b"abcdefgh"))
    assert (tmp_path / "b.json").read_bytes() == b"abcdefgh"
