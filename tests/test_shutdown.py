"""The agent's stop steps and their deadline (dra_driver/shutdown.py), with real threads and a
real file for the stack dump; the process exit is the one thing replaced (by a recorder)."""

from __future__ import annotations

import io
import logging
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import structlog
from structlog.testing import LogCapture

from dra_driver import shutdown


class Exits:
    """Records the exit codes asked for, and wakes whoever waits for the first."""

    def __init__(self) -> None:
        self.codes: list[int] = []
        self.asked = threading.Event()

    def __call__(self, code: int) -> None:
        self.codes.append(code)
        self.asked.set()


def _stopper(
    deadline_s: float, exits: Exits | None = None, logs: LogCapture | None = None, **kw: Any
) -> shutdown.Stopper:
    """A stopper logging into ``logs`` at every level, whatever the run's structlog settings."""
    log = structlog.wrap_logger(
        None,
        processors=[logs or LogCapture()],
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
    )
    return shutdown.Stopper(log=log, deadline_s=deadline_s, exit_=exits or Exits(), **kw)


def test_every_step_runs_in_order_even_after_one_fails() -> None:
    ran: list[str] = []

    def broken() -> None:
        ran.append("b")
        raise RuntimeError("socket already gone")

    logs = LogCapture()
    stopper = _stopper(0, logs=logs)
    stopper.run(
        [
            ("a", lambda: ran.append("a")),
            ("b", broken),
            ("off", None),
            ("c", lambda: ran.append("c")),
        ]
    )
    assert ran == ["a", "b", "c"]
    assert list(stopper.durations) == ["a", "b", "c"]  # a part not running is not a step
    failed = [x for x in logs.entries if x["log_level"] == "error"]
    assert [(x["event"], x["part"]) for x in failed] == [
        ("cannot stop a part cleanly; stopping the others", "b")
    ]
    assert stopper.current == ""
    logs.entries.clear()
    stopper.run([("http", lambda: None)])  # the CLI's own steps, after the agent's
    stopped = [list(x["seconds"]) for x in logs.entries if x["event"] == "parts stopped"]
    assert stopped == [["http"]]


def test_a_slow_step_is_logged_with_its_time_and_a_quick_one_is_not() -> None:
    ticks = iter([0.0, 0.2, 10.0, 12.51234, 20.0, 21.0])
    logs = LogCapture()
    stopper = _stopper(0, logs=logs, clock=lambda: next(ticks))
    stopper.run([("quick", lambda: None), ("publisher", lambda: None), ("one-s", lambda: None)])
    assert [(x["event"], x.get("part"), x["seconds"]) for x in logs.entries] == [
        ("slow to stop", "publisher", 2.512),
        ("slow to stop", "one-s", 1.0),  # SLOW_STEP_S itself counts as slow
        ("parts stopped", None, {"quick": 0.2, "publisher": 2.512, "one-s": 1.0}),
    ]
    assert stopper.durations == {"quick": 0.2, "publisher": 2.51234, "one-s": 1.0}


def test_the_deadline_exits_naming_the_stuck_step_and_dumping_every_stack(tmp_path: Path) -> None:
    exits = Exits()
    release = threading.Event()

    def wait_for_a_peer_that_never_answers() -> None:
        release.wait(10)

    dump = (tmp_path / "stderr").open("w+")
    logs = LogCapture()
    stopper = _stopper(0.2, exits, logs=logs, stream=dump)
    stopper.arm()
    done = threading.Thread(
        target=stopper.run,
        args=(
            [
                ("registration", lambda: None),
                ("slice-publisher", wait_for_a_peer_that_never_answers),
            ],
        ),
    )
    done.start()
    assert exits.asked.wait(5)
    release.set()  # the recorder does not end the process: let the step end
    done.join(5)
    assert exits.codes == [shutdown.DEADLINE_EXIT_CODE]
    errors = [x for x in logs.entries if x["log_level"] == "error"]
    assert len(errors) == 1
    assert errors[0]["event"] == (
        "shutdown did not finish in time; exiting without the remaining steps (the claim state "
        "on disk is crash-safe); every thread's stack follows on stderr"
    )
    assert errors[0]["stopping"] == "slice-publisher"
    assert errors[0]["deadline_s"] == 0.2
    assert done.name in errors[0]["threads"]
    dump.seek(0)
    text = dump.read()
    assert "in wait_for_a_peer_that_never_answers" in text  # the stuck thread's stack
    assert text.count("Thread 0x") >= 1 and "Current thread 0x" in text


