"""The node agent with ``--passthrough``: it publishes each selected GPU twice (with the counter
both consume); the explicit form is refused at start where the server drops shared counters,
``auto:`` is off there and the GPUs are published once."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any

import pytest

from dra_driver import app, metrics
from dra_driver.devices import fake
from dra_driver.slices import serverfeatures, vfioslices
from dra_driver.testing.fakeapi import memory

NO_COUNTERS = serverfeatures.Kept(shared_counters=False, probed=True)
ALL_KEPT = serverfeatures.Kept(probed=True)


def settings(base: Path, passthrough: str) -> app.PluginSettings:
    return dataclasses.replace(
        app.PluginSettings(
            node_name="n1",
            registry_dir=base / "reg",
            plugins_dir=base / "plugins",
            cdi_root=base / "cdi",
            driver_root=base / "none",
            fake=True,
            boot_id_file=base / "boot",
            cleanup_interval_s=0,
            node_labels=False,
        ),
        passthrough=passthrough,
    )


def test_explicit_passthrough_is_refused_where_counters_are_dropped(short_dir: Path) -> None:
    with pytest.raises(app.StartupError, match="--passthrough all needs shared counters"):
        app.run(
            settings(short_dir, "all"),
            backend=fake.FakeBackend.from_name("pcie-l4"),
            api=memory.InMemoryApi(use_default_cel=False),
            stop=threading.Event(),
            probe=lambda: NO_COUNTERS,
        )


def _published(base: Path, passthrough: str, kept: serverfeatures.Kept) -> list[dict[str, Any]]:
    api = memory.InMemoryApi(use_default_cel=False)
    api.put_node("n1", uid="uid-n1")
    stop = threading.Event()
    codes: list[int] = []
    thread = threading.Thread(
        target=lambda: codes.append(
            app.run(
                settings(base, passthrough),
                backend=fake.FakeBackend.from_name("pcie-l4"),
                api=api,
                stop=stop,
                metrics=metrics.new(),
                probe=lambda: kept,
            )
        ),
        daemon=True,
    )
    thread.start()
    stored: list[dict[str, Any]] = []
    try:
        for _ in range(500):
            stored, _ = api.list_resource_slices(driver="gpu.nvidia.com", node_name="n1")
            if stored and len(stored) == stored[0]["spec"]["pool"]["resourceSliceCount"]:
                break
            threading.Event().wait(0.02)
    finally:
        stop.set()
        thread.join(10)
    assert codes == [0]
    return stored


def test_passthrough_gpus_are_published_twice(short_dir: Path) -> None:
    stored = _published(short_dir, "L4", ALL_KEPT)
    assert sorted(vfioslices.names_in(stored)) == [f"gpu-vfio-{i}" for i in range(4)]
    sets = [c["name"] for s in stored for c in s["spec"].get("sharedCounters") or ()]
    assert sorted(sets) == [f"gpu-{i}-vfio" for i in range(4)]


def test_auto_passthrough_is_off_where_counters_are_dropped(short_dir: Path) -> None:
    stored = _published(short_dir, "auto:all", NO_COUNTERS)
    assert vfioslices.names_in(stored) == []
    assert not any(s["spec"].get("sharedCounters") for s in stored)
