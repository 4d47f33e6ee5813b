"""Issue 9: our claim handling agrees with what a real kube-scheduler allocated.

Every ResourceClaim in ``../shared/reference/real-allocations.json`` (recorded from Kubernetes
v1.36.2) is a case; a claim added to the file becomes a case without a code change. For each, the
devices, request names (subrequest stripped) and configs per device must match what the file
itself says, derived here independently of the driver's code, and the claims we know by name
must match the hand-checked expectations below.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import refdata

from dra_driver.driver import claims, config

from .conftest import REFERENCE

pytestmark = refdata.MARK

DATA = refdata.real_allocations()
DRIVER = DATA["slice"]["spec"]["driver"]
POOL = DATA["slice"]["spec"]["pool"]["name"]
CLAIMS = {c["metadata"]["name"]: c for c in DATA["claims"]}

# Hand-checked against the file: device → (request name, [config sources in order]).
KNOWN = {
    "one-gpu": {"gpu-0": ("gpu", ["FromClass"])},
    "first-available": {"gpu-3": ("gpu", ["FromClass"])},
    "two-on-one-numa": {"gpu-1": ("gpus", ["FromClass"]), "gpu-2": ("gpus", ["FromClass"])},
    "two-requests-with-config": {
        "gpu-4": ("train", ["FromClass"]),
        "gpu-5": ("infer", ["FromClass", "FromClaim"]),
    },
}


def _ref(claim: dict[str, Any]) -> claims.ClaimRef:
    m = claim["metadata"]
    return claims.ClaimRef(uid=m["uid"], namespace=m["namespace"], name=m["name"])


def _expected(claim: dict[str, Any]) -> list[tuple[str, str, list[dict[str, Any]]]]:
    """(device, request name, parameters in order) straight from the recorded allocation."""
    alloc = claim["status"]["allocation"]["devices"]
    cfgs = [c for c in alloc.get("config") or [] if c["opaque"]["driver"] == DRIVER]
    cfgs = [c for c in cfgs if c["source"] == "FromClass"] + [
        c for c in cfgs if c["source"] == "FromClaim"
    ]
    out = []
    for r in alloc["results"]:
        if r["driver"] != DRIVER or r["pool"] != POOL:
            continue
        main = r["request"].split("/")[0]
        applying = [
            c["opaque"]["parameters"]
            for c in cfgs
            if not c.get("requests") or r["request"] in c["requests"] or main in c["requests"]
        ]
        out.append((r["device"], main, applying))
    return out


@pytest.mark.parametrize("name", sorted(CLAIMS) if refdata.available() else refdata.placeholder())
def test_devices_request_names_and_configs(name: str) -> None:
    claim = CLAIMS[name]
    got = claims.allocated_devices(claim, ref=_ref(claim), driver=DRIVER, pool=POOL)
    assert [(d.device, d.request_name, [dict(c.parameters) for c in d.configs]) for d in got] == (
        _expected(claim)
    )
    assert all("/" not in d.request_name for d in got)
    if name in KNOWN:
        assert {d.device: (d.request_name, [c.source for c in d.configs]) for d in got} == KNOWN[
            name
        ]
    for dev in got:  # every recorded config decodes strictly
        config.effective(dev.configs, ref=_ref(claim))


def test_the_file_has_the_shapes_issue_9_names() -> None:
    results = [r for c in DATA["claims"] for r in c["status"]["allocation"]["devices"]["results"]]
    assert any("/" in r["request"] for r in results), "firstAvailable result missing"
    extended = [c for c in DATA["claims"] if "extended-resources" in c["metadata"]["name"]]
    assert extended, "extended-resource claim missing"
    assert len(CLAIMS) >= 5


def test_extended_resource_claim_prepares_like_any_other() -> None:
    (claim,) = [c for c in DATA["claims"] if "extended-resources" in c["metadata"]["name"]]
    got = claims.allocated_devices(claim, ref=_ref(claim), driver=DRIVER, pool=POOL)
    assert [(d.device, d.request_name, d.configs) for d in got] == [
        ("gpu-6", "container-0-request-0", ()),
        ("gpu-7", "container-0-request-0", ()),
    ]


def test_claim_config_overrides_class_config() -> None:
    claim = CLAIMS["two-requests-with-config"]
    got = {
        d.device: d
        for d in claims.allocated_devices(claim, ref=_ref(claim), driver=DRIVER, pool=POOL)
    }
    infer = config.effective(got["gpu-5"].configs, ref=_ref(claim))
    train = config.effective(got["gpu-4"].configs, ref=_ref(claim))
    assert infer.sharing is not None and infer.sharing.strategy == "TimeSlicing"
    assert train.sharing is None


def test_reference_path_is_next_to_the_repository() -> None:
    assert Path(__file__).resolve().parents[2].parent / "shared" / "reference" == REFERENCE
