"""When a change of holdings is rebuilt (issue 46): at the end of its burst, not in the middle of
the next one. Holdings that keep changing hold their rebuild back until they have been still for
``settle_s``, at most ``max_defer_s``; a change of allocations (which steers the scheduler's next
pick) or of health ends the wait at once. Real threads and a real follower; the publisher is a
stand-in that records when each desired set arrives."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

import pytest

from dra_driver import logs
from dra_driver.devices import health, holdings
from dra_driver.slices import republish

SETTLE_S = 0.1


class Desired:
    """Records the time of every desired set handed over."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.lock = threading.Lock()

    def set_desired(self, slices: Iterable[dict[str, Any]]) -> None:
        with self.lock:
            self.times.append(time.monotonic())

    def stop(self) -> None:
        pass

    def count(self) -> int:
        with self.lock:
            return len(self.times)


def _rebuild(inputs: republish.Inputs) -> list[dict[str, Any]]:
    return [{"taken": sorted(inputs.taken)}]  # differs whenever the taken GPUs do


@pytest.fixture
def follow() -> Iterator[Any]:
    made: list[republish.Republisher] = []

    def start(**kw: Any) -> tuple[republish.Republisher, Desired, holdings.HeldGpus, Any]:
        desired, held, allocated = Desired(), holdings.HeldGpus(), holdings.HeldGpus()
        board = health.HealthBoard()
        follower = republish.Republisher(
            publisher=desired,
            rebuild=_rebuild,
            log=logs.get("test"),
            built_from=republish.current(board, held, allocated),
            board=board,
            held=held,
            allocated=allocated,
            settle_s=SETTLE_S,
            **kw,
        )
        follower.start()
        made.append(follower)
        return follower, desired, held, allocated

    yield start
    for follower in made:
        follower.stop()


def _churn(held: holdings.HeldGpus, seconds: float, every_s: float = SETTLE_S / 4) -> float:
    """Change the holdings every ``every_s`` for ``seconds``; returns when the last change was."""
    end, i = time.monotonic() + seconds, 0
    last = time.monotonic()
    while time.monotonic() < end:
        held.hold("claim", [f"gpu-{i}"])  # always another GPU: every rebuild differs
        last, i = time.monotonic(), i + 1
        time.sleep(every_s)
    return last


def _wait(desired: Desired, n: int, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while desired.count() < n:
        assert time.monotonic() < deadline, f"{desired.count()} rebuilds, wanted {n}"
        time.sleep(0.005)


def test_holdings_that_keep_changing_are_rebuilt_once_they_are_still(follow: Any) -> None:
    follower, desired, held, _ = follow(max_defer_s=10.0)
    last = _churn(held, 6 * SETTLE_S)  # many settle windows, never still for one
    assert desired.count() == 0, "rebuilt in the middle of the burst"
    _wait(desired, 1)
    assert desired.times[0] - last >= SETTLE_S * 0.9  # after the burst was still for settle_s
    time.sleep(3 * SETTLE_S)
    assert desired.count() == 1 and follower.rebuilds == 1


def test_holdings_that_never_stop_changing_are_rebuilt_within_max_defer(follow: Any) -> None:
    _, desired, held, _ = follow(max_defer_s=3 * SETTLE_S)
    began = time.monotonic()
    _churn(held, 10 * SETTLE_S)
    assert desired.count() >= 2, "ranks held back for longer than max_defer_s"
    assert desired.times[0] - began <= 3 * SETTLE_S + 2 * SETTLE_S  # the cap, one window late
    assert desired.times[0] - began >= 3 * SETTLE_S * 0.9


def test_a_change_of_allocations_ends_a_bursts_wait(follow: Any) -> None:
    _, desired, held, allocated = follow(max_defer_s=10.0)
    held.hold("claim", ["gpu-0"])
    time.sleep(SETTLE_S / 4)
    held.hold("claim", ["gpu-1"])  # still churning: the wait goes on
    allocated.hold("other", ["gpu-5"])  # the scheduler placed a claim: its ranks are wanted now
    began = time.monotonic()
    _wait(desired, 1)
    assert desired.times[0] - began < SETTLE_S * 1.5


def test_a_change_of_allocations_seen_with_churning_holdings_waits_one_settle_only(
    follow: Any,
) -> None:
    _, desired, held, allocated = follow(max_defer_s=10.0)
    allocated.hold("other", ["gpu-5"])
    held.hold("claim", ["gpu-0"])  # both before the follower wakes
    began = time.monotonic()
    _churn(held, 6 * SETTLE_S)  # holdings go on changing all the while
    assert desired.count() >= 1
    assert desired.times[0] - began < SETTLE_S * 2
