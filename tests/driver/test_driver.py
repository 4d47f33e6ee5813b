"""Prepare / unprepare behaviour of the driver core over real files and an in-memory API."""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import structlog

from dra_driver import logs
from dra_driver.driver import checkpoint, claims, results
from dra_driver.driver import driver as driver_mod
from dra_driver.kube import api as kube

from .conftest import Node, claim_obj, gpu_config, new_uid, opaque


def prepared_ok(result: results.PrepareResult) -> tuple[results.PreparedDevice, ...]:
    assert result.error == ""
    return result.devices


def test_prepare_writes_spec_and_checkpoint_then_unprepare_removes_both(node: Node) -> None:
    ref = node.add(
        claim_obj(name="a", uid=new_uid(), devices=["gpu-0", "gpu-1"], request="gpu/h100")
    )
    devices = prepared_ok(node.driver.prepare([ref])[ref.uid])
    assert [(d.request_names, d.pool_name, d.device_name) for d in devices] == [
        (("gpu",), "n1", "gpu-0"),
        (("gpu",), "n1", "gpu-1"),
    ]
    assert devices[0].cdi_device_ids == (f"k8s.gpu.nvidia.com/claim={ref.uid}-gpu-0",)
    assert node.spec_files() == [f"k8s.gpu.nvidia.com-claim_{ref.uid}.json"]
    rec = json.loads((node.claims_dir / f"{ref.uid}.json").read_text())
    assert rec["state"] == "PrepareCompleted" and rec["bootId"] == "boot-1"
    assert node.driver.unprepare([ref]) == {ref.uid: ""}
    assert node.spec_files() == [] and not list(node.claims_dir.glob("*.json"))
    assert node.driver.unprepare([ref]) == {ref.uid: ""}  # idempotent


def test_repeated_prepare_answers_from_checkpoint_without_api(node: Node) -> None:
    ref = node.add(claim_obj(name="a", uid=new_uid(), devices=["gpu-2"]))
    first = node.driver.prepare([ref])[ref.uid]
    node.api.delete_resource_claim("default", "a")
    assert node.driver.prepare([ref])[ref.uid] == first


def test_same_claim_twice_at_once_is_prepared_once(node: Node) -> None:
    ref = node.add(claim_obj(name="a", uid=new_uid(), devices=["gpu-0"]))
    node.api.reset_calls()
    barrier = threading.Barrier(4)
    answers: list[Any] = []

    def call() -> None:
        barrier.wait()
        answers.append(node.driver.prepare([ref, ref])[ref.uid])

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({a.devices for a in answers}) == 1 and not answers[0].error
    calls = [c.method for c in node.api.calls if c.method != "apply_resource_claim_status"]
    assert calls == ["get_resource_claim"]  # (status.devices is written in the background)


def test_unprepare_works_after_the_claim_is_deleted_and_unknown_claims_succeed(
    node: Node,
) -> None:
    ref = node.add(claim_obj(name="a", uid=new_uid(), devices=["gpu-0"]))
    prepared_ok(node.driver.prepare([ref])[ref.uid])
    node.api.delete_resource_claim("default", "a")
    stranger = claims.ClaimRef(uid=new_uid(), namespace="x", name="never-seen")
    assert node.driver.unprepare([ref, stranger]) == {ref.uid: "", stranger.uid: ""}
    assert node.spec_files() == []


def test_device_of_another_claim_is_refused_unless_admin_access(node: Node) -> None:
    a = node.add(claim_obj(name="a", uid=new_uid(), devices=["gpu-0"]))
    b = node.add(claim_obj(name="b", uid=new_uid(), devices=["gpu-1", "gpu-0"]))
    admin_uid = new_uid()
    admin = node.add(
        claim_obj(
            name="admin",
            uid=admin_uid,
            results=[
                {
                    "request": "gpu",
                    "driver": "gpu.nvidia.com",
                    "pool": "n1",
                    "device": "gpu-0",
                    "adminAccess": True,
                }
            ],
        )
    )
    prepared_ok(node.driver.prepare([a])[a.uid])
    err = node.driver.prepare([b])[b.uid].error
    assert "device n1/gpu-0 is already prepared for claim uid " + a.uid in err
    assert "default/b" in err
    assert node.spec_files() == [f"k8s.gpu.nvidia.com-claim_{a.uid}.json"]  # b left nothing
    prepared_ok(node.driver.prepare([admin])[admin.uid])
    node.driver.unprepare([a])
    prepared_ok(node.driver.prepare([b])[b.uid])  # free again


