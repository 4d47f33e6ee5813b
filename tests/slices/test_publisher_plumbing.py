"""The publisher's plumbing, driven step by step in the test's own thread: what its threads are,
how stop waits for them, what each log line says, conflict retries, generations of half-written
changes, the owner reference, and the node agent's hook (the watch loop: test_publisher_watch).

The reconcile loop is run synchronously, until an observer or the injected sleep stops it."""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest

from dra_driver.kube import api
from dra_driver.slices import build, publisher
from dra_driver.testing.fakeapi import memory

from .conftest import Obj, devices_of
from .test_publisher import DRIVER, Recorder, desired

SLICE = "n1-gpu.nvidia.com-0"


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
    from dra_driver.devices import fake
    from dra_driver.devices.fake import profiles

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
        (stored,) = mem.all_resource_slices()  # set ranks on by default
        assert all("setRanks" in d["attributes"] for d in stored["spec"]["devices"])
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
