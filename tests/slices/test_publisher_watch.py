"""The publisher's watch loop driven step by step in the test's own thread, on a scripted API and
clock (no real waiting): where each watch starts, when it is re-opened at once and when with
backoff, what an expired position and an ERROR event do, what each failure logs; and which
watch events wake the reconcile loop."""

from __future__ import annotations

import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dra_driver.kube import api
from dra_driver.slices import publisher, slicewatch
from dra_driver.testing.fakeapi import memory

from .test_publisher import DRIVER, Recorder, desired
from .test_publisher_plumbing import SLICE, events, make

Step = tuple[float, list[api.WatchEvent], Any]  # a scripted watch: seconds, events, error


@pytest.fixture
def mem() -> memory.InMemoryApi:
    api_ = memory.InMemoryApi()
    api_.put_node("n1", uid="uid-of-n1")
    return api_


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class StopEvent(threading.Event):
    """The publisher's stop event, recording every wait of the watch loop (none really waits);
    waiting for a watch position (nothing else would give one here) stops the publisher."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        if timeout == 0.05:
            self.set()
        return self.is_set()


class Closing:
    """A watch's event stream that says whether it was closed."""

    def __init__(self, items: Iterator[api.WatchEvent]) -> None:
        self.items = items
        self.closed = False

    def __iter__(self) -> Iterator[api.WatchEvent]:
        return self.items

    def close(self) -> None:
        self.closed = True


class ScriptedWatches:
    """Each watch call takes the next step: ``(seconds, events, error)`` — the watch runs for
    ``seconds`` on the clock, delivers ``events``, then ends (or fails with ``error``); an
    ``error`` with no events and ``opened=False`` refuses the watch itself. When the script
    is done the publisher is stopped."""

    def __init__(self, clock: Clock, steps: list[Step]) -> None:
        self.clock = clock
        self.steps = steps
        self.calls: list[dict[str, Any]] = []
        self.streams: list[Closing] = []
        self.pub: publisher.Publisher | None = None

    def watch_resource_slices(self, **kw: Any) -> Any:
        self.calls.append(kw)
        if not self.steps:
            assert self.pub is not None
            self.pub.stop()
            raise api.ApiError(500, "script done")
        seconds, items, error = self.steps.pop(0)
        if error is not None and error[0] == "refuse":
            self.clock.now += seconds
            raise error[1]

        def stream() -> Iterator[api.WatchEvent]:
            yield from items
            self.clock.now += seconds
            if error is not None:
                raise error[1]

        self.streams.append(Closing(stream()))
        return self.streams[-1]


def watch_loop(
    monkeypatch: pytest.MonkeyPatch,
    steps: list[Step],
    *,
    watch_timeout_s: float = 30.0,
    watch_from: str | None = "7",
    on_watch: Callable[[bool], None] | None = None,
) -> tuple[publisher.Publisher, ScriptedWatches, StopEvent, Recorder]:
    clock = Clock()
    monkeypatch.setattr(slicewatch, "time", types.SimpleNamespace(monotonic=clock.monotonic))
    kube = ScriptedWatches(clock, steps)
    log = Recorder()
    pub = make(kube, log, watch_timeout_s=watch_timeout_s, on_watch=on_watch)
    kube.pub = pub
    stop = StopEvent()
    pub._stop = stop
    pub._watch_from = watch_from
    pub._watch_loop()
    return pub, kube, stop, log


def modified(name: str, rv: str) -> api.WatchEvent:
    return api.WatchEvent("MODIFIED", {"metadata": {"name": name, "resourceVersion": rv}})


def test_watches_ask_for_our_slices_from_where_we_are(monkeypatch: pytest.MonkeyPatch) -> None:
    heard: list[bool] = []
    steps: list[Step] = [(5.0, [modified(SLICE, "9")], None), (5.0, [], None)]
    _, kube, stop, log = watch_loop(monkeypatch, steps, watch_timeout_s=12.0, on_watch=heard.append)
    assert kube.calls[:2] == [
        {"driver": DRIVER, "node_name": "n1", "resource_version": "7", "timeout_s": 12.0},
        {"driver": DRIVER, "node_name": "n1", "resource_version": "9", "timeout_s": 12.0},
    ]
    # watches that ran their course are re-opened at once; a failure once stopped is not news
    assert stop.waits == []
    assert heard == [True, True]
    assert all(s.closed for s in kube.streams)
    assert events(log, "watch of ResourceSlices failed") == []  # stopped: not logged


