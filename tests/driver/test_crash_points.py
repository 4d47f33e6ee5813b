"""Crash at *every* point: the deterministic complement of the random SIGKILL test.

A forked child runs prepare/unprepare and dies (``os._exit``) right before its N-th durable file
operation (fsync, link, pwrite, rename, replace, unlink, or write: a new claim metadata file is
written under its own name, so a crash may leave it empty or torn); the parent then restarts the
driver from disk and checks the invariants. N runs from 0 until the child gets through without
dying, so every window between two disk effects is hit once.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import pytest

from dra_driver.driver import checkpoint

from .conftest import Node, claim_obj, new_uid

CRASHED = 86


def _run_child(node: Node, crash_at: int, work: Callable[[], None]) -> int:
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        count = [0]
        real = {
            name: getattr(os, name)
            for name in ("fsync", "link", "pwrite", "rename", "replace", "unlink", "write")
        }

        def counting(name: str) -> Callable[..., Any]:
            def op(*args: Any, **kwargs: Any) -> Any:
                if count[0] == crash_at:
                    os._exit(CRASHED)
                count[0] += 1
                return real[name](*args, **kwargs)

            return op

        for name in real:
            setattr(os, name, counting(name))
        try:
            work()
        except BaseException:
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _check_consistent(node: Node) -> None:
    records = {p.stem: json.loads(p.read_text()) for p in node.claims_dir.glob("*.json")}
    assert all(r["state"] == checkpoint.PREPARE_COMPLETED for r in records.values())
    assert set(node.spec_files()) == {f"k8s.gpu.nvidia.com-claim_{u}.json" for u in records}
    for uid, rec in records.items():
        spec = node.cdi_root / f"k8s.gpu.nvidia.com-claim_{uid}.json"
        assert json.loads(spec.read_text()) == rec["cdiSpec"]
    if node.cdi_root.exists():
        assert not [p for p in node.cdi_root.iterdir() if p.name.startswith(".")]
    # Metadata files (docs/metadata.md): exactly the prepared claims', complete, no temporaries.
    meta = node.settings.plugin_dir / "claim-metadata"
    on_disk = sorted(p.name for p in meta.iterdir()) if meta.exists() else []
    assert on_disk == sorted(
        name for uid in records for name in (f"{uid}.claim.json", f"{uid}.gpu.metadata.json")
    )
    for uid, rec in records.items():
        claim_file = json.loads((meta / f"{uid}.claim.json").read_text())
        assert claim_file["claim"]["uid"] == uid
        assert [d["name"] for d in claim_file["devices"]] == [
            d["deviceName"] for d in rec["devices"]
        ]
    # Recycled record files (spares) are expected there; nothing else that is hidden.
    hidden = [p for p in node.claims_dir.iterdir() if p.name.startswith(".")]
    assert not [p for p in hidden if not p.name.startswith(checkpoint.SPARE_PREFIX)]


@pytest.mark.parametrize("scenario", ["prepare", "unprepare"])
def test_a_crash_between_any_two_disk_effects_recovers(node: Node, scenario: str) -> None:
    node.restart(serial=True)
    a = node.add(claim_obj(name="a", uid=new_uid(), devices=["gpu-0", "gpu-1"]))
    b = node.add(claim_obj(name="b", uid=new_uid(), devices=["gpu-2"]))
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
        # Put disk back where the scenario starts, through the plugin itself.
        if scenario == "prepare":
            assert set(driver.unprepare([a, b]).values()) == {""}
        else:
            assert {r.error for r in driver.prepare([a, b]).values()} == {""}
        crash_at += 1
    assert code == 0
    # Every window was hit: per claim, prepare = pwrite + rename (Started record, written into a
    # spare or new file and renamed into place), 2 writes (metadata files, new under their own
    # names), write + rename (spec), pwrite (Completed: the state flipped in place, not synced
    # with a readable boot ID, issue 46); unprepare = unlink (spec) + 2 unlinks (metadata files)
    # + rename (the record becomes a spare).
    assert crash_at == (14 if scenario == "prepare" else 8)
    node.restart()
    _check_consistent(node)
    assert len(node.spec_files()) == (2 if scenario == "prepare" else 0)
