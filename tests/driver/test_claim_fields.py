"""Every string field of an allocation result must be a non-empty string: an empty or
non-string request, device or pool is refused with the field named, never prepared."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dra_driver.driver import cdi, claims

from .conftest import DRIVER, NODE, claim_obj, new_uid, ref_of

GOOD = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-0"}


@pytest.mark.parametrize("key", ["request", "device", "pool"])
@pytest.mark.parametrize("value", ["", 5, None, ["gpu"]])
def test_empty_or_non_string_result_fields_are_refused(key: str, value: Any) -> None:
    result = dict(GOOD, **{key: value})
    if value is None:
        del result[key]
    obj = claim_obj(name="c", uid=new_uid(), results=[result])
    with pytest.raises(claims.ClaimError) as err:
        claims.allocated_devices(obj, ref=ref_of(obj), driver=DRIVER, pool=NODE)
    assert str(err.value) == (
        f"{ref_of(obj)}: status.allocation.devices.results[0].{key} is missing or not a string"
    )


@pytest.mark.parametrize("consumed", [{"memory": 1.5}, ["memory"], {"memory": None}])
def test_consumed_capacity_must_be_a_map_of_quantities(consumed: Any) -> None:
    obj = claim_obj(name="c", uid=new_uid(), results=[dict(GOOD, consumedCapacity=consumed)])
    with pytest.raises(claims.ClaimError) as err:
        claims.allocated_devices(obj, ref=ref_of(obj), driver=DRIVER, pool=NODE)
    assert str(err.value) == (
        f"{ref_of(obj)}: status.allocation.devices.results[0].consumedCapacity is not a map of "
        "quantities"
    )


def test_a_good_result_passes() -> None:
    obj = claim_obj(name="c", uid=new_uid(), results=[GOOD])
    (dev,) = claims.allocated_devices(obj, ref=ref_of(obj), driver=DRIVER, pool=NODE)
    assert (dev.request, dev.pool, dev.device) == ("gpu", NODE, "gpu-0")


@pytest.mark.parametrize(
    "driver",
    ["gpu.nvidia.com.", "gpu.nvidia.com-", "gpu/nvidia", "gpu nvidia", "g" * 250],
)
def test_a_driver_name_that_makes_no_cdi_vendor_is_refused(tmp_path: Path, driver: str) -> None:
    with pytest.raises(ValueError, match="gives an invalid CDI vendor"):
        cdi.CdiSpecs(root=tmp_path, driver_name=driver, host=cdi.HostDevices(fake_node="/dev/null"))


def test_the_longest_cdi_vendor_is_accepted(tmp_path: Path) -> None:
    driver = "g" * 249  # "k8s." + 249 = 253 characters
    specs = cdi.CdiSpecs(
        root=tmp_path, driver_name=driver, host=cdi.HostDevices(fake_node="/dev/null")
    )
    assert specs.kind == f"k8s.{driver}/claim"