def test_shares_of_a_multi_allocatable_device_may_coexist(node: Node) -> None:
    def share(name: str, sid: str) -> claims.ClaimRef:
        return node.add(
            claim_obj(
                name=name,
                uid=new_uid(),
                results=[
                    {
                        "request": "gpu",
                        "driver": "gpu.nvidia.com",
                        "pool": "n1",
                        "device": "gpu-5",
                        "shareID": sid,
                    }
                ],
            )
        )

    one = share("s1", "11111111-1111-4111-8111-111111111111")
    two = share("s2", "22222222-2222-4222-8222-222222222222")
    got = node.driver.prepare([one, two])
    assert not got[one.uid].error and not got[two.uid].error
    assert got[one.uid].devices[0].share_id == "11111111-1111-4111-8111-111111111111"


def test_batch_gives_each_claim_its_own_answer(node: Node) -> None:
    good = node.add(claim_obj(name="good", uid=new_uid(), devices=["gpu-0"]))
    replaced = node.add(claim_obj(name="replaced", uid=new_uid(), devices=["gpu-1"]))
    replaced_old = claims.ClaimRef(uid=new_uid(), namespace="default", name="replaced")
    unallocated = node.add(claim_obj(name="u", uid=new_uid(), allocated=False))
    other_driver = node.add(
        claim_obj(name="o", uid=new_uid(), devices=["eth0"], driver="net.example.com")
    )
    other_pool = node.add(claim_obj(name="p", uid=new_uid(), devices=["gpu-3"], pool="n2"))
    unknown_device = node.add(claim_obj(name="d", uid=new_uid(), devices=["gpu-99"]))
    bad_config = node.add(
        claim_obj(
            name="cfg",
            uid=new_uid(),
            devices=["gpu-4"],
            config=[opaque(gpu_config(sharing={"strategy": "Lots"}))],
        )
    )
    missing = claims.ClaimRef(uid=new_uid(), namespace="default", name="missing")
    bad_uid = claims.ClaimRef(uid="../../etc", namespace="default", name="good")
    no_name = claims.ClaimRef(uid=new_uid(), namespace="", name="")
    refs = [
        good,
        replaced_old,
        unallocated,
        other_driver,
        other_pool,
        unknown_device,
        bad_config,
        missing,
        bad_uid,
        no_name,
    ]
    got = node.driver.prepare(refs)
    assert list(got) == [r.uid for r in refs]
    assert not got[good.uid].error
    expect = {
        replaced_old.uid: "claim was replaced",
        unallocated.uid: "not allocated",
        other_driver.uid: "has no devices of driver gpu.nvidia.com",
        other_pool.uid: "n2/gpu-3 of driver gpu.nvidia.com are not in this node's pool",
        unknown_device.uid: "device n1/gpu-99 (request gpu) is not a device of this node",
        bad_config.uid: "field sharing.strategy",
        missing.uid: "not found in the API server",
        bad_uid.uid: "invalid claim uid",
        no_name.uid: "namespace and name are required",
    }
    for uid, text in expect.items():
        assert text in got[uid].error, (uid, got[uid].error)
        assert got[uid].devices == ()
    assert node.spec_files() == [f"k8s.gpu.nvidia.com-claim_{good.uid}.json"]
    assert replaced.uid != replaced_old.uid


