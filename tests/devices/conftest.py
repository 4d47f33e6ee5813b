"""Shared helpers for device tests: built-in profiles, discovery over the pynvml stand-in."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from dra_driver.devices import model, nvml
from dra_driver.devices.fake import fakenvml, profiles

Discover = Callable[..., model.NodeDevices]


@pytest.fixture
def discover() -> Discover:
    """``discover(profile_name, **FakeNvml kwargs)``: PynvmlBackend over the stand-in."""

    def run(name: str, **fake: Any) -> model.NodeDevices:
        prof = profiles.load_builtin(name)
        backend = nvml.PynvmlBackend.create(
            nvml=fakenvml.FakeNvml(prof, **fake), sysfs=fakenvml.ProfileSysfs(prof)
        )
        return backend.discover()

    return run
