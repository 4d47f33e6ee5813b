"""Whole-node wiring: one registration per resource (MIG mixed), replicas over the kubelet."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dra_driver.deviceplugin import app, inventory
from dra_driver.devices import control, fake, health, model, nvml
from dra_driver.devices.fake import fakemps
from dra_driver.pb.deviceplugin.v1beta1 import deviceplugin_pb2 as pb

from .conftest import Events, StartPlugin, events_named
from .test_cdi import A100_MIG_MINORS
from .test_service import MIG_1G
from .testkubelet import FakeKubelet


def test_mig_mixed_registers_each_profile_as_its_own_resource(
    start_plugin: StartPlugin, kubelet: FakeKubelet
) -> None:
    running = start_plugin("a100-mig", mig_strategy=inventory.MigStrategy.MIXED)
    expected = {
        "nvidia.com/gpu",
        "nvidia.com/mig-1g.5gb",
        "nvidia.com/mig-2g.10gb",
        "nvidia.com/mig-3g.20gb",
        "nvidia.com/mig-7g.40gb",
    }
    requests = kubelet.wait_requests(len(expected))
    assert {r.resource_name for r in requests} == expected
    assert len({r.endpoint for r in requests}) == len(expected)
    stub = running.stub("nvidia.com/mig-1g.5gb")
    first = next(iter(stub.ListAndWatch(pb.Empty(), timeout=5)))
    migs = [m for m in running.devices.gpus[0].mig_devices if m.profile == "1g.5gb"]
    assert sorted(d.ID for d in first.devices) == sorted(m.uuid for m in migs)
    # A sick parent GPU makes its MIG devices unhealthy too.
    running.board.mark_unhealthy(running.devices.gpus[0].uuid, "XID 79")
    second = next(iter(stub.ListAndWatch(pb.Empty(), timeout=5)))
    assert {d.health for d in second.devices} == {"Unhealthy"}


def test_replicas_are_listed_and_allocated_as_their_gpu(
    start_plugin: StartPlugin, kubelet: FakeKubelet
) -> None:
    running = start_plugin("h100-nvl-pairs", replicas=4)
    kubelet.wait_requests(1)
    stub = running.stub()
    first = next(iter(stub.ListAndWatch(pb.Empty(), timeout=5)))
    u = running.uuids()
    assert [d.ID for d in first.devices][:4] == [f"{u[0]}::{n}" for n in range(4)]
    assert len(first.devices) == 16
    req = pb.AllocateRequest()
    req.container_requests.add(devices_ids=[f"{u[1]}::0", f"{u[1]}::3", f"{u[0]}::2"])
    [resp] = stub.Allocate(req, timeout=5).container_responses
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == f"{u[1]},{u[0]}"
    assert [c.name.split("=")[1] for c in resp.cdi_devices] == [u[1], u[0]]


def test_a_node_without_gpus_registers_an_empty_list_and_writes_no_spec(
    start_plugin: StartPlugin, kubelet: FakeKubelet, cdi_root: Path
) -> None:
    running = start_plugin(model.NodeDevices(gpus=()))
    [req] = kubelet.wait_requests(1)
    assert req.resource_name == "nvidia.com/gpu"
    first = next(iter(running.stub().ListAndWatch(pb.Empty(), timeout=5)))
    assert list(first.devices) == []
    assert not cdi_root.exists() or list(cdi_root.iterdir()) == []


def _wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def test_ready_once_every_resource_is_registered_and_not_after_a_refusal(
    start_plugin: StartPlugin, kubelet: FakeKubelet
) -> None:
    kubelet.stop()
    running = start_plugin("a100-mig", mig_strategy=inventory.MigStrategy.MIXED)
    readiness = running.app.readiness
    assert readiness.snapshot() == {"registered": False}
    kubelet.start()
    kubelet.wait_requests(5)
    _wait_for(readiness.is_ready)
    kubelet.reject = "resource already registered"
    kubelet.restart(delete_plugin_sockets=False)  # each resource registers again: refused
    _wait_for(lambda: readiness.snapshot() == {"registered": False})


def test_default_mig_strategy_offers_whole_gpus_only(
    start_plugin: StartPlugin, kubelet: FakeKubelet
) -> None:
    running = start_plugin("a100-mig")
    assert list(running.app.endpoints) == ["nvidia.com/gpu"]
    [req] = kubelet.wait_requests(1)
    assert req.resource_name == "nvidia.com/gpu"


def test_start_logs_each_resource_and_units_that_cannot_be_allocated(
    start_plugin: StartPlugin, logged: Events
) -> None:
    minors = {k: v for k, v in A100_MIG_MINORS.items() if not k.startswith("gpu0/gi2/")}
    start_plugin(
        "a100-mig", mig_minors=minors, mig_strategy=inventory.MigStrategy.MIXED, replicas=2
    )
    [bad] = events_named(logged, "device cannot be allocated")
    assert bad["device"] == MIG_1G and bad["log_level"] == "warning"
    assert bad["problem"] == (
        f"MIG device {MIG_1G}: no capability minor for gpu0/gi2/access, gpu0/gi2/ci0/access in "
        "/proc/driver/nvidia-caps/mig-minors (is the MIG device still there?)"
    )
    started = events_named(logged, "device plugin resource started")
    assert {e["resource"]: e["devices"] for e in started} == {
        "nvidia.com/gpu": 0,
        "nvidia.com/mig-1g.5gb": 4,
        "nvidia.com/mig-2g.10gb": 2,
        "nvidia.com/mig-3g.20gb": 2,
        "nvidia.com/mig-7g.40gb": 2,
    }
    assert len(started) == 5
    assert {(e["strategy"], e["replicas"]) for e in started} == {("cdi", 2)}


def test_run_serves_until_stopped_and_returns_no_error(
    plugin_dir: Path, kubelet: FakeKubelet
) -> None:
    plugin = app.DevicePluginApp(
        config=app.Config(plugin_dir=plugin_dir, cdi_root=plugin_dir / "cdi", poll_interval_s=0.1),
        devices=fake.FakeBackend.from_name("pcie-l4").discover(),
        health_source=health.HealthBoard(),
        mig_minors=None,
    )
    stop = threading.Event()
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(plugin.run(stop)))
    thread.start()
    try:
        kubelet.wait_requests(1)
        thread.join(timeout=0.5)
        assert thread.is_alive(), "run() returned before it was stopped"
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive() and result == [None]


def _driver_root(root: Path) -> Path:
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/nvidia-cuda-mps-control").write_text("#!/bin/sh\n")
    (root / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)
    (root / "usr/lib/x86_64-linux-gnu/libcuda.so.1").write_text("")
    return root


def _app(
    plugin_dir: Path, gpu_control: control.GpuControl | None, **kw: Any
) -> app.DevicePluginApp:
    devices = fake.FakeBackend.from_name("pcie-l4").discover()
    return app.DevicePluginApp(
        config=app.Config(plugin_dir=plugin_dir, cdi_root=plugin_dir / "cdi", **kw),
        devices=devices,
        health_source=health.HealthBoard(),
        mig_minors=None,
        gpu_control=gpu_control,
    )


def test_real_mps_daemons_run_the_driver_roots_program_with_its_libraries(
    plugin_dir: Path,
) -> None:
    root = _driver_root(plugin_dir / "root")
    ctl = control.FakeGpuControl.for_devices(fake.FakeBackend.from_name("pcie-l4").discover())
    plugin = _app(plugin_dir, ctl, replicas=2, sharing=app.SharingStrategy.MPS, driver_root=root)
    processes = plugin.daemons.processes
    assert processes.command == (str(root / "usr/bin/nvidia-cuda-mps-control"),)
    assert processes.env == {"LD_LIBRARY_PATH": str(root / "usr/lib/x86_64-linux-gnu")}
    assert processes.isolate_shm is True
    assert plugin.daemons.gpu_control is ctl
    # Without MPS sharing nothing is looked up under the driver root.
    assert _app(plugin_dir, ctl, driver_root=root).daemons.processes.command == ()


def test_real_gpus_are_controlled_through_nvml_and_fake_ones_through_a_state_file(
    plugin_dir: Path,
) -> None:
    real = _app(plugin_dir, None).daemons
    assert isinstance(real.gpu_control, control.HostGpuControl)
    assert real.gpu_control._nvml is nvml.real_module()
    fake_daemons = _app(plugin_dir, None, fake_node="/dev/null", mps_dir=plugin_dir / "mps").daemons
    assert isinstance(fake_daemons.gpu_control, control.FakeGpuControl)
    assert fake_daemons.processes.isolate_shm is False
    assert fake_daemons.processes.command[1:] == ("-I", "-S", fakemps.__file__)


def test_mps_problems_at_start_are_logged_and_do_not_stop_the_plugin(
    plugin_dir: Path, kubelet: FakeKubelet, logged: Events
) -> None:
    devices = fake.FakeBackend.from_name("pcie-l4").discover()
    plugin = _app(
        plugin_dir,
        control.FakeGpuControl.for_devices(devices),
        replicas=2,
        sharing=app.SharingStrategy.MPS,
        mps_dir=plugin_dir / "mps",
        driver_root=plugin_dir / "empty-root",
        poll_interval_s=0.1,
    )
    plugin.start()
    try:
        kubelet.wait_requests(1)
    finally:
        plugin.stop()
    problems = events_named(logged, "MPS daemon problem")
    assert [e["problem"] for e in problems] == [
        f"recovery: cannot start MPS control daemon gpu-{i}: nvidia-cuda-mps-control was not "
        "found under the driver root"
        for i in range(4)
    ]
    assert {e["log_level"] for e in problems} == {"error"}
    assert {e["logger"] for e in events_named(logged, "MPS daemons could not be recovered")} == {
        "deviceplugin.mps"
    }
