"""The DeviceClasses of ``compute-domain.nvidia.com``, shipped as package data.

Why it exists: ComputeDomain claim templates name these classes (NVIDIA's names, so their
manifests select our devices); the chart renders the same (a test holds it to these files) and
the demo's stand-in scheduler allocates with them. Kept apart from
:mod:`dra_driver.deviceclasses` (the GPU driver's classes, rewritten for ``--driver-name``):
this driver's name is fixed.
"""

from __future__ import annotations

import importlib.resources
from typing import Any

import yaml


def names() -> list[str]:
    folder = importlib.resources.files(__name__)
    return sorted(
        p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml")
    )


def load_all() -> list[dict[str, Any]]:
    """Both classes, sorted by name."""
    folder = importlib.resources.files(__name__)
    return [
        yaml.safe_load((folder / f"{name}.yaml").read_text(encoding="utf-8")) for name in names()
    ]
