"""The per-claim loop feeds the metrics: one timed, counted request and one log event per claim,
the prepared gauges after every call, and the claim lock around each claim's work."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import structlog.testing

from dra_driver import metrics
from dra_driver.driver import claims
from dra_driver.driver import driver as driver_mod

from .conftest import Node, claim_obj, new_uid


def sample(m: metrics.DriverMetrics, name: str, **labels: str) -> float:
    value = m.registry.get_sample_value(name, labels)
    assert value is not None, name
    return value


def test_counts_gauges_and_one_event_per_claim(node: Node) -> None:
    m = node.driver.metrics
    good = node.add(claim_obj(name="good", uid=new_uid(), devices=["gpu-0", "gpu-1"]))
    missing = claims.ClaimRef(uid=new_uid(), namespace="default", name="missing")
    with structlog.testing.capture_logs() as events:
        answers = node.driver.prepare([good, missing])
    assert answers[good.uid].error == "" and "not found" in answers[missing.uid].error
    assert sample(m, "dra_driver_requests_total", operation="prepare", result="success") == 1
    assert sample(m, "dra_driver_requests_total", operation="prepare", result="error") == 1
    assert (sample(m, "dra_driver_prepared_claims"), sample(m, "dra_driver_prepared_devices")) == (
        1,
        2,
    )
    summaries = [e for e in events if e.get("operation") == "prepare"]
    assert len(summaries) == 2
    by_uid = {e["claim_uid"]: e for e in summaries}
    assert by_uid[good.uid]["devices"] == ["gpu-0", "gpu-1"]
    assert by_uid[good.uid]["claim_name"] == "good" and by_uid[good.uid]["result"] == "success"
    assert by_uid[missing.uid]["result"] == "error"
    assert by_uid[missing.uid]["error"] == answers[missing.uid].error
    assert not [e for e in events if e["log_level"] == "error"]  # the summary says it all

    with structlog.testing.capture_logs() as events:
        assert node.driver.unprepare([good, missing]) == {good.uid: "", missing.uid: ""}
    assert sample(m, "dra_driver_requests_total", operation="unprepare", result="success") == 2
    assert sample(m, "dra_driver_prepared_claims") == 0
    assert len([e for e in events if e.get("operation") == "unprepare"]) == 2


def test_gauges_start_from_the_recovered_checkpoint(node: Node) -> None:
    ref = node.add(claim_obj(name="c", uid=new_uid(), devices=["gpu-3"]))
    assert node.driver.prepare([ref])[ref.uid].error == ""
    restarted = node.restart()
    assert sample(restarted.metrics, "dra_driver_prepared_claims") == 1
    assert sample(restarted.metrics, "dra_driver_prepared_devices") == 1


def test_the_claim_lock_wraps_each_claim(node_factory: Callable[..., Node]) -> None:
    node = node_factory()
    held: list[str] = []

    @contextlib.contextmanager
    def lock(uid: str) -> Iterator[None]:
        held.append(uid)
        yield

    driver = driver_mod.Driver(
        claim_state=node.driver.state, log=node.driver.log, claim_lock=lock, workers=4
    )
    try:
        refs = [
            node.add(claim_obj(name=f"c{i}", uid=new_uid(), devices=[f"gpu-{i}"])) for i in (0, 1)
        ]
        assert all(not r.error for r in driver.prepare(refs).values())
        assert sorted(held) == sorted(r.uid for r in refs)

        @contextlib.contextmanager
        def broken(uid: str) -> Iterator[None]:
            raise claims.ClaimError(f"lock for {uid} is unavailable")
            yield

        other = driver_mod.Driver(
            claim_state=node.driver.state, log=node.driver.log, claim_lock=broken
        )
        assert "unavailable" in other.unprepare(refs[:1])[refs[0].uid]
        assert (
            sample(
                other.metrics, "dra_driver_requests_total", operation="unprepare", result="error"
            )
            == 1
        )
        other.close()
    finally:
        driver.close()
