"""The rule for the real-GPU checks: they run only when asked for (``pytest -m gpu``, which is
what ``make gpu-check`` runs) on a node where NVML finds a GPU, and are otherwise skipped with
one reason line — so ``make test`` never runs them, GPU or not.

NVML is probed once per session, in this process, through the same backend ``discover`` uses
(a ``DRA_DRIVER_NVML_LIBRARY`` in the environment is honoured). The probe also finds where the
driver is (the directory the NVML library was loaded from, or ``DRIVER_ROOT`` when set) and
nvidia-smi, and records the GPUs' settings so the last check can show nothing changed them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dra_driver.devices import backend, nvml

from . import gpukit

_REASON = pytest.StashKey[str | None]()
_NODE = pytest.StashKey[gpukit.GpuNode]()
_SETTINGS = pytest.StashKey[dict[str, object] | None]()
NOT_ASKED = "GPU checks run only when asked: make gpu-check (pytest -m gpu tests/gpu)"


def _probe(config: pytest.Config) -> str | None:
    """Why the GPU checks cannot run here, or None (the node and settings are stashed)."""
    if config.getoption("markexpr", "") != "gpu":
        return NOT_ASKED
    try:
        real = nvml.PynvmlBackend.create()
    except backend.DiscoveryError as exc:
        return f"no NVIDIA GPU here: {exc}"
    try:
        devices = real.discover()
    except backend.DiscoveryError as exc:
        return f"no NVIDIA GPU here: {exc}"
    finally:
        real.close()
    if not devices.gpus:
        return "no NVIDIA GPU here: NVML lists none"
    root = Path(os.environ.get("DRIVER_ROOT") or gpukit.driver_root_of(gpukit.loaded_nvml()))
    node = gpukit.GpuNode(
        devices=devices, driver_root=root, nvidia_smi=gpukit.find_nvidia_smi(root)
    )
    config.stash[_NODE] = node
    config.stash[_SETTINGS] = gpukit.settings(node.nvidia_smi) if node.nvidia_smi else None
    return None


def _reason(config: pytest.Config) -> str | None:
    if _REASON not in config.stash:
        config.stash[_REASON] = _probe(config)
    return config.stash[_REASON]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    reason = _reason(item.config)
    if reason is not None:
        pytest.skip(reason)  # one reason for all: the run's summary counts them on one line


@pytest.fixture(scope="session")
def node(pytestconfig: pytest.Config) -> gpukit.GpuNode:
    return pytestconfig.stash[_NODE]


@pytest.fixture(scope="session")
def settings_before(pytestconfig: pytest.Config) -> dict[str, object]:
    """The GPUs' settings before any check ran (skips without nvidia-smi)."""
    recorded = pytestconfig.stash[_SETTINGS]
    if recorded is None:
        pytest.skip("nvidia-smi not found (under the driver root or on PATH)")
    return recorded


@pytest.fixture(scope="session")
def nvidia_smi(node: gpukit.GpuNode) -> Path:
    if node.nvidia_smi is None:
        pytest.skip("nvidia-smi not found (under the driver root or on PATH)")
    return node.nvidia_smi
