"""The NVML release's poller and resume rules (dra_driver.driverrelease): the version file read
without NVML, when a release ends, the backend's init given back once, the fake kernel's rmmod."""

from __future__ import annotations

import time
from pathlib import Path

import prometheus_client as prom
import pytest

from dra_driver import driverrelease, logs
from dra_driver.devices import health
from dra_driver.devices.fake import FakeBackend, fakelifecycle


def test_the_version_file_is_its_text_while_loaded_and_none_when_gone(tmp_path: Path) -> None:
    found = driverrelease.VersionFile(tmp_path / "nvidia")
    assert found.read() is None  # no directory at all
    (tmp_path / "nvidia").mkdir()
    (tmp_path / "nvidia" / "version").write_text("NVRM version: 550.54.15\n")
    assert found.read() == "NVRM version: 550.54.15"
    (tmp_path / "nvidia" / "version").unlink()
    assert found.read() is None


def test_a_release_ends_when_the_module_is_back_not_while_it_is_loaded_or_away() -> None:
    state = driverrelease.Released(at_release="v1", due=100.0)
    assert state.resume_reason("v1", 1.0) is None  # still the old module: stay released
    assert state.resume_reason(None, 2.0) is None  # unloaded: stay released
    assert state.resume_reason(None, 3.0) is None
    assert state.resume_reason("v1", 4.0) == "the NVIDIA kernel module is loaded again"


def test_a_release_ends_on_a_new_version_seen_between_two_polls_or_at_the_deadline() -> None:
    assert (
        driverrelease.Released(at_release="v1", due=100.0).resume_reason("v2", 1.0)
        == "the NVIDIA driver version changed"
    )
    late = driverrelease.Released(at_release="v1", due=100.0)
    assert late.resume_reason("v1", 99.9) is None
    assert late.resume_reason("v1", 100.0) == "the release deadline passed"
    assert late.resume_reason(None, 200.0) == "the release deadline passed"
    # A version file that was not readable at the release: any text is the module back.
    blind = driverrelease.Released(at_release=None, due=100.0)
    assert blind.resume_reason(None, 1.0) is None
    assert blind.resume_reason("v1", 2.0) == "the NVIDIA kernel module is loaded again"


def test_the_backends_init_is_given_back_once() -> None:
    backend = FakeBackend.from_name("dgx-h100")
    backend.discover()
    fake = backend.nvml
    assert fake.open_inits == 1
    hold = driverrelease.BackendHold(backend)
    assert hold.held
    hold.release()
    hold.release()  # a second release: not a second nvmlShutdown
    assert fake.open_inits == 0 and not hold.held


def test_the_fake_kernel_refuses_rmmod_while_an_init_is_open(tmp_path: Path) -> None:
    fake = FakeBackend.from_name("dgx-h100").nvml
    fake.use_proc_dir(tmp_path)
    version = tmp_path / "version"
    assert fake.profile.driver_version in version.read_text()
    fake.nvmlInit()
    with pytest.raises(fakelifecycle.LifecycleError, match="Module nvidia is in use"):
        fake.unload(rmmod=True)
    assert fake.driver_loaded and version.exists()
    fake.nvmlShutdown()
    fake.unload(rmmod=True)
    assert not fake.driver_loaded and not version.exists()
    calls = fake.init_calls
    fake.load(driver_version="590.10.01")
    assert "590.10.01" in version.read_text() and fake.init_calls == calls


def test_a_release_in_the_watch_thread_then_the_deadline_resumes_it() -> None:
    backend = FakeBackend.from_name("dgx-h100")
    devices = backend.discover()
    fake = backend.nvml
    now = [0.0]
    release = driverrelease.Release(
        proc_dir=Path("/nonexistent/proc/driver/nvidia"),  # not readable: deadline or ask only
        deadline_s=60.0,
        backend=backend,
        log=logs.get("test"),
        registry=prom.CollectorRegistry(),
        clock=lambda: now[0],
    )
    assert release.handle({"op": "nvml-release"})["ok"] is False  # no watch yet
    board = health.HealthBoard()
    watch = release.make_watch(
        api=fake,
        discover=backend.discover,
        devices=devices,
        board=board,
        log=logs.get("test"),
        on_devices=lambda *args: None,
        poll_s=0.01,
        backoff_s=0.01,
    )
    watch.start()
    try:
        assert fake.open_inits == 2  # the backend's and the watch's
        answer = release.handle({"op": "nvml-release"})
        assert answer["released"] and fake.open_inits == 0
        assert watch.outage.reason == "released" and not watch.available()
        snap = board.snapshot()
        assert all(c.value == "released" for g in devices.gpus for c in snap.conditions[g.uuid])
        calls = fake.init_calls
        for _ in range(20):  # turns of the watch: it reads the file, never calls nvmlInit
            watch.wake()
            time.sleep(0.01)
        assert fake.init_calls == calls and release.state is not None
        now[0] = 60.0  # the deadline
        began = time.monotonic()
        while not watch.available():
            assert time.monotonic() - began < 10, "not resumed"
            time.sleep(0.01)
        assert fake.init_calls > calls and fake.open_inits == 1  # the watch's only
        assert board.snapshot().conditions.get(devices.gpus[0].uuid, ()) == ()
    finally:
        watch.stop()
    assert fake.open_inits == 0
