"""Claim status writes wait for claims in progress (issue 37), but never for long.

Why: each status apply costs the API server about what a claim GET does; applied in the middle
of a burst of prepares, they made every prepare of the burst wait longer for its own GET. The
writer now holds its writes while any prepare or unprepare of this node runs, and until none has
run for ``settle_s`` (issue 46: a write slipped into the gap between two calls of a burst ran into
the next ones), for at most ``max_defer_s``.
"""

from __future__ import annotations

import os
import threading
import time

from dra_driver.testing import polling

from .conftest import Node, claim_obj, new_uid

APPLY = "apply_resource_claim_status"


def _applies(node: Node) -> list[str]:
    return [c.name for c in node.api.calls if c.method == APPLY]


def test_no_status_write_while_a_claim_is_in_progress(node: Node) -> None:
    status = node.driver.status
    assert status is not None
    status.max_defer_s = 600.0  # never forced out during this test
    ref = node.add(claim_obj(name="first", uid=new_uid(), devices=["gpu-0"]))
    other_in_progress = status.busy()
    other_in_progress.__enter__()  # another claim's prepare, still running
    try:
        assert node.driver.prepare([ref])[ref.uid].error == ""
        # Queued, but held back: a write would have been made by now (it is due at once).
        assert status.pending() == 1
        time.sleep(0.3)
        assert _applies(node) == []
        assert status.pending() == 1
    finally:
        other_in_progress.__exit__(None, None, None)
    # The last claim in progress ended: the write goes out.
    polling.wait_for(lambda: _applies(node) == ["first"], what="the status write")
    assert polling.poll(lambda: status.pending() == 0)
    stored = node.api.get_resource_claim("default", "first")
    assert [d["device"] for d in stored["status"]["devices"]] == ["gpu-0"]


def test_no_status_write_in_the_gaps_between_the_calls_of_a_burst(node: Node) -> None:
    status = node.driver.status
    assert status is not None
    status.max_defer_s = 600.0
    status.settle_s = 1.0
    ref = node.add(claim_obj(name="gaps", uid=new_uid(), devices=["gpu-0"]))
    assert node.driver.prepare([ref])[ref.uid].error == ""
    started = time.monotonic()
    for _ in range(6):  # the rest of the burst: calls with short gaps between them
        with status.busy():
            time.sleep(0.02)
        time.sleep(0.05)  # a gap, shorter than settle_s: no write may go out in it
    assert time.monotonic() - started < 2.0, "too slow a machine for this test's timing"
    assert _applies(node) == []
    ended = time.monotonic()
    polling.wait_for(lambda: _applies(node) == ["gaps"], what="the status write after the burst")
    # Not before the claims had been quiet for settle_s (it may be later on a slow machine).
    assert time.monotonic() - ended >= 1.0 - 0.1
    assert polling.poll(lambda: status.pending() == 0)


def test_syncs_during_a_burst_wake_the_writer_only_when_it_has_something_new_to_wait_for(
    node: Node,
) -> None:
    """Each wake-up of the writer takes the interpreter from the burst's calls; while claims
    are in progress and a job is already due, the writer's wait already ends in time."""
    status = node.driver.status
    assert status is not None
    status.max_defer_s = 0.5
    wakes: list[str] = []
    notify = status._cond.notify

    def counting_notify(n: int = 1) -> None:
        wakes.append("notify")
        notify(n)

    status._cond.notify = counting_notify  # type: ignore[method-assign]
    refs = [
        node.add(claim_obj(name=f"b{i}", uid=new_uid(), devices=[f"gpu-{i}"])) for i in range(4)
    ]
    with status.busy():  # the burst's other claims
        for ref in refs:
            assert node.driver.prepare([ref])[ref.uid].error == ""
        assert wakes == ["notify"]  # the first job only: the writer had nothing to wait for
        # Held, each is still written by its deadline, with claims still in progress.
        polling.wait_for(
            lambda: sorted(_applies(node)) == ["b0", "b1", "b2", "b3"], what="the held writes"
        )
    assert polling.poll(lambda: status.pending() == 0)


