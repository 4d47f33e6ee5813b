"""Claim handling: which allocation results and opaque configs are ours, and every error path."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.driver import claims

from .conftest import DRIVER, NODE, claim_obj, gpu_config, new_uid, opaque, ref_of


def ours(obj: dict[str, Any]) -> tuple[claims.AllocatedDevice, ...]:
    return claims.allocated_devices(obj, ref=ref_of(obj), driver=DRIVER, pool=NODE)


def test_results_of_other_drivers_are_skipped_and_subrequests_stripped() -> None:
    obj = claim_obj(
        name="c",
        uid=new_uid(),
        results=[
            {"request": "nic", "driver": "net.example.com", "pool": "x", "device": "eth0"},
            {
                "request": "gpu/h100",
                "driver": DRIVER,
                "pool": NODE,
                "device": "gpu-3",
                "adminAccess": True,
                "shareID": "11111111-2222-4333-8444-555555555555",
            },
        ],
    )
    (dev,) = ours(obj)
    assert (dev.device, dev.request, dev.request_name) == ("gpu-3", "gpu/h100", "gpu")
    assert dev.admin_access is True
    assert dev.share_id == "11111111-2222-4333-8444-555555555555"


def test_configs_apply_by_request_in_class_then_claim_order() -> None:
    cfgs = [
        opaque(gpu_config(env={"A": "claim"}), source="FromClaim", requests=["b"]),
        opaque(gpu_config(env={"A": "other"}), driver="other.example.com"),
        opaque(gpu_config(env={"A": "class"}), source="FromClass"),
        opaque(gpu_config(env={"A": "sub"}), source="FromClaim", requests=["a/x"]),
        opaque(gpu_config(env={"A": "main"}), source="FromClaim", requests=["a"]),
    ]
    obj = claim_obj(
        name="c",
        uid=new_uid(),
        config=cfgs,
        results=[
            {"request": "a/x", "driver": DRIVER, "pool": NODE, "device": "gpu-0"},
            {"request": "a/y", "driver": DRIVER, "pool": NODE, "device": "gpu-1"},
            {"request": "b", "driver": DRIVER, "pool": NODE, "device": "gpu-2"},
        ],
    )
    got = {d.device: [c.parameters["env"]["A"] for c in d.configs] for d in ours(obj)}
    assert got == {
        "gpu-0": ["class", "sub", "main"],
        "gpu-1": ["class", "main"],
        "gpu-2": ["class", "claim"],
    }


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda o: o["metadata"].update(uid="other"), "claim was replaced"),
        (lambda o: o.pop("status"), "not allocated"),
        (lambda o: o["status"].update(allocation=None), "not allocated"),
        (
            lambda o: o["status"]["allocation"]["devices"].update(results="x"),
            "results is not a list",
        ),
        (
            lambda o: o["status"]["allocation"]["devices"]["results"].append(7),
            "results[1] is not an object",
        ),
        (
            lambda o: o["status"]["allocation"]["devices"]["results"][0].pop("device"),
            "results[0].device is missing",
        ),
        (
            lambda o: o["status"]["allocation"]["devices"]["results"][0].update(adminAccess="yes"),
            "adminAccess is not a boolean",
        ),
        (
            lambda o: o["status"]["allocation"]["devices"]["results"][0].update(pool="n2"),
            "n2/gpu-0 of driver gpu.nvidia.com are not in this node's pool 'n1'",
        ),
        (
            lambda o: o["status"]["allocation"]["devices"]["results"][0].update(driver="x.io"),
            "has no devices of driver gpu.nvidia.com",
        ),
        (
            lambda o: o["status"]["allocation"]["devices"].update(
                config=[opaque({"a": 1}) | {"opaque": {"driver": DRIVER, "parameters": [1]}}]
            ),
            "config[0].opaque.parameters must be a JSON object",
        ),
        (
            lambda o: o["status"]["allocation"]["devices"].update(
                config=[opaque(gpu_config(), requests="gpu")]
            ),
            "requests must be a list",
        ),
    ],
)
def test_errors_name_the_claim_and_the_reason(mutate: Any, message: str) -> None:
    obj = claim_obj(name="bad", uid=new_uid(), devices=["gpu-0"])
    mutate(obj)
    with pytest.raises(claims.ClaimError) as err:
        claims.allocated_devices(
            obj,
            ref=claims.ClaimRef(
                uid=obj["metadata"]["uid"] if message != "claim was replaced" else "want",
                namespace="default",
                name="bad",
            ),
            driver=DRIVER,
            pool=NODE,
        )
    assert message in str(err.value)
    assert "default/bad" in str(err.value)


def test_main_request() -> None:
    assert claims.main_request("gpu/h100") == "gpu"
    assert claims.main_request("container-0-request-0") == "container-0-request-0"
