"""Two instances on one node: file locks between real processes, a checkpoint read from disk,
ownership that forgets claims the other instance released."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from dra_driver import logs
from dra_driver.driver import checkpoint, claims, instances, state

from .test_checkpoint import record

Holder = Callable[[str], "subprocess.Popen[str]"]
HOLDER = """
import sys
from pathlib import Path
from dra_driver.driver import instances
locks = instances.ClaimFileLocks(directory=Path(sys.argv[1]))
with (locks.exclusive() if sys.argv[2] == "*" else locks.hold(sys.argv[2])):
    print("locked", flush=True)
    sys.stdin.read()
"""


@pytest.fixture
def hold_elsewhere(tmp_path: Path) -> Iterator[Holder]:
    """Start a process holding a lock; returns a function to call with the claim uid."""
    procs: list[subprocess.Popen[str]] = []

    def start(uid: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(tmp_path / "locks"), uid],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None and proc.stdout.readline() == "locked\n"
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def acquire_in_thread(enter: Callable[[], AbstractContextManager[object]]) -> threading.Event:
    got = threading.Event()

    def run() -> None:
        with enter():
            got.set()

    threading.Thread(target=run, daemon=True).start()
    return got


def release(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(10)


def test_a_claim_lock_held_by_another_process_blocks_only_that_claim(
    tmp_path: Path, hold_elsewhere: Holder
) -> None:
    locks = instances.ClaimFileLocks(directory=tmp_path / "locks")
    other = hold_elsewhere("uid-a")
    with locks.hold("uid-b"):  # another claim: no waiting
        assert locks.holds("uid-b") and not locks.holds("uid-a")
    got = acquire_in_thread(lambda: locks.hold("uid-a"))
    assert not got.wait(0.3)
    release(other)
    assert got.wait(5)
    time.sleep(0.05)
    assert list((tmp_path / "locks").glob("uid-*.lock")) == []  # removed after use


def test_recovery_waits_for_claims_in_progress_elsewhere_and_holds_them_off(
    tmp_path: Path, hold_elsewhere: Holder
) -> None:
    locks = instances.ClaimFileLocks(directory=tmp_path / "locks")
    other = hold_elsewhere("uid-a")
    got = acquire_in_thread(locks.exclusive)
    assert not got.wait(0.3)
    release(other)
    assert got.wait(5)
    recovering = hold_elsewhere("*")
    got = acquire_in_thread(lambda: locks.hold("uid-c"))
    assert not got.wait(0.3)
    release(recovering)
    assert got.wait(5)


def test_many_threads_take_turns_on_one_claim(tmp_path: Path) -> None:
    locks = instances.ClaimFileLocks(directory=tmp_path / "locks")
    inside, most = [0], [0]
    guard = threading.Lock()

    def work() -> None:
        for _ in range(20):
            with locks.hold("uid-a"):
                with guard:
                    inside[0] += 1
                    most[0] = max(most[0], inside[0])
                time.sleep(0.0005)
                with guard:
                    inside[0] -= 1

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert most[0] == 1


def test_bad_uid_and_unusable_directory_are_clear_errors(tmp_path: Path) -> None:
    bad_uid = instances.ClaimFileLocks(directory=tmp_path).hold("../escape")
    with pytest.raises(instances.LockError, match="not a valid claim uid"), bad_uid:
        pass
    (tmp_path / "file").write_text("")
    no_dir = instances.ClaimFileLocks(directory=tmp_path / "file" / "locks").hold("uid-a")
    with pytest.raises(instances.LockError, match="cannot open lock file"), no_dir:
        pass


def test_shared_checkpoint_reads_what_the_other_instance_wrote(tmp_path: Path) -> None:
    log = logs.get("test")
    mine = instances.SharedCheckpoint(directory=tmp_path, boot_id="b1", log=log)
    theirs = checkpoint.Checkpoint(directory=tmp_path, boot_id="b1", log=log)
    mine.load()
    theirs.load()
    assert mine.get("u1") is None
    theirs.put(record("u1"))
    assert mine.get("u1") == record("u1")
    assert [r.uid for r in mine.records()] == ["u1"]
    theirs.delete("u1")
    assert mine.get("u1") is None and mine.records() == []

    theirs.put(record("u2"))
    mine.path("u3").write_text("{torn")
    with pytest.raises(checkpoint.CheckpointError, match=r"u3\.json is unreadable"):
        mine.get("u3")
    assert [r.uid for r in mine.records()] == ["u2"]  # the bad file does not hide the others
    mine.path("u4").write_bytes(record("u4", boot="b0").encode())  # an earlier boot's
    assert mine.get("u4") is None


def test_shared_ownership_forgets_claims_released_elsewhere(tmp_path: Path) -> None:
    store = checkpoint.Checkpoint(directory=tmp_path, boot_id="b1", log=logs.get("test"))
    store.load()
    locks = instances.ClaimFileLocks(directory=tmp_path / "locks")
    owners = instances.SharedOwnership(store=store, locks=locks)
    gpu0 = [
        claims.AllocatedDevice(
            request="gpu", pool="n1", device="gpu-0", admin_access=False, share_id=None, configs=()
        )
    ]

    def ref(uid: str) -> claims.ClaimRef:
        return claims.ClaimRef(uid=uid, namespace="ns", name=uid)

    store.put(record("u1"))
    owners.reserve(ref("u1"), gpu0)
    with pytest.raises(state.DeviceBusy, match="u1"):  # u1 is still prepared (on disk)
        owners.reserve(ref("u2"), gpu0)
    store.delete("u1")  # the other instance unprepared it
    with locks.hold("u3"):
        owners.reserve(ref("u3"), gpu0)  # no record yet, but being prepared here: kept
    with pytest.raises(state.DeviceBusy, match="u3"), locks.hold("u3"):
        owners.reserve(ref("u2"), gpu0)


def test_shared_checkpoint_errors_name_the_file_and_the_reason(tmp_path: Path) -> None:
    mine = instances.SharedCheckpoint(directory=tmp_path, boot_id="b1", log=logs.get("test"))
    mine.load()
    odd = mine.path("u5")
    odd.mkdir()  # not a regular file
    with pytest.raises(checkpoint.CheckpointError) as err:
        mine.get("u5")
    assert str(err.value) == f"cannot read {odd}: not a regular file"
    big = mine.path("u6")
    big.write_bytes(b" " * (checkpoint.MAX_FILE_BYTES + 10))
    with pytest.raises(checkpoint.CheckpointError) as err:
        mine.get("u6")
    assert str(err.value) == (
        f"checkpoint file {big} is unreadable: {big} is {checkpoint.MAX_FILE_BYTES + 1} bytes, "
        f"more than the {checkpoint.MAX_FILE_BYTES} allowed"
    )
    wrong = mine.path("u7")
    wrong.write_text(json.dumps({**json.loads(record("u7").encode()), "bootId": 7}))
    with pytest.raises(checkpoint.CheckpointError) as err:
        mine.get("u7")
    assert str(err.value) == (
        f"checkpoint file {wrong} is unreadable: {wrong}: field bootId: expected a string, got "
        "an integer"
    )
