"""Dynamic MIG survives a crash at *every* step: no orphan instance, no lost one.

As in ``test_crash_points.py``, a forked child prepares (or unprepares) claims and dies right
before its N-th durable effect — now also every change the NVML stand-in makes to the card's MIG
state (MIG mode, GPU and compute instances: each is one atomic file replace, like one NVML call
on a card). The parent restarts the plugin core from disk, as after a SIGKILL, and checks: every
instance on the GPUs is owned by a prepared claim, every prepared claim's instance exists, and
the claims prepare and unprepare cleanly again.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from dra_driver.devices.fake import migstate

from .conftest import Node, claim_obj, new_uid
from .test_crash_points import CRASHED, _check_consistent, _run_child


def _owned(node: Node) -> set[tuple[str, int, int]]:
    owned = set()
    for path in node.claims_dir.glob("*.json"):
        for dev in json.loads(path.read_text())["devices"]:
            if dev["mig"] is not None:
                mig = dev["mig"]
                owned.add((mig["parentUUID"], mig["profileId"], mig["placementStart"]))
    return owned


def _present(node: Node) -> set[tuple[str, int, int]]:
    found = migstate.MigState({}, state_file=node.settings.fake_mig_state).read()
    return {(gpu, i.profileId, i.start) for gpu, g in found.items() for i in g.instances}


@pytest.mark.parametrize("scenario", ["prepare", "unprepare"])
def test_a_crash_at_any_step_leaves_no_orphan_instance(
    node_factory: Callable[..., Node], scenario: str
) -> None:
    node = node_factory("h100-mig", dynamic_mig="all")
    node.restart(serial=True)
    a = node.add(
        claim_obj(name="a", uid=new_uid(), devices=["gpu-0-mig-1g-10gb-0", "gpu-0-mig-2g-20gb-2"])
    )
    b = node.add(claim_obj(name="b", uid=new_uid(), devices=["gpu-0-mig-3g-40gb-4", "gpu-1"]))
    if scenario == "unprepare":
        assert {r.error for r in node.driver.prepare([a, b]).values()} == {""}

    def work() -> None:
        if scenario == "prepare":
            node.driver.prepare([a, b])
        else:
            node.driver.unprepare([a, b])

    crash_at = 0
    while (code := _run_child(node, crash_at, work)) == CRASHED:
        driver = node.restart()
        _check_consistent(node)
        assert _present(node) == _owned(node), f"crash point {crash_at}"
        if scenario == "prepare":
            assert set(driver.unprepare([a, b]).values()) == {""}
            assert _present(node) == set()
        else:
            assert {r.error for r in driver.prepare([a, b]).values()} == {""}
            assert len(_present(node)) == 3
        crash_at += 1
    assert code == 0
    # Crash points: the claims' file effects and every MIG step — prepare: GPU 0's MIG mode on,
    # three GPU and three compute instances made, GPU 1's MIG mode off (8), besides the 14
    # file effects of test_crash_points (nothing synced with a readable boot ID, issue 46);
    # unprepare: three compute and three GPU instances destroyed (6), besides the 8 there.
    assert crash_at == (22 if scenario == "prepare" else 14)
    node.restart()
    _check_consistent(node)
    assert _present(node) == _owned(node)
    assert len(_present(node)) == (3 if scenario == "prepare" else 0)
