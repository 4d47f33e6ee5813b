"""The housekeeping loop of both agents (claim clean-up, MPS supervision): it runs, survives a
failing round, never starts with interval 0, and stops at once."""

from __future__ import annotations

import threading
import time

from dra_driver import logs
from dra_driver.driver import periodic


def test_runs_again_after_a_failing_round_and_stops_at_once() -> None:
    rounds: list[float] = []
    third = threading.Event()

    def task() -> None:
        rounds.append(time.monotonic())
        if len(rounds) == 1:
            raise OSError("disk went away")
        if len(rounds) == 3:
            third.set()

    loop = periodic.Periodic(
        name="t",
        task=task,
        interval_s=0.01,
        log=logs.get("test"),
        failed="claim clean-up failed; will retry",
    )
    loop.start()
    assert third.wait(5), "the loop died after its failing round"
    started = time.monotonic()
    loop.stop()
    assert time.monotonic() - started < 1 and not loop._thread.is_alive()
    count = len(rounds)
    time.sleep(0.05)
    assert len(rounds) == count  # nothing runs after stop


def test_interval_zero_never_starts() -> None:
    ran = threading.Event()
    loop = periodic.Periodic(
        name="t",
        task=ran.set,
        interval_s=0,
        log=logs.get("test"),
        failed="claim clean-up failed; will retry",
    )
    loop.start()
    assert not ran.wait(0.1) and not loop._thread.is_alive()
    loop.stop()  # stopping a loop that never started is fine


def test_a_long_interval_waits_and_stop_does_not_wait_for_it() -> None:
    ran = threading.Event()
    loop = periodic.Periodic(
        name="t",
        task=ran.set,
        interval_s=60,
        log=logs.get("test"),
        failed="claim clean-up failed; will retry",
    )
    loop.start()
    assert not ran.wait(0.1)  # the first round comes after one interval, not at start
    started = time.monotonic()
    loop.stop()
    assert time.monotonic() - started < 1
