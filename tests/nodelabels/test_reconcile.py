"""The Node label reconciler against the in-memory API: one PATCH on change, none at steady
state, foreign labels untouched, our labels restored after someone deletes them."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from structlog.testing import capture_logs

from dra_driver import logs
from dra_driver.devices import health
from dra_driver.nodelabels import agent, compute, reconcile
from dra_driver.slices.publisher import Backoff
from dra_driver.testing.fakeapi import memory

from .nodes import builtin

OWNED = reconcile.OWNED_ANNOTATION
FOREIGN = {
    "kubernetes.io/hostname": "n1",
    "nvidia.com/gpu.deploy.driver": "true",  # the GPU operator's, never ours
    "nvidia.com/gpu.present": "true",  # set by a cloud's node pool; we agree, so we adopt it
}


@pytest.fixture
def mem() -> memory.InMemoryApi:
    m = memory.InMemoryApi(use_default_cel=False)
    m.put_node("n1", labels=dict(FOREIGN))
    return m


def patches(mem: memory.InMemoryApi) -> int:
    return sum(1 for c in mem.calls if c.method == "patch_node")


def node_labels(mem: memory.InMemoryApi) -> dict[str, str]:
    with mem._lock:  # read without recording a call
        return dict(mem._nodes["n1"]["metadata"].get("labels") or {})


def annotation(mem: memory.InMemoryApi) -> str | None:
    with mem._lock:
        value = (mem._nodes["n1"]["metadata"].get("annotations") or {}).get(OWNED)
        return None if value is None else str(value)


class Desired:
    """What the labeler should keep: starts as dgx-1-v100's labels, tests change it."""

    def __init__(self) -> None:
        self.labels = compute.compute(builtin("dgx-1-v100")).labels

    def __call__(self) -> dict[str, str]:
        return dict(self.labels)


def labeler(
    mem: memory.InMemoryApi, desired: Callable[[], dict[str, str]]
) -> reconcile.NodeLabeler:
    return reconcile.NodeLabeler(
        kube=mem, node_name="n1", desired=desired, log=logs.get("test"), resync_s=3600
    )


def test_one_patch_then_none_at_steady_state(mem: memory.InMemoryApi) -> None:
    want = Desired()
    lab = labeler(mem, want)
    first = lab.reconcile_once()
    assert first.patched and first.removed == []
    assert first.set == sorted(set(want.labels) - {"nvidia.com/gpu.present"})  # already there
    assert node_labels(mem) == FOREIGN | want.labels
    assert annotation(mem) == ",".join(sorted(want.labels))
    mem.reset_calls()
    for _ in range(20):
        assert lab.reconcile_once() == reconcile.Outcome()
    assert [c.method for c in mem.calls] == ["get_node"] * 20  # zero writes


def test_restores_what_someone_deletes_or_changes(mem: memory.InMemoryApi) -> None:
    lab = labeler(mem, Desired())
    lab.reconcile_once()
    mem.label_node("n1", {"nvidia.com/gpu.product": None, "nvidia.com/gpu.count": "99"})
    mem.reset_calls()
    outcome = lab.reconcile_once()
    assert outcome == reconcile.Outcome(
        patched=True, set=["nvidia.com/gpu.count", "nvidia.com/gpu.product"], removed=[]
    )
    assert node_labels(mem)["nvidia.com/gpu.product"] == "Tesla-V100-SXM2-32GB"
    assert node_labels(mem)["nvidia.com/gpu.count"] == "8"
    assert patches(mem) == 1


def test_foreign_labels_are_never_touched(mem: memory.InMemoryApi) -> None:
    want = Desired()
    lab = labeler(mem, want)
    lab.reconcile_once()
    mem.label_node("n1", {"nvidia.com/custom": "mine", "team": "ml"})
    want.labels = {}  # the GPUs are gone: every label we set goes, nothing else
    outcome = lab.reconcile_once()
    assert set(outcome.removed) == set(compute.compute(builtin("dgx-1-v100")).labels)
    assert node_labels(mem) == {
        "kubernetes.io/hostname": "n1",
        "nvidia.com/gpu.deploy.driver": "true",
        "nvidia.com/custom": "mine",
        "team": "ml",
    }  # gpu.present was ours too: we took it over with the same value
    assert annotation(mem) is None
    mem.reset_calls()
    assert lab.reconcile_once() == reconcile.Outcome()
    assert patches(mem) == 0


