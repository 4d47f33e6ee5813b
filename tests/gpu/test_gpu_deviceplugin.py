"""The legacy device plugin on the real GPUs: its own process with real NVML, registered with the
test kubelet, lists every GPU by its UUID, healthy, in ListAndWatch (no replicas, no MIG
strategy: one device per GPU, docs/device-plugin.md)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from dra_driver.pb.deviceplugin.v1beta1 import deviceplugin_pb2 as pb
from dra_driver.pb.deviceplugin.v1beta1 import deviceplugin_pb2_grpc as pb_grpc
from dra_driver.testing.dpkubeletsim import FakeKubelet

from . import gpukit

pytestmark = pytest.mark.gpu


def test_list_and_watch_lists_every_gpu_by_uuid(node: gpukit.GpuNode) -> None:
    plugin_dir = Path(tempfile.mkdtemp(prefix="gpuck-dp", dir="/tmp"))
    kubelet = FakeKubelet(plugin_dir).start()
    log_path = plugin_dir / "plugin.log"
    argv = [sys.executable, "-m", "dra_driver", "--log-format", "json", "device-plugin"]
    argv += ["--device-plugin-dir", str(plugin_dir), "--cdi-root", str(plugin_dir / "cdi")]
    argv += ["--driver-root", str(node.driver_root), "--replicas", "1"]
    argv += ["--mig-strategy", "none", "--metrics-address", "127.0.0.1", "--metrics-port", "0"]
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=gpukit.clean_env()
        )
    try:
        try:
            [request] = kubelet.wait_requests(1, timeout=90)
        except AssertionError:
            raise AssertionError(log_path.read_text(errors="replace")[-4000:]) from None
        assert request.resource_name == "nvidia.com/gpu"
        with kubelet.plugin_channel(request.endpoint) as channel:
            stream = pb_grpc.DevicePluginStub(channel).ListAndWatch(pb.Empty(), timeout=30)
            try:
                first = next(iter(stream))
            finally:
                stream.cancel()
        listed = {d.ID: d.health for d in first.devices}
        assert set(listed) == node.uuids, log_path.read_text(errors="replace")[-4000:]
        assert set(listed.values()) == {"Healthy"}, listed
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log_path.read_text(errors="replace")[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        kubelet.stop()
        shutil.rmtree(plugin_dir, ignore_errors=True)
