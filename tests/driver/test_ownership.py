"""Device ownership with several holders, and per-claim locks that do not pile up."""

from __future__ import annotations

import threading

import pytest

from dra_driver.driver import claims, state


def ref(uid: str) -> claims.ClaimRef:
    return claims.ClaimRef(uid=uid, namespace="ns", name=f"claim-{uid}")


def dev(
    device: str = "gpu-0", *, admin: bool = False, share: str | None = None
) -> claims.AllocatedDevice:
    return claims.AllocatedDevice(
        request="gpu", pool="n1", device=device, admin_access=admin, share_id=share, configs=()
    )


def test_a_third_claim_is_refused_even_behind_an_admin_holder() -> None:
    owners = state.Ownership()
    owners.reserve(ref("admin"), [dev(admin=True)])
    owners.reserve(ref("a"), [dev()])  # admin access does not exclude a normal holder
    with pytest.raises(state.DeviceBusy, match="already prepared for claim uid a"):
        owners.reserve(ref("b"), [dev()])
    owners.reserve(ref("watcher"), [dev(admin=True)])  # admin access is always let in
    owners.reserve(ref("a"), [dev()])  # a claim may reserve its own device again
    owners.release("a")
    owners.reserve(ref("b"), [dev()])  # the device is free again for one normal holder


def test_shares_of_a_device_coexist_but_exclude_whole_use() -> None:
    owners = state.Ownership()
    owners.reserve(ref("s1"), [dev(share="share-1")])
    owners.reserve(ref("s2"), [dev(share="share-2")])
    owners.reserve(ref("s3"), [dev(share="share-3")])  # every share holder is looked at
    with pytest.raises(state.DeviceBusy):
        owners.reserve(ref("whole"), [dev()])
    with pytest.raises(state.DeviceBusy):  # the same share twice is one share
        owners.reserve(ref("again"), [dev(share="share-2")])


def test_a_refused_claim_reserves_nothing() -> None:
    owners = state.Ownership()
    owners.reserve(ref("a"), [dev("gpu-1")])
    with pytest.raises(state.DeviceBusy):
        owners.reserve(ref("b"), [dev("gpu-0"), dev("gpu-1")])
    owners.reserve(ref("c"), [dev("gpu-0")])  # gpu-0 was not taken by the refused claim


def test_claim_locks_are_dropped_when_nobody_holds_or_waits() -> None:
    locks = state.ClaimLocks()
    entered = threading.Barrier(2, timeout=10)
    inside: list[str] = []
    release = threading.Event()

    def first() -> None:
        with locks.hold("u1"):
            inside.append("first")
            entered.wait()
            release.wait(10)

    def second() -> None:
        entered.wait()
        with locks.hold("u1"):
            inside.append("second")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    deadline = threading.Event()
    while "u1" not in locks._locks or locks._locks["u1"][1] < 2:
        deadline.wait(0.01)  # the second caller is waiting on the first's lock
    assert inside == ["first"]
    release.set()
    for t in threads:
        t.join(10)
    assert inside == ["first", "second"]
    assert locks._locks == {}
    with locks.hold("u2"), locks.hold("u3"):
        assert set(locks._locks) == {"u2", "u3"}
    assert locks._locks == {}
    with pytest.raises(RuntimeError), locks.hold("u4"):
        raise RuntimeError("a failed prepare")
    assert locks._locks == {}


def test_releasing_one_claim_keeps_the_other_holders() -> None:
    owners = state.Ownership()
    owners.reserve(ref("a"), [dev("gpu-0")])
    owners.reserve(ref("s1"), [dev("gpu-1", share="share-1")])
    owners.reserve(ref("s2"), [dev("gpu-1", share="share-2")])
    owners.release("s1")
    assert owners.holders() == {"a", "s2"}
    with pytest.raises(state.DeviceBusy, match="already prepared for claim uid a"):
        owners.reserve(ref("b"), [dev("gpu-0")])
    with pytest.raises(state.DeviceBusy, match="already prepared for claim uid s2"):
        owners.reserve(ref("b"), [dev("gpu-1")])