def test_labels_we_stop_computing_are_removed_and_the_rest_stays(
    mem: memory.InMemoryApi,
) -> None:
    want = Desired()
    lab = labeler(mem, want)
    lab.reconcile_once()
    want.labels = {k: v for k, v in want.labels.items() if "cuda.driver" not in k}
    want.labels["nvidia.com/gpu.count"] = "7"
    outcome = lab.reconcile_once()
    assert outcome.set == ["nvidia.com/gpu.count"]
    assert len(outcome.removed) == 7 and all("cuda.driver" in k for k in outcome.removed)
    assert annotation(mem) == ",".join(sorted(want.labels))


def test_a_tampered_annotation_cannot_make_us_remove_other_labels(mem: memory.InMemoryApi) -> None:
    with mem._lock:
        mem._nodes["n1"]["metadata"]["annotations"] = {
            OWNED: "kubernetes.io/hostname,team,nvidia.com/gpu.deploy.driver"
        }
    lab = labeler(mem, lambda: {})
    outcome = lab.reconcile_once()
    assert outcome.removed == [
        "nvidia.com/gpu.deploy.driver"
    ]  # ours by the record, under nvidia.com/
    assert node_labels(mem)["kubernetes.io/hostname"] == "n1"
    with pytest.raises(ValueError, match=r"outside nvidia\.com/"):
        reconcile.plan(mem.get_node("n1"), {"team": "x"})


def test_labels_already_right_only_record_ownership(mem: memory.InMemoryApi) -> None:
    want = Desired()
    mem.label_node("n1", dict(want.labels))  # e.g. left by GFD or an earlier agent
    patch = reconcile.plan(mem.get_node("n1"), want.labels)
    assert patch == {"metadata": {"annotations": {OWNED: ",".join(sorted(want.labels))}}}
    outcome = labeler(mem, want).reconcile_once()
    assert outcome == reconcile.Outcome(patched=True)


def test_errors_name_the_operation(mem: memory.InMemoryApi) -> None:
    missing = reconcile.NodeLabeler(
        kube=mem, node_name="n9", desired=Desired(), log=logs.get("test")
    )
    with pytest.raises(reconcile.LabelSyncError, match="get Node 'n9' failed") as err:
        missing.reconcile_once()
    assert err.value.cause.status == 404
    mem.fail_next("patch_node", 422, message="admission webhook denied the request")
    with pytest.raises(reconcile.LabelSyncError, match="patch Node 'n1' failed: admission"):
        labeler(mem, Desired()).reconcile_once()


class Passes:
    """Records each pass of the loop and lets a test wait for the next ones."""

    def __init__(self) -> None:
        self.seen: list[reconcile.Outcome | None] = []
        self._cond = threading.Condition()

    def __call__(self, outcome: reconcile.Outcome | None) -> None:
        with self._cond:
            self.seen.append(outcome)
            self._cond.notify_all()

    def wait(self, count: int, timeout: float = 30.0) -> list[reconcile.Outcome | None]:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.seen) >= count, timeout), self.seen
            return list(self.seen)

    def until(self, condition: Callable[[], bool], most: int = 400) -> None:
        """Wait pass by pass until ``condition`` holds (at most ``most`` more passes)."""
        start = len(self.seen)
        while not condition():
            assert len(self.wait(len(self.seen) + 1)) - start < most, "never happened"


@pytest.fixture
def running() -> Iterator[list[Any]]:
    started: list[Any] = []
    yield started
    for item in started:
        item.stop()


def test_the_loop_backs_off_on_failures_and_recovers(
    mem: memory.InMemoryApi, running: list[Any]
) -> None:
    mem.fail_next("get_node", 503, times=2)
    passes = Passes()
    lab = reconcile.NodeLabeler(
        kube=mem,
        node_name="n1",
        desired=Desired(),
        log=logs.get("test"),
        resync_s=3600,
        backoff=Backoff(initial_s=0.01, max_s=0.05),
        on_pass=passes,
    )
    with capture_logs() as logged:
        lab.start()
        running.append(lab)
        seen = passes.wait(3)
    assert seen[:2] == [None, None] and seen[2] is not None and seen[2].patched
    warnings = [e for e in logged if e["event"] == "cannot keep the node's GPU labels"]
    assert [(w["op"], w["status"], w["attempt"]) for w in warnings] == [
        ("get", 503, 1),
        ("get", 503, 2),
    ]