def test_api_errors_and_unexpected_exceptions_stay_per_claim(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = node.add(claim_obj(name="a", uid=new_uid(), devices=["gpu-0"]))
    b = node.add(claim_obj(name="b", uid=new_uid(), devices=["gpu-1"]))
    node.api.fail_next("get_resource_claim", status=503)
    got = node.driver.prepare([a])
    assert "cannot read it from the API server (HTTP 503)" in got[a.uid].error
    real = node.driver.state.specs.build

    def explode(ref: claims.ClaimRef, planned: Any, **kwargs: Any) -> Any:
        if ref.uid == a.uid:
            raise RuntimeError("boom")
        return real(ref, planned, **kwargs)

    monkeypatch.setattr(node.driver.state.specs, "build", explode)
    got = node.driver.prepare([a, b])
    assert "internal error: RuntimeError: boom" in got[a.uid].error
    assert not got[b.uid].error


def test_failure_after_started_record_rolls_back(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = node.add(claim_obj(name="a", uid=new_uid(), devices=["gpu-0"]))

    def fail(uid: str, spec: Any, text: str | None = None) -> Any:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(node.driver.state.specs, "write", fail)
    assert "No space left" in node.driver.prepare([ref])[ref.uid].error
    assert not list(node.claims_dir.glob("*.json")) and node.spec_files() == []
    monkeypatch.undo()
    prepared_ok(node.driver.prepare([ref])[ref.uid])  # the device was released


def test_cleanup_unprepares_claims_gone_from_the_api(node: Node) -> None:
    keep = node.add(claim_obj(name="keep", uid=new_uid(), devices=["gpu-0"]))
    gone = node.add(claim_obj(name="gone", uid=new_uid(), devices=["gpu-1"]))
    swapped = node.add(claim_obj(name="swapped", uid=new_uid(), devices=["gpu-2"]))
    node.driver.prepare([keep, gone, swapped])
    node.api.delete_resource_claim("default", "gone")
    node.api.delete_resource_claim("default", "swapped")
    node.add(claim_obj(name="swapped", uid=new_uid(), devices=["gpu-2"]))
    node.api.fail_next("get_resource_claim", status=500)  # the first check fails: retried later
    first = {r.uid for r in node.driver.cleanup()}
    second = {r.uid for r in node.driver.cleanup()}
    assert first | second == {gone.uid, swapped.uid}
    assert node.spec_files() == [f"k8s.gpu.nvidia.com-claim_{keep.uid}.json"]


def test_the_cleanup_loop_unprepares_a_deleted_claim_on_its_own(node: Node) -> None:
    ref = node.add(claim_obj(name="gone", uid=new_uid(), devices=["gpu-1"]))
    prepared_ok(node.driver.prepare([ref])[ref.uid])
    node.api.delete_resource_claim("default", "gone")
    loop = driver_mod.CleanupLoop(driver=node.driver, interval_s=0.01, log=logs.get("test"))
    assert loop.interval_s == 0.01 and loop._thread.name == "claim-cleanup"
    assert loop._failed == "claim clean-up failed; will retry"
    loop.start()
    try:
        deadline = time.monotonic() + 20
        while node.spec_files() and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        loop.stop()
    assert node.spec_files() == [] and node.driver.state.store.records() == []


def test_cleanup_releases_devices_held_without_a_prepared_claim(node: Node) -> None:
    stray = claims.ClaimRef(uid=new_uid(), namespace="default", name="rolled-back")
    gpu3 = claims.AllocatedDevice(
        request="gpu", pool="n1", device="gpu-3", admin_access=False, share_id=None, configs=()
    )
    node.driver.state.ownership.reserve(stray, [gpu3])  # what a rollback that died leaves
    ref = node.add(claim_obj(name="next", uid=new_uid(), devices=["gpu-3"]))
    assert "already prepared for claim uid" in node.driver.prepare([ref])[ref.uid].error
    with structlog.testing.capture_logs() as logged:
        assert node.driver.cleanup() == []
    assert [(e["event"], e.get("claim_uid")) for e in logged if e["log_level"] == "warning"] == [
        ("released devices held without a prepared claim", stray.uid)
    ]
    prepared_ok(node.driver.prepare([ref])[ref.uid])


def test_restart_recovers_started_completed_orphans_and_lost_specs(node: Node) -> None:
    done = node.add(claim_obj(name="done", uid=new_uid(), devices=["gpu-0"]))
    lost = node.add(claim_obj(name="lost", uid=new_uid(), devices=["gpu-1"]))
    node.driver.prepare([done, lost])
    half_uid = new_uid()
    record = node.driver.state.store.get(done.uid)
    assert record is not None
    half = dataclasses.replace(record, uid=half_uid, state=checkpoint.PREPARE_STARTED)
    node.driver.state.store.put(half)
    node.driver.state.specs.write(half_uid, record.cdiSpec)
    orphan_uid = new_uid()
    node.driver.state.specs.write(orphan_uid, record.cdiSpec)
    node.driver.state.specs.remove(lost.uid)
    (node.cdi_root / "someone-else.json").write_text("{}")
    driver = node.restart()
    assert node.spec_files() == sorted(
        [
            f"k8s.gpu.nvidia.com-claim_{done.uid}.json",
            f"k8s.gpu.nvidia.com-claim_{lost.uid}.json",
            "someone-else.json",
        ]
    )
    assert sorted(r.uid for r in driver.state.store.records()) == sorted([done.uid, lost.uid])
    # Ownership survived the restart.
    thief = node.add(claim_obj(name="thief", uid=new_uid(), devices=["gpu-0"]))
    assert "already prepared" in driver.prepare([thief])[thief.uid].error


def test_reboot_forgets_everything_and_removes_our_specs(node: Node) -> None:
    ref = node.add(claim_obj(name="a", uid=new_uid(), devices=["gpu-0"]))
    node.driver.prepare([ref])
    node.settings.boot_id_file.write_text("boot-2\n")
    driver = node.restart()
    assert driver.state.store.records() == [] and node.spec_files() == []
    assert not driver.prepare([ref])[ref.uid].error  # and the device is free again


def test_parallel_prepare_beats_serial(node_factory: Callable[..., Node]) -> None:
    """32 claims: the pool overlaps the (slow) API GETs; serial mode does not."""

    def timed(serial: bool) -> float:
        n = node_factory(serial=serial)
        refs = [
            n.add(
                claim_obj(name=f"c{i}", uid=new_uid(), devices=[f"gpu-{i % 8}"], namespace=f"ns{i}")
            )
            for i in range(8)
        ]
        real_get = n.api.get_resource_claim

        def slow_get(namespace: str, name: str) -> kube.Obj:
            time.sleep(0.05)
            return real_get(namespace, name)

        n.api.get_resource_claim = slow_get  # type: ignore[method-assign]
        start = time.perf_counter()
        got = n.driver.prepare(refs)
        assert all(not r.error for r in got.values())
        return time.perf_counter() - start

    assert timed(serial=True) > 0.4
    assert timed(serial=False) < 0.3


def test_unprepare_says_whether_the_claim_was_prepared_here(node: Node) -> None:
    ref = node.add(claim_obj(name="a", uid=new_uid(), devices=["gpu-0"]))
    prepared_ok(node.driver.prepare([ref])[ref.uid])
    level = structlog.get_config()["wrapper_class"]  # other tests may have set info
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    try:
        with structlog.testing.capture_logs() as logged:
            assert node.driver.unprepare([ref]) == {ref.uid: ""}
            assert node.driver.unprepare([ref]) == {ref.uid: ""}
    finally:
        structlog.configure(wrapper_class=level)
    debug = [
        (e["event"], e["claim_uid"])
        for e in logged
        if e["log_level"] == "debug" and e.get("component") != "claim-status"  # background
    ]
    assert debug == [
        ("unprepared claim", ref.uid),
        ("unprepare of a claim not prepared here", ref.uid),
    ]


def test_an_unexpected_failure_is_an_internal_error_naming_the_claim_and_operation(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = node.add(claim_obj(name="a", uid=new_uid(), devices=["gpu-0"]))

    def broken(*args: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(node.driver.state, "prepare", broken)
    monkeypatch.setattr(node.driver.state, "unprepare", broken)
    assert node.driver.prepare([ref])[ref.uid].error == (
        f"{ref}: prepare failed: internal error: RuntimeError: a bug"
    )
    assert node.driver.unprepare([ref]) == {
        ref.uid: f"{ref}: unprepare failed: internal error: RuntimeError: a bug"
    }


def test_a_failing_gauge_update_never_costs_the_answer(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = node.add(claim_obj(name="a", uid=new_uid(), devices=["gpu-0"]))

    def broken() -> None:
        raise OSError("checkpoint directory went away")

    monkeypatch.setattr(node.driver, "update_gauges", broken)
    with structlog.testing.capture_logs() as logged:
        prepared_ok(node.driver.prepare([ref])[ref.uid])
    assert [e["event"] for e in logged if e["log_level"] == "error"] == [
        "cannot update the prepared-claims gauges"
    ]


def test_a_bad_config_names_the_claim_it_belongs_to(node: Node) -> None:
    params = gpu_config(sharing={"strategy": "Exclusive"}, colour="blue")
    ref = node.add(claim_obj(name="a", uid=new_uid(), devices=["gpu-0"], config=[opaque(params)]))
    error = node.driver.prepare([ref])[ref.uid].error
    assert error == f"{ref}: opaque config[0] (FromClaim): field colour: unknown field"


def test_restart_rewrites_only_specs_that_are_missing_or_differ(node: Node) -> None:
    same = node.add(claim_obj(name="same", uid=new_uid(), devices=["gpu-0"]))
    lost = node.add(claim_obj(name="lost", uid=new_uid(), devices=["gpu-1"]))
    node.driver.prepare([same, lost])
    node.driver.state.specs.remove(lost.uid)
    with structlog.testing.capture_logs() as logged:
        node.restart()
    warned = [(e["event"], e.get("claim_uid")) for e in logged if e["log_level"] == "warning"]
    assert warned == [("restored the missing CDI spec of a prepared claim", lost.uid)]
    assert len(node.spec_files()) == 2


def test_restart_reports_a_prepared_claim_it_cannot_take_back(node: Node) -> None:
    ref = node.add(claim_obj(name="a", uid=new_uid(), devices=["gpu-0"]))
    prepared_ok(node.driver.prepare([ref])[ref.uid])
    record = node.driver.state.store.get(ref.uid)
    assert record is not None
    twin = dataclasses.replace(record, uid=new_uid(), name="twin")
    node.driver.state.store.put(twin)  # a second record of the same GPU (a corrupted state)
    node.driver.state.specs.write(twin.uid, twin.cdiSpec)
    with structlog.testing.capture_logs() as logged:
        node.restart()
    [line] = [e for e in logged if e["log_level"] == "error"]
    assert line["event"] == "prepared claim is inconsistent after restart"
    assert "device n1/gpu-0 is already prepared for claim uid" in line["error"]
