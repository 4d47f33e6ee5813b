"""The publisher over the in-memory API: declarative, zero writes when nothing changed, bumps
the generation on change, recreates deleted slices, retries failures with backoff, and never
touches other nodes' or drivers' slices."""

from __future__ import annotations

import copy
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dra_driver.devices import model
from dra_driver.kube import api
from dra_driver.slices import build, publisher
from dra_driver.testing.fakeapi import memory

from .conftest import Obj, devices_of

DRIVER = "gpu.nvidia.com"


class Recorder:
    """A logger that keeps what it was told."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def info(self, event: str, **kw: Any) -> None:
        self.lines.append(("info", event, kw))

    def warning(self, event: str, **kw: Any) -> None:
        self.lines.append(("warning", event, kw))

    def error(self, event: str, **kw: Any) -> None:
        self.lines.append(("error", event, kw))

    def of(self, level: str) -> list[dict[str, Any]]:
        return [kw for lvl, _, kw in self.lines if lvl == level]


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def desired(profile: str | model.NodeDevices = "dgx-h100", node: str = "n1") -> list[Obj]:
    devices = devices_of(profile) if isinstance(profile, str) else profile
    # One slice per small node: the publisher's mechanics, not the pool layout (see the
    # GPU-set test for a pool with a counter slice and set devices).
    return build.build(devices, node_name=node, driver_name=DRIVER, gpu_sets=False).slices


@pytest.fixture
def mem() -> memory.InMemoryApi:
    api_ = memory.InMemoryApi()
    api_.put_node("n1", uid="uid-of-n1")
    return api_


@pytest.fixture
def log() -> Recorder:
    return Recorder()


@pytest.fixture
def make_publisher(mem: memory.InMemoryApi, log: Recorder) -> Iterator[Callable[..., Any]]:
    made: list[publisher.Publisher] = []

    def make(**kw: Any) -> publisher.Publisher:
        kw.setdefault("backoff", publisher.Backoff(rng=random.Random(7)))
        pub = publisher.Publisher(
            kube=kw.pop("kube", mem),
            driver_name=DRIVER,
            node_name="n1",
            log=log,
            watch_timeout_s=0.5,
            **kw,
        )
        made.append(pub)
        return pub

    yield make
    for pub in made:
        pub.stop()


def generation(mem: memory.InMemoryApi) -> set[int]:
    return {s["spec"]["pool"]["generation"] for s in mem.all_resource_slices()}


def test_first_publish_creates_with_owner_and_republish_writes_nothing(
    mem: memory.InMemoryApi, make_publisher: Callable[..., publisher.Publisher]
) -> None:
    pub = make_publisher()
    pub.set_desired(desired())
    outcome = pub.reconcile_once()
    assert outcome.created == ["n1-gpu.nvidia.com-0"] and outcome.generation == 1
    (obj,) = mem.all_resource_slices()
    assert obj["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "uid-of-n1", "controller": True}
    ]
    assert mem.writes == 1 and pub.synced.is_set()
    mem.reset_calls()
    assert pub.reconcile_once().writes == 0
    restarted = make_publisher()  # a new process with the same hardware
    restarted.set_desired(desired())
    assert restarted.reconcile_once().writes == 0
    assert mem.writes == 0
    assert generation(mem) == {1}


def test_hardware_changes_bump_the_generation_of_every_slice(
    mem: memory.InMemoryApi,
    make_publisher: Callable[..., publisher.Publisher],
    make_devices: Callable[..., model.NodeDevices],
) -> None:
    pub = make_publisher()
    pub.set_desired(desired())
    pub.reconcile_once()
    fewer = devices_of("dgx-h100")
    pub.set_desired(desired(model.NodeDevices(gpus=fewer.gpus[:7], pcie_paths=fewer.pcie_paths)))
    assert pub.reconcile_once().updated == ["n1-gpu.nvidia.com-0"]
    assert generation(mem) == {2}
    pub.set_desired(desired(make_devices(130)))
    outcome = pub.reconcile_once()
    assert outcome.created == ["n1-gpu.nvidia.com-1"] and outcome.updated == ["n1-gpu.nvidia.com-0"]
    assert generation(mem) == {3}
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in mem.all_resource_slices()} == {2}
    pub.set_desired(desired())
    outcome = pub.reconcile_once()
    assert outcome.deleted == ["n1-gpu.nvidia.com-1"] and generation(mem) == {4}
    mem.reset_calls()
    assert pub.reconcile_once().writes == 0 and mem.writes == 0


def test_other_nodes_and_drivers_are_untouched_and_our_stale_slices_go(
    mem: memory.InMemoryApi, make_publisher: Callable[..., publisher.Publisher]
) -> None:
    theirs = desired(node="n2")[0]
    other_driver = copy.deepcopy(desired()[0])
    other_driver["metadata"]["name"] = "n1-nic.example.com-0"
    other_driver["spec"]["driver"] = "nic.example.com"
    stale = copy.deepcopy(desired()[0])
    stale["metadata"]["name"] = "n1-gpu.nvidia.com-leftover"
    for obj in (theirs, other_driver, stale):
        mem.put_resource_slice(obj)
    before = {s["metadata"]["name"]: s for s in mem.all_resource_slices()}
    pub = make_publisher()
    pub.set_desired(desired())
    outcome = pub.reconcile_once()
    assert outcome.deleted == ["n1-gpu.nvidia.com-leftover"]
    after = {s["metadata"]["name"]: s for s in mem.all_resource_slices()}
    for name in ("n2-gpu.nvidia.com-0", "n1-nic.example.com-0"):
        assert after[name] == before[name]
    touched = {c.name for c in mem.calls if c.method in memory.WRITE_METHODS}
    assert touched == {"n1-gpu.nvidia.com-0", "n1-gpu.nvidia.com-leftover"}


def test_a_deleted_slice_is_recreated_through_the_watch(
    mem: memory.InMemoryApi, make_publisher: Callable[..., publisher.Publisher]
) -> None:
    pub = make_publisher(resync_s=60.0)  # only the watch can bring it back this fast
    pub.set_desired(desired())
    pub.start()
    wait_for(pub.synced.is_set)
    writes = mem.writes
    mem.remove_resource_slice("n1-gpu.nvidia.com-0")
    wait_for(lambda: len(mem.all_resource_slices()) == 1)
    assert generation(mem) == {2}  # the pool changed: new generation
    time.sleep(0.2)
    assert mem.writes == writes + 1  # one create, and our own events cause no more writes


def test_resync_repairs_even_without_events(
    mem: memory.InMemoryApi, make_publisher: Callable[..., publisher.Publisher]
) -> None:
    pub = make_publisher(resync_s=0.1)
    pub.set_desired(desired())
    pub.start()
    wait_for(pub.synced.is_set)
    mem.fail_next("watch_resource_slices", 500, times=1000)  # the watch is down
    mem.end_watches()
    changed = mem.all_resource_slices()[0]
    changed["spec"]["devices"] = changed["spec"]["devices"][:1]
    mem.put_resource_slice(changed)
    wait_for(lambda: len(mem.all_resource_slices()[0]["spec"]["devices"]) == 8)


def test_conflicts_reread_and_retry(
    mem: memory.InMemoryApi, make_publisher: Callable[..., publisher.Publisher]
) -> None:
    pub = make_publisher()
    pub.set_desired(desired())
    pub.reconcile_once()
    pub.set_desired(desired("h100-nvl-pairs"))
    mem.fail_next("update_resource_slice", 409)
    assert pub.reconcile_once().updated == ["n1-gpu.nvidia.com-0"]

    class Racing:
        """Another writer changes the slice between our list and our update (a real 409)."""

        def __init__(self) -> None:
            self.raced = False

        def __getattr__(self, name: str) -> Any:
            return getattr(mem, name)

        def update_resource_slice(self, obj: Obj) -> Obj:
            if not self.raced:
                self.raced = True
                other = mem.get_resource_slice(obj["metadata"]["name"])
                other["metadata"]["labels"] = {"touched-by": "someone-else"}
                mem.put_resource_slice(other)
            return mem.update_resource_slice(obj)

    racing = Racing()
    pub2 = make_publisher(kube=racing)
    pub2.set_desired(desired("pcie-l4"))
    assert pub2.reconcile_once().updated == ["n1-gpu.nvidia.com-0"]
    (obj,) = mem.all_resource_slices()
    assert obj["metadata"]["labels"] == {"touched-by": "someone-else"}  # theirs kept
    assert len(obj["spec"]["devices"]) == 4
    assert [c.status for c in mem.calls if c.method == "update_resource_slice"][-2:] == [409, 200]


@pytest.mark.parametrize("status", [500, 503, 0, 429])
def test_failures_are_retried_with_capped_jittered_backoff_and_logged_once_per_step(
    mem: memory.InMemoryApi,
    make_publisher: Callable[..., publisher.Publisher],
    log: Recorder,
    status: int,
) -> None:
    delays: list[float] = []
    pub = make_publisher(
        sleep=delays.append,
        backoff=publisher.Backoff(initial_s=0.5, max_s=1.5, rng=random.Random(1)),
    )
    mem.fail_next("create_resource_slice", status, times=4)
    pub.set_desired(desired())
    pub.start()
    wait_for(pub.synced.is_set)
    assert len(mem.all_resource_slices()) == 1
    assert len(delays) == 4
    for step, delay in enumerate(delays):
        base = min(1.5, 0.5 * 2**step)
        assert base / 2 <= delay <= base
    warnings = log.of("warning")
    assert len(warnings) == 4
    assert all(w["slice"] == "n1-gpu.nvidia.com-0" and w["status"] == status for w in warnings)
    assert [w["attempt"] for w in warnings] == [1, 2, 3, 4]


def test_an_invalid_slice_is_not_sent_and_the_others_are(
    mem: memory.InMemoryApi,
    make_publisher: Callable[..., publisher.Publisher],
    log: Recorder,
    make_devices: Callable[..., model.NodeDevices],
) -> None:
    slices = desired(make_devices(130))
    slices[1]["spec"]["devices"][0]["name"] = "Not_A_Label"
    pub = make_publisher()
    pub.set_desired(slices)
    outcome = pub.reconcile_once()
    assert outcome.created == ["n1-gpu.nvidia.com-0"] and outcome.rejected == [
        "n1-gpu.nvidia.com-1"
    ]
    assert not pub.synced.is_set()
    (error,) = log.of("error")
    assert error["slice"] == "n1-gpu.nvidia.com-1"
    assert "spec.devices[0].name" in error["errors"][0]


def test_empty_pools_taints_and_quantity_spellings_cause_no_rewrites(
    mem: memory.InMemoryApi, make_publisher: Callable[..., publisher.Publisher]
) -> None:
    pub = make_publisher()
    pub.set_desired(desired(model.NodeDevices(gpus=())))
    assert pub.reconcile_once().created == ["n1-gpu.nvidia.com-0"]
    assert pub.reconcile_once().writes == 0  # the server dropped `devices: []`
    tainted = desired("pcie-l4")
    tainted[0]["spec"]["devices"][1]["taints"] = [
        {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}
    ]
    pub.set_desired(tainted)
    assert pub.reconcile_once().updated == ["n1-gpu.nvidia.com-0"]
    assert pub.reconcile_once().writes == 0  # the server's timeAdded is not a change
    respelled = mem.all_resource_slices()[0]
    plain_bytes = str(devices_of("pcie-l4").gpus[0].memory_bytes)  # "23034Mi" spelled out
    for device in respelled["spec"]["devices"]:
        assert device["capacity"]["memory"]["value"] == "23034Mi"
        device["capacity"]["memory"]["value"] = plain_bytes
    mem.put_resource_slice(respelled)
    assert pub.reconcile_once().writes == 0


def test_a_watch_that_expired_is_restarted(
    make_publisher: Callable[..., publisher.Publisher], log: Recorder
) -> None:
    small = memory.InMemoryApi(history=2)
    small.put_node("n1")
    pub = make_publisher(kube=small, resync_s=60.0)
    pub.set_desired(desired())
    pub.start()
    wait_for(pub.synced.is_set)
    for i in range(5):  # other nodes' churn pushes our watch position out of the history
        small.put_resource_slice(desired(node=f"other{i}")[0])
    small.remove_resource_slice("n1-gpu.nvidia.com-0")
    wait_for(lambda: any(s["spec"]["nodeName"] == "n1" for s in small.all_resource_slices()))


def test_backoff_is_capped_and_resets() -> None:
    backoff = publisher.Backoff(initial_s=1.0, max_s=8.0, rng=random.Random(3))
    delays = [backoff.next_delay() for _ in range(10)]
    assert all(d <= 8.0 for d in delays) and all(d >= 4.0 for d in delays[3:])
    assert len(set(delays)) == len(delays)  # jittered
    backoff.reset()
    assert 0.5 <= backoff.next_delay() <= 1.0


def test_node_agent_hook_starts_and_stops(mem: memory.InMemoryApi, log: Recorder) -> None:
    pub = publisher.start_node_publisher(
        api=mem, devices=devices_of("h100-nvl-pairs"), driver_name=DRIVER, node_name="n1", log=log
    )
    try:
        wait_for(pub.synced.is_set)
        # The agent's pool: one slice of 4 GPUs carrying their set ranks, no counters.
        (stored,) = mem.all_resource_slices()
        devices = stored["spec"]["devices"]
        assert [d["name"] for d in devices] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
        # Digit 2 of setRanks: the bridged pairs gpu-0/1, then gpu-2/3.
        assert [d["attributes"]["setRanks"]["int"] // 10 % 10 for d in devices] == [1, 1, 2, 2]
        assert "sharedCounters" not in stored["spec"]
    finally:
        pub.stop()


def test_errors_name_the_operation_and_slice() -> None:
    err = publisher.PublishError("update", "n1-x-0", api.ApiError(503, "unavailable"))
    assert str(err) == "update ResourceSlice 'n1-x-0' failed: unavailable"


def test_the_pass_observer_hears_failures_and_successes_and_cannot_break_the_loop(
    mem: memory.InMemoryApi, make_publisher: Callable[..., publisher.Publisher], log: Recorder
) -> None:
    heard: list[publisher.Outcome | None] = []

    def observer(outcome: publisher.Outcome | None) -> None:
        heard.append(outcome)
        raise RuntimeError("observer bug")

    pub = make_publisher(sleep=lambda s: None, on_pass=observer)
    mem.fail_next("create_resource_slice", 503, times=2)
    pub.set_desired(desired())
    pub.start()
    wait_for(lambda: any(o is not None for o in heard))
    assert heard[:2] == [None, None]
    success = heard[2]
    assert success is not None and success.slices == len(mem.all_resource_slices()) == 1
    failed = [
        kw for lvl, event, kw in log.lines if event == "ResourceSlice publish observer failed"
    ]
    assert failed and "observer bug" in failed[0]["error"]
