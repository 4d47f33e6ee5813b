"""Fixtures for allocation tests: the slices the driver publishes for a fake profile."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from claimkit import DRIVER, NODE, Obj

from dra_driver.devices import fake, model
from dra_driver.slices import build

ProfileSlices = Callable[[str], tuple[list[Obj], model.NodeDevices]]


@pytest.fixture
def profile_slices() -> ProfileSlices:
    """``profile_slices(name)``: the driver's slices for a fake profile on node-1, and devices."""

    def make(name: str) -> tuple[list[Obj], model.NodeDevices]:
        devices = fake.FakeBackend.from_name(name).discover()
        return build.build(devices, node_name=NODE, driver_name=DRIVER).slices, devices

    return make
