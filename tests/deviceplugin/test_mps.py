"""MPS replicas in device-plugin mode: one daemon per GPU while the plugin serves them, each
replica's container gets the pipe directory and 1/N of the GPU, one replica per container."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

import grpc
import pytest

from dra_driver.deviceplugin import app
from dra_driver.pb.deviceplugin.v1beta1 import deviceplugin_pb2 as pb

from .conftest import StartPlugin
from .testkubelet import FakeKubelet


def _records(mps_dir: Path) -> dict[str, dict[str, object]]:
    """The daemon records on disk now. Read while the supervisor works: a record it removes
    between the listing and the read (a dead daemon's, before its restart) is not there."""
    found: dict[str, dict[str, object]] = {}
    for path in (mps_dir / "daemons").glob("*.json"):
        try:
            record = json.loads(path.read_text())
        except FileNotFoundError:
            continue
        found[record["id"]] = record
    return found


def _modes(mps_dir: Path) -> dict[str, str]:
    state = json.loads((mps_dir / "fake-gpu-control.json").read_text())
    return {uuid: s["computeMode"] for uuid, s in state.items()}


def _kill_all(mps_dir: Path) -> None:
    for record in _records(mps_dir).values():
        pid = record.get("pid")
        if isinstance(pid, int):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def mps_dir(plugin_dir: Path) -> Path:
    return plugin_dir / "mps"


def test_mps_replicas_get_the_daemon_and_a_quarter_of_the_gpu(
    start_plugin: StartPlugin, kubelet: FakeKubelet, mps_dir: Path
) -> None:
    try:
        running = start_plugin(
            "h100-nvl-pairs",
            replicas=4,
            sharing=app.SharingStrategy.MPS,
            mps_dir=mps_dir,
            fake_node="/dev/null",
        )
        kubelet.wait_requests(1)
        u = running.uuids()
        records = _records(mps_dir)
        assert sorted(records) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
        assert {r["state"] for r in records.values()} == {"Running"}
        assert set(_modes(mps_dir).values()) == {"ExclusiveProcess"}

        stub = running.stub()
        req = pb.AllocateRequest()
        req.container_requests.add(devices_ids=[f"{u[1]}::2"])
        [resp] = stub.Allocate(req, timeout=5).container_responses
        memory_mib = running.devices.gpus[1].memory_bytes // 4 >> 20
        assert dict(resp.envs) == {
            "NVIDIA_VISIBLE_DEVICES": u[1],
            "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"{u[1]}={memory_mib}M",
        }
        assert {m.container_path: m.host_path for m in resp.mounts} == {
            "/tmp/nvidia-mps": str(mps_dir / "gpu-1" / "pipe"),
            "/dev/shm": str(mps_dir / "gpu-1" / "shm"),
        }
        assert (mps_dir / "gpu-1" / "pipe" / "control").exists()

        two = pb.AllocateRequest()
        two.container_requests.add(devices_ids=[f"{u[0]}::0", f"{u[0]}::1"])
        with pytest.raises(grpc.RpcError) as err:
            stub.Allocate(two, timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "exactly one replica (asked for 2)" in str(err.value.details())

        # A daemon that dies is restarted by supervision.
        dead = records["gpu-3"]["pid"]
        assert isinstance(dead, int)
        os.kill(dead, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while running.app.daemons.alive(running.app.daemons.records()["gpu-3"]):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert running.app.daemons.supervise() == ["gpu-3"]
        records = _records(mps_dir)
        assert records["gpu-3"]["pid"] != dead

        # A restarted plugin adopts the daemons (same pids); one without MPS stops them all.
        pids = {k: r["pid"] for k, r in records.items()}
        running.app.stop()
        again = start_plugin(
            "h100-nvl-pairs",
            replicas=4,
            sharing=app.SharingStrategy.MPS,
            mps_dir=mps_dir,
            fake_node="/dev/null",
        )
        assert {k: r["pid"] for k, r in _records(mps_dir).items()} == pids
        again.app.stop()
        start_plugin("h100-nvl-pairs", replicas=4, mps_dir=mps_dir, fake_node="/dev/null")
        assert _records(mps_dir) == {}
        assert set(_modes(mps_dir).values()) == {"Default"}
    finally:
        _kill_all(mps_dir)


def test_time_slicing_replicas_get_no_mps(
    start_plugin: StartPlugin, kubelet: FakeKubelet, mps_dir: Path
) -> None:
    running = start_plugin("h100-nvl-pairs", replicas=2, mps_dir=mps_dir)
    kubelet.wait_requests(1)
    u = running.uuids()
    req = pb.AllocateRequest()
    req.container_requests.add(devices_ids=[f"{u[0]}::0", f"{u[0]}::1"])
    [resp] = running.stub().Allocate(req, timeout=5).container_responses
    assert dict(resp.envs) == {"NVIDIA_VISIBLE_DEVICES": u[0]}
    assert list(resp.mounts) == []
    assert not (mps_dir / "daemons").exists()


def test_supervision_restarts_a_dead_daemon_by_itself(
    start_plugin: StartPlugin, kubelet: FakeKubelet, mps_dir: Path
) -> None:
    running = start_plugin(
        "pcie-l4",
        replicas=2,
        sharing=app.SharingStrategy.MPS,
        mps_dir=mps_dir,
        fake_node="/dev/null",
        mps_check_interval_s=0.1,
    )
    try:
        kubelet.wait_requests(1)
        dead = _records(mps_dir)["gpu-1"]["pid"]
        assert isinstance(dead, int)
        os.kill(dead, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while _records(mps_dir).get("gpu-1", {}).get("pid") in (dead, None):
            assert time.monotonic() < deadline, "the dead daemon was not restarted"
            time.sleep(0.05)
        assert _records(mps_dir)["gpu-1"]["state"] == "Running"
    finally:
        running.app.stop()  # supervision ends first, or it restarts what is killed below
        _kill_all(mps_dir)
