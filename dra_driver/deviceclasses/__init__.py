"""The DeviceClasses that go with our ResourceSlices, shipped as package data.

Why it exists: claims name a DeviceClass, and the classes must select exactly the devices our
slices publish (``type`` "gpu" or "mig" under our driver name). The YAML files here are the one
source: the deployment manifests in ``deployments/deviceclasses/`` are copies a test keeps in
sync, and the allocator/simulator load them from here. For a non-default ``--driver-name`` the
selectors are rewritten to that driver (class names stay).
"""

from __future__ import annotations

import importlib.resources
from typing import Any

import yaml

DEFAULT_DRIVER_NAME = "gpu.nvidia.com"


class DeviceClassError(Exception):
    """A requested DeviceClass is not shipped."""


def names() -> list[str]:
    """Names of the shipped classes (file name = class name)."""
    folder = importlib.resources.files(__name__)
    return sorted(
        p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml")
    )


def load(name: str, *, driver_name: str = DEFAULT_DRIVER_NAME) -> dict[str, Any]:
    """One class as a dict, its selectors and config rewritten for ``driver_name``."""
    if name not in names():
        raise DeviceClassError(f"no DeviceClass {name!r}; shipped: {', '.join(names())}")
    text = (importlib.resources.files(__name__) / f"{name}.yaml").read_text(encoding="utf-8")
    obj: dict[str, Any] = yaml.safe_load(text)
    if driver_name != DEFAULT_DRIVER_NAME:
        for selector in obj["spec"].get("selectors") or ():
            cel = selector["cel"]
            cel["expression"] = cel["expression"].replace(
                f'"{DEFAULT_DRIVER_NAME}"', f'"{driver_name}"'
            )
        for config in obj["spec"].get("config") or ():
            config["opaque"]["driver"] = driver_name
    return obj


def load_all(*, driver_name: str = DEFAULT_DRIVER_NAME) -> list[dict[str, Any]]:
    """Every shipped class, sorted by name."""
    return [load(name, driver_name=driver_name) for name in names()]
