"""The fault suite's double-allocation check: the one rule every row's audit relies on."""

from __future__ import annotations

from dra_driver.testing.faultsuite import rig


def test_a_device_held_by_two_prepared_claims_is_one_line() -> None:
    results = {
        "a": [{"device": "gpu-0"}, {"device": "gpu-1"}],
        "b": [{"device": "gpu-0"}],
        "c": [{"device": "gpu-1"}],  # not prepared: its results do not count
    }
    found = rig.Audit(prepared={"a", "b"})
    assert rig.double_allocations(found, results) == [
        "gpu-0 is held by 2 claims at once (double allocation)"
    ]


def test_admin_access_may_share_a_device() -> None:
    results = {"a": [{"device": "gpu-0"}], "b": [{"device": "gpu-0", "adminAccess": True}]}
    assert rig.double_allocations(rig.Audit(prepared={"a", "b"}), results) == []
