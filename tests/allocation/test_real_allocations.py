"""``dra-driver simulate`` against what a real kube-scheduler (v1.36.2) allocated.

``../shared/reference/real-allocations.json`` holds an 8-GPU ResourceSlice, two DeviceClasses
and every ResourceClaim as the real scheduler allocated it. For each claim (collected from the
file, so a new claim is picked up without a code change) the simulator must reach the
scheduler's verdict, with a device set that satisfies the same constraints, the same request
names (subrequest included), the same configs and node selector. The scheduler's own search,
replayed claim after claim, must land on exactly the devices the real one chose.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import refdata
import yaml

from dra_driver import cli
from dra_driver.allocation import cel, claim, firstfit, pools, selection

pytestmark = refdata.MARK

DATA: dict[str, Any] = refdata.real_allocations()
CLAIMS: list[dict[str, Any]] = DATA["claims"]
NAMES = [c["metadata"]["name"] for c in CLAIMS]
CASES = (
    [pytest.param(c, id=n) for c, n in zip(CLAIMS, NAMES, strict=True)]
    if refdata.available()
    else refdata.placeholder()
)


def _write(path: Path, *docs: Any) -> Path:
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return path


def _simulate(
    tmp_path: Path,
    the_claim: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    others: list[dict[str, Any]] | None = None,
) -> tuple[int, Any]:
    args = [
        "simulate",
        str(_write(tmp_path / "claim.yaml", the_claim)),
        "--class",
        str(_write(tmp_path / "classes.yaml", *DATA["deviceClasses"])),
        "--slices",
        str(_write(tmp_path / "slice.yaml", DATA["slice"])),
    ]
    if others:
        args += ["--allocated", str(_write(tmp_path / "allocated.yaml", *others))]
    code = cli.main(args)
    out = capsys.readouterr().out
    return code, yaml.safe_load(out) if code == 0 else out


def _device(name: str) -> dict[str, Any]:
    return next(d for d in DATA["slice"]["spec"]["devices"] if d["name"] == name)


def _check_same_constraints(the_claim: dict[str, Any], got: dict[str, Any]) -> None:
    want = the_claim["status"]["allocation"]
    results = got["devices"]["results"]
    # Same request names (with the same subrequest chosen) and the same number of devices each.
    assert sorted(r["request"] for r in results) == sorted(
        r["request"] for r in want["devices"]["results"]
    )
    assert {(r["driver"], r["pool"]) for r in results} == {
        (r["driver"], r["pool"]) for r in want["devices"]["results"]
    }
    assert len({r["device"] for r in results}) == len(results)
    parsed = claim.parse_claim(the_claim)
    classes = {c.name: c for c in map(claim.parse_class, DATA["deviceClasses"])}
    driver = DATA["slice"]["spec"]["driver"]
    alternatives = {a.name: a for g in parsed.groups for a in g.alternatives}
    for r in results:
        req = alternatives[r["request"]]
        for expr in (*classes[req.class_name].selectors, *req.selectors):
            assert cel.compile_selector(expr).matches(_device(r["device"]), driver)
    for con in parsed.constraints:
        values = {
            json.dumps(
                _device(r["device"])["attributes"].get(con.attribute.split("/", 1)[1])
                if con.attribute.startswith(driver + "/")
                else _device(r["device"])["attributes"].get(con.attribute)
            )
            for r in results
            if con.applies(alternatives[r["request"]])
        }
        assert len(values) == 1 and "null" not in values, (con, values)
    assert got.get("devices", {}).get("config") == want["devices"].get("config")
    assert got.get("nodeSelector") == want.get("nodeSelector")


def test_the_file_has_claims() -> None:
    assert len(CLAIMS) >= 5


@pytest.mark.parametrize("the_claim", CASES)
def test_simulate_reaches_the_scheduler_verdict(
    the_claim: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert the_claim["status"]["allocation"]  # the scheduler allocated it
    code, got = _simulate(tmp_path, the_claim, capsys)
    assert code == 0, got
    _check_same_constraints(the_claim, got)


@pytest.mark.parametrize("the_claim", CASES)
def test_simulate_with_the_other_claims_allocated(
    the_claim: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    others = [c for c in CLAIMS if c is not the_claim]
    code, got = _simulate(tmp_path, the_claim, capsys, others)
    assert code == 0, got
    _check_same_constraints(the_claim, got)
    busy = {r["device"] for c in others for r in c["status"]["allocation"]["devices"]["results"]}
    assert not busy & {r["device"] for r in got["devices"]["results"]}
    # simulate prints the scheduler's own pick: exactly the devices, in the real result order.
    want = the_claim["status"]["allocation"]["devices"]["results"]
    assert [(r["request"], r["device"]) for r in got["devices"]["results"]] == [
        (r["request"], r["device"]) for r in want
    ]


def _replay(order: tuple[dict[str, Any], ...]) -> bool:
    """Whether the scheduler's search, claim after claim in this order, picks the real devices."""
    pool_list = pools.gather([DATA["slice"]], node_name=DATA["node"])
    classes = {c.name: c for c in map(claim.parse_class, DATA["deviceClasses"])}
    used: set[pools.DeviceId] = set()
    for the_claim in order:
        parsed = claim.parse_claim(the_claim)
        sel = selection.Selection(devices=list(pool_list[0].devices), classes=classes, in_use=used)
        sel.compile_all(parsed)
        verdict = firstfit.emulate(parsed, sel, bad_pools=[])
        want = [
            (r["request"], r["device"])
            for r in the_claim["status"]["allocation"]["devices"]["results"]
        ]
        if [(name, sel.devices[pos].name) for name, pos in verdict.picks] != want:
            return False
        used |= {d.id for d in (sel.devices[p] for _, p in verdict.picks)}
    return True


def test_replayed_scheduler_search_picks_the_real_devices() -> None:
    """Some scheduling order of the claims reproduces every real pick exactly."""
    assert any(_replay(order) for order in itertools.permutations(CLAIMS))
