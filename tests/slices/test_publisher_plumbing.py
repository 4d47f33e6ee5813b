"""The publisher's plumbing, driven step by step in the test's own thread: what its threads are,
how stop waits for them, what each log line says, how often the watch is re-opened and how long
it waits in between (a scripted API and clock, no real waiting), and the node agent's hook.

The loops are run synchronously: ``run`` until an observer or the injected sleep stops it,
``_watch_loop`` until the scripted API has no more watches to give."""

from __future__ import annotations

import random
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dra_driver.fakeapi import memory
from dra_driver.kube import api
from dra_driver.slices import build, publisher

from .conftest import Obj, devices_of
from .test_publisher import DRIVER, Recorder, desired

SLICE = "n1-gpu.nvidia.com-0"
Step = tuple[float, list[api.WatchEvent], Any]  # a scripted watch: seconds, events, error


@pytest.fixture
def mem() -> memory.InMemoryApi:
    api_ = memory.InMemoryApi()
    api_.put_node("n1", uid="uid-of-n1")
    return api_


def make(kube: Any, log: Recorder, **kw: Any) -> publisher.Publisher:
    kw.setdefault("backoff", publisher.Backoff(rng=random.Random(5)))
    return publisher.Publisher(kube=kube, driver_name=DRIVER, node_name="n1", log=log, **kw)


def events(log: Recorder, event: str) -> list[tuple[str, dict[str, Any]]]:
    return [(level, kw) for level, name, kw in log.lines if name == event]


# --- threads ------------------------------------------------------------------------------------