def test_without_a_position_the_watch_waits_for_the_first_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Positioning(StopEvent):
        def wait(self, timeout: float | None = None) -> bool:
            self.waits.append(timeout)
            pub._watch_from = "3"  # the first reconcile pass has listed meanwhile
            return self.is_set()

    clock = Clock()
    monkeypatch.setattr(slicewatch, "time", types.SimpleNamespace(monotonic=clock.monotonic))
    kube = ScriptedWatches(clock, [])
    pub = make(kube, Recorder())
    kube.pub = pub
    stop = Positioning()
    pub._stop = stop
    pub._watch_loop()
    assert stop.waits == [0.05]
    assert [c["resource_version"] for c in kube.calls] == ["3"]


@pytest.mark.parametrize(
    ("timeout", "seconds", "waits"),
    [
        (30.0, 0.999, True),  # the server ended it within a second: back off
        (30.0, 1.0, False),
        (1.0, 0.45, True),  # a short watch: half its timeout is the bar
        (1.0, 0.5, False),
    ],
)
def test_a_watch_the_server_ends_at_once_is_reopened_with_backoff(
    monkeypatch: pytest.MonkeyPatch, timeout: float, seconds: float, waits: bool
) -> None:
    steps: list[Step] = [(seconds, [], None)] * 3
    _, kube, stop, _ = watch_loop(monkeypatch, steps, watch_timeout_s=timeout)
    assert len(kube.calls) == 4
    backoff = stop.waits
    if waits:
        assert len(backoff) == 3
        for step, delay in enumerate(backoff):
            base = publisher.WATCH_RETRY_S[0] * 2**step
            assert delay is not None and base / 2 <= delay <= base
    else:
        assert backoff == []


def test_watch_backoff_is_capped_at_30_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    steps: list[Step] = [(0.0, [], None)] * 60
    _, _, stop, _ = watch_loop(monkeypatch, steps)
    late = [w for w in stop.waits[12:] if w is not None]
    assert len(late) == 48
    assert all(15.0 <= w <= 30.0 for w in late)


