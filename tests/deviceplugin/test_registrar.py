"""Socket lifecycle and registration: kubelet restarts, lost sockets, refusals, clean shutdown."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from dra_driver.deviceplugin import app, registrar
from dra_driver.devices import fake, health
from dra_driver.pb.deviceplugin.v1beta1 import deviceplugin_pb2 as pb

from .conftest import StartPlugin
from .testkubelet import FakeKubelet


def test_kubelet_restart_leads_to_new_serve_and_registration_within_seconds(
    start_plugin: StartPlugin, kubelet: FakeKubelet, plugin_dir: Path
) -> None:
    running = start_plugin("h100-nvl-pairs")
    [first] = kubelet.wait_requests(1)
    endpoint = running.app.endpoints["nvidia.com/gpu"]
    assert endpoint.serves == 1
    began = time.monotonic()
    kubelet.restart(delete_plugin_sockets=True)
    requests = kubelet.wait_requests(2, timeout=5)
    assert time.monotonic() - began < 3
    assert requests[1] == first
    assert endpoint.serves == 2
    assert (plugin_dir / first.endpoint).is_socket()
    opts = running.stub().GetDevicePluginOptions(pb.Empty(), timeout=5)
    assert opts.get_preferred_allocation_available


def test_new_kubelet_socket_alone_triggers_registration(
    start_plugin: StartPlugin, kubelet: FakeKubelet
) -> None:
    running = start_plugin("h100-nvl-pairs")
    kubelet.wait_requests(1)
    kubelet.restart(delete_plugin_sockets=False)
    kubelet.wait_requests(2, timeout=5)
    assert running.app.endpoints["nvidia.com/gpu"].serves == 1


def test_lost_plugin_socket_is_served_again_and_re_registered(
    start_plugin: StartPlugin, kubelet: FakeKubelet, plugin_dir: Path
) -> None:
    running = start_plugin("h100-nvl-pairs")
    [req] = kubelet.wait_requests(1)
    (plugin_dir / req.endpoint).unlink()
    kubelet.wait_requests(2, timeout=5)
    assert (plugin_dir / req.endpoint).is_socket()
    assert running.stub().GetDevicePluginOptions(pb.Empty(), timeout=5) is not None


def test_registers_once_the_kubelet_appears(
    start_plugin: StartPlugin, kubelet: FakeKubelet
) -> None:
    kubelet.stop()
    running = start_plugin("pcie-l4")
    time.sleep(0.4)
    assert kubelet.requests == []
    kubelet.start()
    kubelet.wait_requests(1, timeout=5)
    assert running.app.endpoints["nvidia.com/gpu"].wait_registered(1, timeout=5)


def test_refused_registration_stops_the_plugin_with_the_reason(plugin_dir: Path) -> None:
    kubelet = FakeKubelet(plugin_dir, reject="resource nvidia.com/gpu is already registered")
    kubelet.start()
    try:
        devices = fake.FakeBackend.from_name("pcie-l4").discover()
        plugin = app.DevicePluginApp(
            config=app.Config(
                plugin_dir=plugin_dir, cdi_root=plugin_dir / "cdi", poll_interval_s=0.1
            ),
            devices=devices,
            health_source=health.HealthBoard(),
            mig_minors=None,
        )
        result: list[registrar.RegistrationError | None] = []
        stop = threading.Event()
        thread = threading.Thread(target=lambda: result.append(plugin.run(stop)))
        thread.start()
        thread.join(timeout=5)
        stop.set()
        assert not thread.is_alive(), "a refused registration must end run()"
        [fatal] = result
        assert fatal is not None
        assert "rejected the registration of nvidia.com/gpu" in str(fatal)
        assert "already registered" in str(fatal)
        assert not plugin.endpoints["nvidia.com/gpu"].socket_path.exists()
    finally:
        kubelet.stop()


def test_stop_removes_our_socket_only(
    start_plugin: StartPlugin, kubelet: FakeKubelet, plugin_dir: Path
) -> None:
    running = start_plugin("h100-nvl-pairs")
    [req] = kubelet.wait_requests(1)
    other = plugin_dir / "someone-else.sock"
    other.write_text("")
    running.app.stop()
    assert not (plugin_dir / req.endpoint).exists()
    assert other.exists() and kubelet.socket.exists()


def test_socket_path_too_long_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    deep = Path("/tmp") / ("d" * 100)
    devices = fake.FakeBackend.from_name("pcie-l4").discover()
    with pytest.raises(registrar.RegistrationError, match="longer than the 107 bytes"):
        app.DevicePluginApp(
            config=app.Config(plugin_dir=deep, cdi_root=tmp_path),
            devices=devices,
            health_source=health.HealthBoard(),
            mig_minors=None,
        )