def test_agent_follows_health_and_resyncs(mem: memory.InMemoryApi, running: list[Any]) -> None:
    devices = builtin("dgx-h100")
    board = health.HealthBoard()
    passes = Passes()
    handle = agent.start(
        kube=mem,
        node_name="n1",
        devices=devices,
        settings=compute.Settings(),
        source=board,
        log=logs.get("test"),
        resync_s=0.05,
        on_pass=passes,
    )
    running.append(handle)
    passes.wait(1)
    assert node_labels(mem)["nvidia.com/gpu.count"] == "8"
    board.mark_unhealthy(devices.gpus[2].uuid, "XID 79")
    passes.until(lambda: node_labels(mem)["nvidia.com/gpu.count"] == "7")
    board.mark_healthy(devices.gpus[2].uuid)
    passes.until(lambda: node_labels(mem)["nvidia.com/gpu.count"] == "8")
    # many resyncs later: still exactly three patches (initial, unhealthy, healthy again)
    passes.wait(len(passes.seen) + 10)
    assert patches(mem) == 3
    mem.label_node("n1", {"nvidia.com/gpu.product": None})  # someone deletes a label
    passes.until(lambda: "nvidia.com/gpu.product" in node_labels(mem))
    assert patches(mem) == 4


def test_a_health_change_relabels_at_once_not_at_the_next_resync(
    mem: memory.InMemoryApi, running: list[Any]
) -> None:
    devices = builtin("dgx-h100")
    board = health.HealthBoard()
    passes = Passes()
    handle = agent.start(
        kube=mem,
        node_name="n1",
        devices=devices,
        settings=compute.Settings(),
        source=board,
        log=logs.get("test"),
        resync_s=3600,  # only the change itself can trigger the next pass
        on_pass=passes,
    )
    running.append(handle)
    passes.wait(1)
    with capture_logs() as logged:
        board.mark_unhealthy(devices.gpus[2].uuid, "XID 79")
        passes.wait(2, timeout=5)
    assert node_labels(mem)["nvidia.com/gpu.count"] == "7"
    assert [e["event"] for e in logged if e["log_level"] == "info"] == [
        "device health changed; re-checking node labels",
        "node labels updated",
    ]
    assert not [e for e in logged if e["event"] == "health subscriber failed"]
    handle.stop()
    handle.stop()  # a second stop (the CLI's and the app's) is harmless


def test_the_agent_labels_with_the_settings_it_was_given(
    mem: memory.InMemoryApi, running: list[Any]
) -> None:
    passes = Passes()
    running.append(
        agent.start(
            kube=mem,
            node_name="n1",
            devices=builtin("pcie-l4"),
            settings=compute.Settings(replicas=4),  # the device plugin's time-slicing
            source=health.HealthBoard(),
            log=logs.get("test"),
            on_pass=passes,
        )
    )
    passes.wait(1)
    labels = node_labels(mem)
    assert labels["nvidia.com/gpu.replicas"] == "4"
    assert labels["nvidia.com/gpu.product"].endswith("-SHARED")


def test_stop_is_prompt_ends_the_thread_and_unsubscribes(mem: memory.InMemoryApi) -> None:
    board = health.HealthBoard()
    handle = agent.start(
        kube=mem,
        node_name="n1",
        devices=builtin("pcie-l4"),
        settings=compute.Settings(),
        source=board,
        log=logs.get("test"),
    )
    assert len(board._subscribers) == 1
    started = time.monotonic()
    handle.stop()
    assert time.monotonic() - started < 0.5  # nothing waits out a poll period
    assert not any(t.name.startswith("node-labels") for t in threading.enumerate())
    assert board._subscribers == []
    with capture_logs() as logged:
        board.mark_unhealthy(builtin("pcie-l4").gpus[0].uuid, "XID 79")
    assert logged == []  # a stopped labeler hears of no change


def test_warnings_about_the_choice_are_logged_once(mem: memory.InMemoryApi) -> None:
    with capture_logs() as logged:
        handle = agent.start(
            kube=mem,
            node_name="n1",
            devices=builtin("a100-mig"),
            settings=compute.Settings(mig_strategy="single"),
            source=health.HealthBoard(),
            log=logs.get("test"),
        )
        handle.stop()
    problems = [e["problem"] for e in logged if e["event"] == "node labels"]
    assert len(problems) == 1 and "MIG strategy single cannot serve" in problems[0]