def test_a_refused_watch_is_logged_and_retried_with_backoff(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    heard: list[bool] = []
    refused = ("refuse", api.ApiError(403, "forbidden: watch", reason="Forbidden"))
    steps: list[Step] = [(0.0, [], refused), (0.0, [], refused), (0.0, [modified("x", "8")], None)]
    pub, _, stop, log = watch_loop(monkeypatch, steps, on_watch=heard.append)
    assert (
        events(log, "watch of ResourceSlices failed")
        == [("warning", {"error": "forbidden: watch", "status": 403, "relist": False})] * 2
    )
    assert heard == [False, False, True]
    assert pub._watch_from == "8"
    first, second, third = stop.waits[:3]
    initial = publisher.WATCH_RETRY_S[0]
    assert first is not None and initial / 2 <= first <= initial
    assert second is not None and initial <= second <= 2 * initial
    assert third is not None and 2 * initial <= third <= 4 * initial  # ended at once


@pytest.mark.parametrize(("timeout", "ran"), [(30.0, 20.0), (30.0, 1.0), (1.0, 0.6), (1.0, 0.5)])
def test_a_watch_that_ran_a_while_and_broke_is_reopened_after_a_short_pause(
    monkeypatch: pytest.MonkeyPatch, timeout: float, ran: float
) -> None:
    broke = ("break", api.ApiError(0, "connection reset"))
    steps: list[Step] = [(0.0, [], broke), (0.0, [], broke), (0.0, [], broke), (ran, [], broke)]
    _, _, stop, log = watch_loop(monkeypatch, steps, watch_timeout_s=timeout)
    third, fourth = stop.waits[2:4]
    initial = publisher.WATCH_RETRY_S[0]
    assert third is not None and 2 * initial <= third <= 4 * initial  # broke at once: backing off
    # ran at least min(1 s, half its timeout): the backoff starts over
    assert fourth is not None and initial / 2 <= fourth <= initial
    assert len(events(log, "watch of ResourceSlices failed")) == 4


def test_a_watch_that_broke_soon_after_it_opened_keeps_backing_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    broke = ("break", api.ApiError(0, "connection reset"))
    steps: list[Step] = [(0.0, [], broke), (0.0, [], broke), (0.0, [], broke), (0.45, [], broke)]
    _, _, stop, _ = watch_loop(monkeypatch, steps, watch_timeout_s=1.0)
    fourth = stop.waits[3]
    initial = publisher.WATCH_RETRY_S[0]
    assert fourth is not None and 4 * initial <= fourth <= 8 * initial


@pytest.mark.parametrize(
    "error",
    [
        api.ApiError(410, "too old resource version"),
        api.ApiError(500, "x", reason="Expired"),
        api.ApiError(500, "x", reason="Gone"),
    ],
)
def test_an_expired_watch_position_means_a_fresh_list(
    monkeypatch: pytest.MonkeyPatch, error: api.ApiError
) -> None:
    heard: list[bool] = []
    clock = Clock()
    monkeypatch.setattr(slicewatch, "time", types.SimpleNamespace(monotonic=clock.monotonic))
    kube = ScriptedWatches(clock, [(0.0, [], ("refuse", error))])
    log = Recorder()
    pub = make(kube, log, on_watch=heard.append)
    kube.pub = pub
    pub._watch_from = "7"
    pub.synced.set()
    pub._wake.clear()

    class Relisted(StopEvent):
        def wait(self, timeout: float | None = None) -> bool:
            if pub._watch_from is None:  # the reconcile loop lists again ...
                assert not pub.synced.is_set() and pub._wake.is_set()
                pub._watch_from = "100"  # ... and the watch resumes from there
            return super().wait(timeout)

    pub._stop = Relisted()
    pub._watch_loop()
    assert heard == []  # an expired position is no failure to open a watch
    assert [c["resource_version"] for c in kube.calls] == ["7", "100"]
    ((level, kw),) = events(log, "watch of ResourceSlices failed")[:1]
    assert (level, kw["status"], kw["relist"]) == ("warning", error.status, True)


def test_an_error_event_relists(monkeypatch: pytest.MonkeyPatch) -> None:
    gone = api.WatchEvent("ERROR", {"code": 410, "reason": "Expired", "message": "too old"})
    steps: list[Step] = [(0.0, [gone, modified("x", "99")], None)]
    pub, kube, stop, log = watch_loop(monkeypatch, steps)
    # it ended at once (backoff), then there is no position until the next list
    initial = publisher.WATCH_RETRY_S[0]
    assert stop.waits[1:] == [0.05] and initial / 2 <= (stop.waits[0] or 0) <= initial
    assert events(log, "watch of ResourceSlices ended with an error; re-listing") == [
        ("info", {"code": 410, "reason": "Expired"})
    ]
    assert pub._watch_from is None and not pub.synced.is_set()
    assert kube.streams[0].closed


def test_stopping_during_a_watch_ends_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(slicewatch, "time", types.SimpleNamespace(monotonic=clock.monotonic))
    holder: list[publisher.Publisher] = []

    def stream() -> Iterator[api.WatchEvent]:
        holder[0].stop()
        yield modified("x", "50")
        yield modified("x", "51")

    closing = Closing(stream())
    kube = types.SimpleNamespace(watch_resource_slices=lambda **kw: closing)
    pub = make(kube, Recorder())
    holder.append(pub)
    pub._stop = StopEvent()
    pub._watch_from = "7"
    pub._watch_loop()
    assert pub._watch_from == "7" and closing.closed  # the event after stop is not handled
    assert pub._stop.waits == []


def test_events_wake_the_reconcile_loop_unless_we_caused_them(mem: memory.InMemoryApi) -> None:
    pub = make(mem, Recorder())
    pub.set_desired(desired())
    pub.reconcile_once()
    rv = mem.all_resource_slices()[0]["metadata"]["resourceVersion"]
    pub._wake.clear()
    assert pub._handle(modified(SLICE, rv))  # our own write
    assert not pub._wake.is_set() and pub.synced.is_set()
    assert pub._handle(api.WatchEvent("BOOKMARK", {"metadata": {"resourceVersion": "500"}}))
    assert not pub._wake.is_set() and pub._watch_from == "500"
    assert pub._handle(modified(SLICE, "501"))  # someone else changed it
    assert pub._wake.is_set() and not pub.synced.is_set() and pub._watch_from == "501"
    pub._wake.clear()
    gone = api.WatchEvent(
        "DELETED", {"metadata": {"name": "n1-gpu.nvidia.com-9", "resourceVersion": ""}}
    )
    assert pub._handle(gone)  # a slice we neither want nor know: deleting it is no news
    assert not pub._wake.is_set() and pub._watch_from == "501"
    assert pub._handle(api.WatchEvent("DELETED", {"metadata": {"name": SLICE}}))
    assert pub._wake.is_set()