class JoinSpy:
    """Stands in for a started thread: records how long stop() waits for it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.timeouts: list[float | None] = []

    def join(self, timeout: float | None = None) -> None:
        self.timeouts.append(timeout)


def test_start_runs_two_named_daemon_threads_and_stop_waits_for_the_reconcile_one(
    mem: memory.InMemoryApi,
) -> None:
    pub = make(mem, Recorder(), watch_timeout_s=0.5)
    pub.set_desired(desired())
    pub.start()
    try:
        ours = {t.name: t for t in pub._threads}
        assert set(ours) == {"slice-publisher", "slice-watch"}
        assert all(t.daemon and t.is_alive() for t in ours.values())
        running = {t.name for t in threading.enumerate()}
        assert {"slice-publisher", "slice-watch"} <= running
    finally:
        pub.stop()
    assert not ours["slice-publisher"].is_alive()
    spies = [JoinSpy("slice-publisher"), JoinSpy("slice-watch")]
    pub._threads = spies  # type: ignore[assignment]
    pub.stop()
    pub.stop(timeout_s=2.5)
    # the reconcile thread gets the timeout; the watch thread (maybe blocked in a watch call
    # that cannot be interrupted) is not waited for
    assert [s.timeouts for s in spies] == [[5.0, 2.5], [0.05, 0.05]]


# --- the reconcile loop -------------------------------------------------------------------------


def test_a_failed_pass_is_logged_with_everything_an_operator_needs(
    mem: memory.InMemoryApi,
) -> None:
    log = Recorder()
    delays: list[float] = []
    heard: list[publisher.Outcome | None] = []

    def sleep(seconds: float) -> None:
        delays.append(seconds)

    def observer(outcome: publisher.Outcome | None) -> None:
        heard.append(outcome)
        if outcome is not None:
            pub.stop()

    pub = make(
        mem,
        log,
        sleep=sleep,
        on_pass=observer,
        backoff=publisher.Backoff(initial_s=0.5, max_s=60.0, rng=random.Random(3)),
    )
    mem.fail_next("create_resource_slice", 503, times=2, message="etcd is down")
    pub.set_desired(desired())
    pub.run()  # returns once the observer stopped it after the first success
    assert heard[:2] == [None, None] and heard[2] is not None and len(heard) == 3
    assert len(delays) == 2
    assert events(log, "publishing ResourceSlice failed") == [
        (
            "warning",
            {
                "slice": SLICE,
                "op": "create",
                "status": 503,
                "error": "etcd is down",
                "retry_in_s": round(delays[0], 3),
                "attempt": 1,
            },
        ),
        (
            "warning",
            {
                "slice": SLICE,
                "op": "create",
                "status": 503,
                "error": "etcd is down",
                "retry_in_s": round(delays[1], 3),
                "attempt": 2,
            },
        ),
    ]
    assert 0.25 <= delays[0] <= 0.5 and 0.5 <= delays[1] <= 1.0


def test_a_success_resets_the_backoff(mem: memory.InMemoryApi) -> None:
    log = Recorder()
    delays: list[float] = []
    passes: list[publisher.Outcome | None] = []

    def observer(outcome: publisher.Outcome | None) -> None:
        passes.append(outcome)
        if outcome is None:
            return
        if sum(1 for o in passes if o is not None) == 1:
            mem.fail_next("update_resource_slice", 500, times=1)
            pub.set_desired(desired("pcie-l4"))  # the next pass fails once
        else:
            pub.stop()

    pub = make(mem, log, sleep=delays.append, on_pass=observer)
    mem.fail_next("create_resource_slice", 500, times=2)
    pub.set_desired(desired())
    pub.run()
    attempts = [kw["attempt"] for _, kw in events(log, "publishing ResourceSlice failed")]
    assert attempts == [1, 2, 1]
    assert [p is None for p in passes] == [True, True, False, True, False]


def test_after_a_pass_the_loop_waits_the_resync_period(mem: memory.InMemoryApi) -> None:
    waits: list[float | None] = []

    class Wake(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            waits.append(timeout)
            pub.stop()
            return True

    pub = make(mem, Recorder(), resync_s=42.0)
    pub._wake = Wake()
    pub.set_desired(desired())
    pub.run()
    assert waits == [42.0]
    assert make(mem, Recorder())._resync_s == 600.0  # ten minutes unless told otherwise
    assert make(mem, Recorder())._watch_timeout_s == 30.0


def test_the_default_sleep_is_cut_short_by_new_desired_slices(mem: memory.InMemoryApi) -> None:
    pub = make(mem, Recorder())
    done = threading.Event()

    def sleeper() -> None:
        pub._sleep(300.0)
        done.set()

    thread = threading.Thread(target=sleeper, daemon=True)
    thread.start()
    assert not done.wait(0.2)
    pub.set_desired(desired())
    assert done.wait(10)


def test_an_observer_failure_is_logged_with_the_exception(mem: memory.InMemoryApi) -> None:
    log = Recorder()

    def observer(outcome: publisher.Outcome | None) -> None:
        pub.stop()
        raise RuntimeError("observer bug")

    pub = make(mem, log, on_pass=observer)
    pub.set_desired(desired())
    pub.run()
    assert events(log, "ResourceSlice publish observer failed") == [
        ("error", {"error": "RuntimeError('observer bug')"})
    ]


# --- one pass -----------------------------------------------------------------------------------


def test_conflicts_are_retried_three_times_and_logged(mem: memory.InMemoryApi) -> None:
    log = Recorder()
    pub = make(mem, log)
    pub.set_desired(desired())
    mem.fail_next("create_resource_slice", 409, times=3)
    outcome = pub.reconcile_once()
    assert outcome.created == [SLICE]
    assert (
        events(log, "conflict; re-reading ResourceSlices")
        == [("info", {"slice": SLICE, "op": "create"})] * 3
    )
    assert events(log, "ResourceSlices reconciled") == [
        ("info", {"created": [SLICE], "updated": [], "deleted": [], "generation": 1})
    ]
    assert pub.passes == 1
    pub.set_desired(desired("pcie-l4"))
    mem.fail_next("update_resource_slice", 409, times=4)
    with pytest.raises(publisher.PublishError) as info:
        pub.reconcile_once()
    assert (info.value.op, info.value.slice_name, info.value.cause.status) == (
        "update",
        SLICE,
        409,
    )
    assert pub.passes == 1
    assert publisher.CONFLICT_RETRIES == 3


def test_other_failures_are_not_retried_within_the_pass(mem: memory.InMemoryApi) -> None:
    pub = make(mem, Recorder())
    pub.set_desired(desired())
    mem.fail_next("create_resource_slice", 500, times=1)
    with pytest.raises(publisher.PublishError):
        pub.reconcile_once()
    assert pub.reconcile_once().created == [SLICE]


def test_a_pass_without_writes_logs_nothing_and_an_empty_desired_set_is_no_pass(
    mem: memory.InMemoryApi,
) -> None:
    log = Recorder()
    pub = make(mem, log)
    assert pub.reconcile_once() == publisher.Outcome()
    assert pub.passes == 0 and not mem.calls
    pub.set_desired(desired())
    pub.reconcile_once()
    log.lines.clear()
    assert pub.reconcile_once().writes == 0
    assert log.lines == []
    assert pub.passes == 2


def test_a_failed_list_names_no_slice(mem: memory.InMemoryApi) -> None:
    pub = make(mem, Recorder())
    pub.set_desired(desired())
    mem.fail_next("list_resource_slices", 503, times=1, message="unavailable")
    with pytest.raises(publisher.PublishError) as info:
        pub.reconcile_once()
    assert str(info.value) == "list ResourceSlice '*' failed: unavailable"


def test_failed_and_vanished_deletes(mem: memory.InMemoryApi) -> None:
    pub = make(mem, Recorder())
    pub.set_desired(desired(build_for(130)))
    pub.reconcile_once()
    pub.set_desired(desired())
    mem.fail_next("delete_resource_slice", 500, times=1, message="boom")
    with pytest.raises(publisher.PublishError) as info:
        pub.reconcile_once()
    assert str(info.value) == "delete ResourceSlice 'n1-gpu.nvidia.com-1' failed: boom"
    mem.fail_next("delete_resource_slice", 404, times=1)  # someone else deleted it first
    outcome = pub.reconcile_once()
    assert outcome.deleted == ["n1-gpu.nvidia.com-1"]


def build_for(gpus: int) -> Any:
    from dra_driver.devices import fake, profiles

    from .conftest import generated_profile

    return fake.FakeBackend(profiles.parse(generated_profile(gpus), source="t")).discover()


def test_an_update_of_a_slice_deleted_meanwhile_is_a_conflict(mem: memory.InMemoryApi) -> None:
    log = Recorder()
    pub = make(mem, log)
    pub.set_desired(desired())
    pub.reconcile_once()
    pub.set_desired(desired("pcie-l4"))
    mem.fail_next("update_resource_slice", 404, times=1)
    assert pub.reconcile_once().updated == [SLICE]  # re-read, then written
    assert events(log, "conflict; re-reading ResourceSlices") == [
        ("info", {"slice": SLICE, "op": "update"})
    ]


def test_an_invalid_slice_is_logged_with_every_error(mem: memory.InMemoryApi) -> None:
    log = Recorder()
    slices = desired()
    slices[0]["spec"]["devices"][0]["name"] = "GPU_0"
    slices[0]["spec"]["devices"][1]["taints"] = [{"key": "k"}]
    pub = make(mem, log)
    pub.set_desired(slices)
    outcome = pub.reconcile_once()
    assert outcome.rejected == [SLICE] and outcome.writes == 0 and outcome.slices == 0
    second = slices[0]["spec"]["devices"][1]["name"]
    ((level, kw),) = events(log, "ResourceSlice fails API validation; not sent")
    assert level == "error" and kw["slice"] == SLICE
    assert (
        kw["errors"][1] == f"spec.devices[1].taints[0].effect: Required value (device {second!r})"
    )
    assert kw["errors"][0].startswith('spec.devices[0].name: Invalid value: "GPU_0": ')
    assert len(kw["errors"]) == 2


def test_the_owner_reference_waits_for_a_readable_node(mem: memory.InMemoryApi) -> None:
    log = Recorder()
    pub = make(mem, log)
    pub.set_desired(desired())
    mem.fail_next("get_node", 500, times=1, message="node read failed")
    assert pub.reconcile_once().created == [SLICE]
    assert events(log, "cannot read Node for owner reference") == [
        ("warning", {"error": "node read failed"})
    ]
    (stored,) = mem.all_resource_slices()
    assert "ownerReferences" not in stored["metadata"]
    assert pub.reconcile_once().updated == [SLICE]  # the owner is added once the Node reads
    pub.reconcile_once()
    assert sum(1 for c in mem.calls if c.method == "get_node") == 2  # the uid is remembered
    owned = desired()
    for obj in owned:
        obj["metadata"]["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "x", "controller": True}
        ]
    fresh = make(mem, Recorder())
    fresh.set_desired(owned)
    fresh.reconcile_once()
    assert sum(1 for c in mem.calls if c.method == "get_node") == 2  # given: not read


# --- the watch loop -----------------------------------------------------------------------------


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
    monkeypatch.setattr(publisher, "time", types.SimpleNamespace(monotonic=clock.monotonic))
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
    monkeypatch.setattr(publisher, "time", types.SimpleNamespace(monotonic=clock.monotonic))
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
            base = 0.2 * 2**step
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
    assert first is not None and 0.1 <= first <= 0.2
    assert second is not None and 0.2 <= second <= 0.4
    assert third is not None and 0.4 <= third <= 0.8  # the opened watch ended at once


@pytest.mark.parametrize(("timeout", "ran"), [(30.0, 20.0), (30.0, 1.0), (1.0, 0.6), (1.0, 0.5)])
def test_a_watch_that_ran_a_while_and_broke_is_reopened_after_a_short_pause(
    monkeypatch: pytest.MonkeyPatch, timeout: float, ran: float
) -> None:
    broke = ("break", api.ApiError(0, "connection reset"))
    steps: list[Step] = [(0.0, [], broke), (0.0, [], broke), (0.0, [], broke), (ran, [], broke)]
    _, _, stop, log = watch_loop(monkeypatch, steps, watch_timeout_s=timeout)
    third, fourth = stop.waits[2:4]
    assert third is not None and 0.4 <= third <= 0.8  # broke at once: backing off
    # ran at least min(1 s, half its timeout): the backoff starts over
    assert fourth is not None and 0.1 <= fourth <= 0.2
    assert len(events(log, "watch of ResourceSlices failed")) == 4


def test_a_watch_that_broke_soon_after_it_opened_keeps_backing_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    broke = ("break", api.ApiError(0, "connection reset"))
    steps: list[Step] = [(0.0, [], broke), (0.0, [], broke), (0.0, [], broke), (0.45, [], broke)]
    _, _, stop, _ = watch_loop(monkeypatch, steps, watch_timeout_s=1.0)
    fourth = stop.waits[3]
    assert fourth is not None and 0.8 <= fourth <= 1.6


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
    monkeypatch.setattr(publisher, "time", types.SimpleNamespace(monotonic=clock.monotonic))
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
    assert stop.waits[1:] == [0.05] and 0.1 <= (stop.waits[0] or 0) <= 0.2
    assert events(log, "watch of ResourceSlices ended with an error; re-listing") == [
        ("info", {"code": 410, "reason": "Expired"})
    ]
    assert pub._watch_from is None and not pub.synced.is_set()
    assert kube.streams[0].closed


def test_stopping_during_a_watch_ends_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(publisher, "time", types.SimpleNamespace(monotonic=clock.monotonic))
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


# --- the node agent's hook ----------------------------------------------------------------------


def test_start_node_publisher_reports_left_out_devices_and_can_wait_to_start(
    mem: memory.InMemoryApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = Recorder()
    heard: list[Any] = []
    devices = devices_of("pcie-l4")
    real = build.build

    def leaving_one_out(*args: Any, **kw: Any) -> build.Build:
        result = real(*args, **kw)
        return build.Build(result.slices, ["device 'x' left out: reason"])

    monkeypatch.setattr(build, "build", leaving_one_out)
    pub = publisher.start_node_publisher(
        api=mem,
        devices=devices,
        driver_name=DRIVER,
        node_name="n1",
        log=log,
        on_pass=heard.append,
        on_watch=heard.append,
        start=False,
        watch_timeout_s=7.0,
        gpu_sets=False,
    )
    assert events(log, "device left out of the ResourceSlices") == [
        ("warning", {"problem": "device 'x' left out: reason"})
    ]
    assert pub._threads == [] and not mem.calls  # not started
    assert (pub.driver_name, pub.node_name, pub._watch_timeout_s) == (DRIVER, "n1", 7.0)
    assert pub.log is log
    outcome = pub.reconcile_once()
    assert [s["metadata"]["name"] for s in mem.all_resource_slices()] == [SLICE]
    stored = mem.all_resource_slices()[0]
    assert "sharedCounters" not in stored["spec"]  # gpu_sets=False: no counters
    assert outcome.created == [SLICE]
    pub._notify(outcome)
    pub._tell(pub._on_watch, True)
    assert heard == [outcome, True]


def test_start_node_publisher_defaults(mem: memory.InMemoryApi) -> None:
    pub = publisher.start_node_publisher(
        api=mem, devices=devices_of("h100-nvl-pairs"), driver_name=DRIVER, node_name="n1"
    )
    try:
        assert pub._watch_timeout_s == 30.0
        assert {t.name for t in pub._threads} == {"slice-publisher", "slice-watch"}
        pub.synced.wait(10)
        (counters,) = [s for s in mem.all_resource_slices() if s["spec"].get("sharedCounters")]
        assert counters["spec"]["sharedCounters"][0]["name"] == "gpus"
    finally:
        pub.stop()


def test_desired_slices_are_copied(mem: memory.InMemoryApi) -> None:
    slices: list[Obj] = desired()
    pub = make(mem, Recorder())
    pub.set_desired(slices)
    slices[0]["spec"]["devices"] = []
    pub.reconcile_once()
    assert len(mem.all_resource_slices()[0]["spec"]["devices"]) == 8


class FailingSecondUpdate:
    """The in-memory API, but the second update of a pass fails once (a write half done)."""

    def __init__(self, mem: memory.InMemoryApi) -> None:
        self.mem = mem
        self.updates = 0
        self.armed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.mem, name)

    def update_resource_slice(self, obj: Obj) -> Obj:
        self.updates += 1
        if self.armed and self.updates == 2:
            self.armed = False
            raise api.ApiError(500, "half done")
        return self.mem.update_resource_slice(obj)


def test_a_half_written_change_keeps_its_generation_unless_the_server_is_past_it(
    mem: memory.InMemoryApi,
) -> None:
    kube = FailingSecondUpdate(mem)
    pub = make(kube, Recorder())
    pub.set_desired(desired(build_for(130)))
    listed = mem.list_resource_slices(driver=DRIVER, node_name="n1")[1]
    first = pub.reconcile_once()
    assert first.generation == 1
    assert first.resource_version == listed  # what the pass's list saw, before its writes
    kube.armed, kube.updates = True, 0
    pub.set_desired(desired(build_for(129)))
    with pytest.raises(publisher.PublishError):
        pub.reconcile_once()  # slice 0 has generation 2 now, slice 1 still 1
    assert sorted(s["spec"]["pool"]["generation"] for s in mem.all_resource_slices()) == [1, 2]
    outcome = pub.reconcile_once()
    assert outcome.generation == 2 and outcome.updated == ["n1-gpu.nvidia.com-1"]
    assert {s["spec"]["pool"]["generation"] for s in mem.all_resource_slices()} == {2}
    # someone else moved the pool past the generation a failed pass had chosen
    kube.armed, kube.updates = True, 0
    pub.set_desired(desired(build_for(130)))
    with pytest.raises(publisher.PublishError):
        pub.reconcile_once()
    other = mem.get_resource_slice("n1-gpu.nvidia.com-0")
    other["spec"]["pool"]["generation"] = 9
    mem.put_resource_slice(other)
    assert pub.reconcile_once().generation == 10
    assert {s["spec"]["pool"]["generation"] for s in mem.all_resource_slices()} == {10}


def test_an_update_that_keeps_finding_the_slice_gone_says_so(mem: memory.InMemoryApi) -> None:
    pub = make(mem, Recorder())
    pub.set_desired(desired())
    pub.reconcile_once()
    pub.set_desired(desired("pcie-l4"))
    mem.fail_next("update_resource_slice", 404, times=4, message="slice vanished")
    with pytest.raises(publisher.PublishError) as info:
        pub.reconcile_once()
    assert (info.value.op, info.value.cause.status) == ("update", 409)  # re-read, then create
    assert str(info.value) == f"update ResourceSlice '{SLICE}' failed: slice vanished"


def test_a_failed_pass_over_unchanged_content_forgets_an_older_failed_change(
    mem: memory.InMemoryApi,
) -> None:
    pub = make(mem, Recorder())
    pub.set_desired(desired())
    assert pub.reconcile_once().generation == 1
    pub.set_desired(desired("pcie-l4"))
    mem.fail_next("update_resource_slice", 500, times=1)
    with pytest.raises(publisher.PublishError):
        pub.reconcile_once()  # generation 2 was chosen for pcie-l4, and not written
    labelled = desired()
    labelled[0]["metadata"]["labels"] = {"team": "gpu"}  # same content, new metadata
    pub.set_desired(labelled)
    mem.fail_next("update_resource_slice", 500, times=1)
    with pytest.raises(publisher.PublishError):
        pub.reconcile_once()
    pub.set_desired(desired("pcie-l4"))
    outcome = pub.reconcile_once()
    assert outcome.updated == [SLICE] and outcome.generation == 2