def test_armed_twice_the_deadline_does_not_move() -> None:
    exits = Exits()
    stopper = _stopper(0.3, exits)
    stopper.arm()
    first = stopper._timer
    assert first is not None and first.daemon  # never what keeps a finished process alive
    assert first.name == "shutdown-deadline"
    stopper.arm()
    assert stopper._timer is first  # a second SIGTERM does not restart the clock
    assert exits.asked.wait(5)
    assert exits.codes == [shutdown.DEADLINE_EXIT_CODE]  # once


def test_no_deadline_when_it_is_zero() -> None:
    exits = Exits()
    stopper = _stopper(0, exits)
    stopper.arm()
    assert stopper._timer is None
    assert "shutdown-deadline" not in {t.name for t in threading.enumerate()}


def test_a_stream_without_a_file_descriptor_still_ends_the_process() -> None:
    exits = Exits()
    logs = LogCapture()
    stopper = _stopper(0.05, exits, logs=logs, stream=io.StringIO())
    stopper.arm()
    assert exits.asked.wait(5)
    assert exits.codes == [shutdown.DEADLINE_EXIT_CODE]
    assert [x["stopping"] for x in logs.entries] == ["(between steps)"]  # no step running


def test_a_second_signal_while_the_first_starts_the_deadline_does_not_deadlock(
    monkeypatch: Any,
) -> None:
    """The fleet's rolling restart sent two SIGTERMs back to back: the second interrupted
    ``arm()`` while it waited for the timer thread to start, holding its lock, and the nested
    ``arm()`` waited for that lock forever (the deadline's own timer ended the process 25 s
    later, having stopped nothing). Here the nested call is made exactly there."""
    exits = Exits()
    stopper = _stopper(0.3, exits)
    started: list[threading.Timer] = []

    class InterruptedTimer(threading.Timer):
        def start(self) -> None:
            stopper.arm()  # the second signal's handler, inside the first one's start()
            started.append(self)
            super().start()

    monkeypatch.setattr(threading, "Timer", InterruptedTimer)  # what shutdown.py calls
    first = threading.Thread(target=stopper.arm, daemon=True)
    first.start()
    first.join(5)
    assert not first.is_alive(), "arm() deadlocked on its own lock"
    assert len(started) == 1 and stopper._timer is started[0]
    assert exits.asked.wait(5) and exits.codes == [shutdown.DEADLINE_EXIT_CODE]


def test_each_signal_arms_then_stops_one_after_the_other() -> None:
    """A second SIGTERM while the first one's ``on_signal`` runs (here: raised from it) waits for
    it: ``on_signal`` never runs inside itself, and runs before ``stop`` is set."""
    from dra_driver import app

    stop = threading.Event()
    calls: list[bool] = []
    both = threading.Event()

    def on_signal() -> None:
        calls.append(stop.is_set())
        if len(calls) == 1:
            signal.raise_signal(signal.SIGTERM)
            assert len(calls) == 1  # not nested
        else:
            both.set()

    undo = app.install_signal_handlers(stop, on_signal=on_signal)
    try:
        signal.raise_signal(signal.SIGTERM)
        assert stop.wait(5)
        assert both.wait(5)
        assert calls == [False, True]
        stop.clear()
        signal.raise_signal(signal.SIGINT)
        assert stop.wait(5)
    finally:
        undo()


_SIGNAL_WHILE_WAIT_HOLDS_ITS_LOCK = """
import signal, sys, threading, time
import structlog
from dra_driver import app, shutdown

stop = threading.Event()
stopper = shutdown.Stopper(log=structlog.get_logger(), deadline_s=float(sys.argv[2]))
app.install_signal_handlers(stop, on_signal=stopper.arm)
with stop._cond:  # where stop.wait() is between its entry and the start of its wait
    signal.raise_signal(signal.SIGTERM)
    if sys.argv[1] == "stuck":
        time.sleep(60)  # a main thread that does not come back: the deadline ends it
stop.wait()
print("stopped", flush=True)
"""


def _run_agent_like(case: str, deadline_s: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _SIGNAL_WHILE_WAIT_HOLDS_ITS_LOCK, case, deadline_s],
        capture_output=True,
        text=True,
        timeout=20,
    )


def test_a_signal_as_the_main_thread_enters_stop_wait_still_stops_it() -> None:
    """The rare hang of the kubelet-plugin on SIGTERM (neither a stop nor its own deadline):
    a handler that set ``stop`` in the main thread, inside ``stop.wait()``'s locked prologue,
    deadlocked on the event's lock. Before the fix this subprocess never ended."""
    done = _run_agent_like("returns", "25")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "stopped\n"


def test_a_signal_while_the_main_thread_is_stuck_holding_the_lock_arms_the_deadline() -> None:
    done = _run_agent_like("stuck", "0.5")
    assert done.returncode == shutdown.DEADLINE_EXIT_CODE, done.stderr
    assert "shutdown did not finish in time" in done.stdout + done.stderr
