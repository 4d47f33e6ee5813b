"""Crash at every point of preparing and unpreparing GPU shares: no daemon, compute mode or spec
is left behind that no prepared claim owns, and every prepared share's daemon runs.

As in ``test_crash_points.py``, a forked child runs prepare/unprepare and dies right before its
N-th file operation (fsync, link, pwrite, rename, unlink), for N = 0, 1, ... until it gets
through; the MPS daemons it started outlive it (as they outlive a SIGKILLed agent). After each
crash the driver is rebuilt from disk (recovery adopts, restarts or stops daemons) and the
invariants are checked.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from dra_driver.driver import checkpoint

from . import sharekit
from .conftest import Node
from .sharekit import share, share_claim
from .test_crash_points import CRASHED, _run_child


def _check(node: Node) -> None:
    records = {p.stem: json.loads(p.read_text()) for p in node.claims_dir.glob("*.json")}
    assert all(r["state"] == checkpoint.PREPARE_COMPLETED for r in records.values())
    assert set(node.spec_files()) == {f"k8s.gpu.nvidia.com-claim_{u}.json" for u in records}
    wanted: dict[str, set[str]] = {}
    for record in records.values():
        for dev in record["devices"]:
            if dev["mpsDaemon"]:
                wanted.setdefault(dev["mpsDaemon"], set()).add(dev["deviceName"])
    daemons = sharekit.daemon_records(node)
    assert set(daemons) == set(wanted)
    assert all(d["state"] == "Running" for d in daemons.values())
    assert sharekit.daemon_pids(node) == {name: d["pid"] for name, d in daemons.items()}
    assert sharekit.daemon_dirs(node) == set(wanted)
    serving = {sharekit.uuid_of(node, n) for names in wanted.values() for n in names}
    assert sharekit.exclusive_gpus(node) == serving
    assert not [p for p in (sharekit.mps_root(node) / "daemons").glob(".*")]


@pytest.mark.parametrize("scenario", ["prepare", "unprepare"])
def test_a_crash_anywhere_in_share_preparation_leaves_nothing_behind(
    node: Node, scenario: str
) -> None:
    node.restart(serial=True)
    first = node.add(share_claim("first", share("gpu-0", memory="20Gi", compute="30")))
    second = node.add(share_claim("second", share("gpu-0", memory="30Gi")))
    other = node.add(share_claim("other", share("gpu-1", memory="10Gi", compute="50")))
    refs = [first, second, other]
    if scenario == "unprepare":
        assert {r.error for r in node.driver.prepare(refs).values()} == {""}

    def work() -> None:
        if scenario == "prepare":
            node.driver.prepare(refs)
        else:
            node.driver.unprepare(refs)

    crash_at = 0
    while (code := _run_child(node, crash_at, work)) == CRASHED:
        driver = node.restart(serial=True)
        _check(node)
        if scenario == "prepare":  # back to the start: nothing prepared
            assert set(driver.unprepare(refs).values()) == {""}
            assert sharekit.daemon_records(node) == {}
        else:
            assert {r.error for r in driver.prepare(refs).values()} == {""}
        crash_at += 1
    assert code == 0
    assert crash_at > 10  # the daemons' steps are in there: far more windows than specs alone
    node.restart(serial=True)
    _check(node)
    expected: dict[str, Any] = {"prepare": {"gpu-0", "gpu-1"}, "unprepare": set()}
    assert set(sharekit.daemon_records(node)) == expected[scenario]
    assert set(node.driver.unprepare(refs).values()) == {""}
    assert sharekit.daemon_records(node) == {} and sharekit.daemon_pids(node) == {}
    assert sharekit.exclusive_gpus(node) == set()
