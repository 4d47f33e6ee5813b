"""The health board: versioned changes, no-op marks, waiting and closing."""

from __future__ import annotations

import threading
import time

from dra_driver.devices import health


def test_marks_change_the_version_only_when_state_changes() -> None:
    board = health.HealthBoard()
    v0 = board.snapshot().version
    assert board.mark_unhealthy("GPU-a", "XID 79") is True
    assert board.mark_unhealthy("GPU-a", "XID 79") is False
    assert board.mark_unhealthy("GPU-a", "XID 48") is True  # new reason is news
    snap = board.snapshot()
    assert snap.version == v0 + 2
    assert not snap.is_healthy(["GPU-a"]) and snap.reason(["MIG-x", "GPU-a"]) == "GPU-a: XID 48"
    assert board.mark_healthy("GPU-a") is True and board.mark_healthy("GPU-a") is False
    assert board.snapshot().is_healthy(["GPU-a"])


def test_wait_changed_returns_on_a_change_from_another_thread() -> None:
    board = health.HealthBoard()
    v = board.snapshot().version
    timer = threading.Timer(0.1, board.mark_unhealthy, args=("GPU-b",))
    timer.start()
    began = time.monotonic()
    snap = board.wait_changed(v, timeout=5)
    assert time.monotonic() - began < 2
    assert snap.version == v + 1 and "GPU-b" in snap.unhealthy


def test_wait_changed_times_out_without_change_and_close_releases_waiters() -> None:
    board = health.HealthBoard()
    v = board.snapshot().version
    assert board.wait_changed(v, timeout=0.05).version == v
    threading.Timer(0.1, board.close).start()
    began = time.monotonic()
    board.wait_changed(v, timeout=5)
    assert time.monotonic() - began < 2 and board.closed


def test_snapshots_are_immutable_copies() -> None:
    board = health.HealthBoard()
    board.mark_unhealthy("GPU-c")
    snap = board.snapshot()
    board.mark_healthy("GPU-c")
    assert "GPU-c" in snap.unhealthy
