"""Fixtures every test package may use: where the shared reference data lives, an in-memory API."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dra_driver.fakeapi import memory

REPO_ROOT = Path(__file__).resolve().parents[1]
REFERENCE = REPO_ROOT.parent / "shared" / "reference"


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    """``../shared/reference``: wire contracts, OpenAPI, CDI schema, recorded API verdicts."""
    if not REFERENCE.is_dir():
        pytest.fail(f"shared reference data not found at {REFERENCE}")
    return REFERENCE


Obj = dict[str, Any]
SliceFactory = Callable[..., Obj]


@pytest.fixture
def mem() -> memory.InMemoryApi:
    return memory.InMemoryApi()


@pytest.fixture
def make_slice() -> SliceFactory:
    """``make_slice(name, node=, driver=, devices=)``: a valid ResourceSlice dict."""

    def make(
        name: str = "n1-gpu.nvidia.com-0",
        *,
        node: str = "n1",
        driver: str = "gpu.nvidia.com",
        devices: list[str] | None = None,
        generation: int = 1,
    ) -> Obj:
        names = ["gpu-0"] if devices is None else devices
        return copy.deepcopy(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": name},
                "spec": {
                    "driver": driver,
                    "nodeName": node,
                    "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
                    "devices": [
                        {"name": n, "attributes": {"type": {"string": "gpu"}}} for n in names
                    ],
                },
            }
        )

    return make
