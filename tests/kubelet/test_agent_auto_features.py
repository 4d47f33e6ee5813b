"""The node agent with ``auto:`` dynamic MIG on an API server that drops shared counters: it
starts, publishes the GPUs as usual and says so once; the explicit form is refused at start."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import structlog.testing

from dra_driver import app, metrics
from dra_driver.devices import fake
from dra_driver.slices import serverfeatures
from dra_driver.testing.fakeapi import memory

NO_COUNTERS = serverfeatures.Kept(shared_counters=False, probed=True)


def settings(base: Path, dynamic_mig: str) -> app.PluginSettings:
    return app.PluginSettings(
        node_name="n1",
        registry_dir=base / "reg",
        plugins_dir=base / "plugins",
        cdi_root=base / "cdi",
        driver_root=base / "none",
        fake=True,
        boot_id_file=base / "boot",
        cleanup_interval_s=0,
        node_labels=False,
        dynamic_mig=dynamic_mig,
    )


def test_explicit_dynamic_mig_is_refused_at_start(short_dir: Path) -> None:
    with pytest.raises(app.StartupError, match="DRAPartitionableDevices is off"):
        app.run(
            settings(short_dir, "all"),
            backend=fake.FakeBackend.from_name("h100-mig"),
            api=memory.InMemoryApi(use_default_cel=False),
            stop=threading.Event(),
            probe=lambda: NO_COUNTERS,
        )


def test_auto_dynamic_mig_starts_off_and_publishes_plain_gpus(short_dir: Path) -> None:
    api = memory.InMemoryApi(use_default_cel=False)
    api.put_node("n1", uid="uid-n1")
    m = metrics.new()
    stop = threading.Event()
    codes: list[int] = []
    with structlog.testing.capture_logs() as logs:
        thread = threading.Thread(
            target=lambda: codes.append(
                app.run(
                    settings(short_dir, "auto:all"),
                    backend=fake.FakeBackend.from_name("h100-mig"),
                    api=api,
                    stop=stop,
                    metrics=m,
                    probe=lambda: NO_COUNTERS,
                )
            ),
            daemon=True,
        )
        thread.start()
        try:
            stored: list[dict[str, Any]] = []
            for _ in range(500):
                stored, _ = api.list_resource_slices(driver="gpu.nvidia.com", node_name="n1")
                if stored:
                    break
                threading.Event().wait(0.02)
            assert stored
        finally:
            stop.set()
            thread.join(10)
    assert codes == [0]
    assert not any(s["spec"].get("sharedCounters") for s in stored)
    devices = [d for s in stored for d in s["spec"].get("devices") or ()]
    assert devices and not any(d.get("consumesCounters") for d in devices)
    said = [x for x in logs if x["event"] == serverfeatures.DROPPED_EVENT]
    assert [x["effect"] for x in said] == [
        "--dynamic-mig auto:all: dynamic MIG is off, its GPUs are published as full GPUs"
    ]
    value = m.registry.get_sample_value
    assert value("dra_driver_feature_enabled", {"feature": "sharedCounters"}) == 0