def test_a_write_goes_out_once_the_claims_have_been_quiet_for_settle_s(node: Node) -> None:
    status = node.driver.status
    assert status is not None
    status.settle_s = 0.3
    ref = node.add(claim_obj(name="settled", uid=new_uid(), devices=["gpu-1"]))
    assert node.driver.prepare([ref])[ref.uid].error == ""
    ended = time.monotonic()  # its own prepare was the last claim in progress
    time.sleep(0.15)
    assert _applies(node) == []  # settling
    polling.wait_for(lambda: _applies(node) == ["settled"], what="the settled write")
    assert time.monotonic() - ended >= 0.3


def test_a_held_write_goes_out_after_max_defer_even_when_claims_never_stop(node: Node) -> None:
    status = node.driver.status
    assert status is not None
    status.max_defer_s = 0.2
    ref = node.add(claim_obj(name="busy", uid=new_uid(), devices=["gpu-1"]))
    stop = threading.Event()

    def claims_forever() -> None:  # a node that never stops preparing
        with status.busy():
            stop.wait(60)

    worker = threading.Thread(target=claims_forever)
    worker.start()
    try:
        polling.wait_for(lambda: status._in_progress > 0, what="a claim in progress")
        assert node.driver.prepare([ref])[ref.uid].error == ""
        polling.wait_for(lambda: _applies(node) == ["busy"], what="the deferred status write")
    finally:
        stop.set()
        worker.join()


def test_a_child_forked_while_another_thread_holds_the_writers_lock_can_still_sync(
    node: Node,
) -> None:
    """The crash-point tests fork children that prepare with the parent's driver: a lock held
    by another thread at the fork would block the child forever (once seen as a hung test)."""
    status = node.driver.status
    assert status is not None
    ref = node.add(claim_obj(name="forked", uid=new_uid(), devices=["gpu-0"]))
    held, release = threading.Event(), threading.Event()

    def hold() -> None:  # the writer thread (or any caller) inside the lock at the fork
        with status._cond:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(5)
    threading.Timer(0.2, release.set).start()  # the fork waits for the lock, then goes on
    pid = os.fork()
    if pid == 0:  # child: only this thread exists; the lock must be free for it
        status.sync(ref)
        os._exit(0 if status.pending() >= 1 else 1)
    holder.join(5)
    deadline = time.monotonic() + 10
    while (done := os.waitpid(pid, os.WNOHANG)) == (0, 0) and time.monotonic() < deadline:
        time.sleep(0.02)
    if done == (0, 0):
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        raise AssertionError("the forked child blocked on a lock held at the fork")
    assert os.waitstatus_to_exitcode(done[1]) == 0


def test_a_gpu_lost_while_its_prepare_write_is_held_is_reported_not_overwritten(
    node: Node,
) -> None:
    """A GPU vanished just after its claim's prepare, while that prepare's ``Ready=True``
    write was still held back: the report must be the last word (once seen in CI: the held
    write landed after a direct report and said the claim was ready on a vanished GPU)."""
    status = node.driver.status
    assert status is not None
    status.max_defer_s = 600.0
    ref = node.add(claim_obj(name="lost", uid=new_uid(), devices=["gpu-2"]))
    other_in_progress = status.busy()
    other_in_progress.__enter__()
    try:
        assert node.driver.prepare([ref])[ref.uid].error == ""
        status.lost(ref, {"gpu-2"})
        time.sleep(0.2)
        assert _applies(node) == []  # still held, both in the one queue
    finally:
        other_in_progress.__exit__(None, None, None)
    polling.wait_for(lambda: status.pending() == 0, what="the status write")
    time.sleep(0.2)
    stored = node.api.get_resource_claim("default", "lost")
    [entry] = stored["status"]["devices"]
    [ready] = entry["conditions"]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "False", "GpuVanished")
    assert "vanished" in ready["message"]
    assert entry["data"]["gpus"][0]["minor"] == 2  # the facts stay: which GPU it was
    # A later sync (a kubelet retry) keeps the report; unprepare removes our entry.
    status.sync(ref)
    polling.wait_for(lambda: status.pending() == 0, what="the retry's write")
    stored = node.api.get_resource_claim("default", "lost")
    assert stored["status"]["devices"][0]["conditions"][0]["reason"] == "GpuVanished"
    assert node.driver.unprepare([ref]) == {ref.uid: ""}
    polling.wait_for(
        lambda: not node.api.get_resource_claim("default", "lost")["status"].get("devices"),
        what="our entry removed",
    )
