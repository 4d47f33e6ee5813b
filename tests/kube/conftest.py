"""Fixtures for the Kubernetes API tests: an in-memory API, slices to write into it."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from dra_driver.kube import memory

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
