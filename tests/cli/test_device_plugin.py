"""``dra-driver device-plugin`` as a process: registers, honours env twins, exits cleanly on
SIGTERM (removing its socket), and refuses bad flags with one clear line."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from dra_driver import healthcontrol
from dra_driver.devices import fake
from dra_driver.pb.deviceplugin.v1beta1 import deviceplugin_pb2 as pb
from dra_driver.pb.deviceplugin.v1beta1 import deviceplugin_pb2_grpc as pb_grpc
from dra_driver.testing.fakeapi import fakeserver, memory

RunCli = Callable[..., subprocess.CompletedProcess[str]]  # the run_cli fixture (conftest)


class Recorder(pb_grpc.RegistrationServicer):
    """The kubelet's Registration service, remembering what it was told."""

    def __init__(self) -> None:
        self.requests: list[pb.RegisterRequest] = []
        self.arrived = threading.Event()

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.Empty:
        self.requests.append(request)
        self.arrived.set()
        return pb.Empty()


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(dir="/tmp", prefix="dpcli"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def recorder(plugin_dir: Path) -> Iterator[Recorder]:
    rec = Recorder()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_RegistrationServicer_to_server(rec, server)
    server.add_insecure_port(f"unix://{plugin_dir / 'kubelet.sock'}")
    server.start()
    yield rec
    server.stop(grace=0)


def start(
    plugin_dir: Path,
    *args: str,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dra_driver",
            "--log-format",
            "json",
            "device-plugin",
            "--device-plugin-dir",
            str(plugin_dir),
            "--cdi-root",
            str(plugin_dir / "cdi"),
            # A free port, never the default 8080: plugins of other tests (and workers) run at
            # the same time. A test's own --metrics-port comes later and wins.
            "--metrics-port",
            "0",
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def test_serves_registers_and_shuts_down_cleanly_on_sigterm(
    plugin_dir: Path, recorder: Recorder
) -> None:
    proc = start(
        plugin_dir,
        "--fake",
        "h100-nvl-pairs",
        env={"RESOURCE_NAME": "example.com/gpu", "GPU_REPLICAS": "2"},
    )
    try:
        assert recorder.arrived.wait(timeout=15), "no registration from the subprocess"
        [req] = recorder.requests
        assert (req.version, req.resource_name) == ("v1beta1", "example.com/gpu")
        sock = plugin_dir / req.endpoint
        assert sock.is_socket()
        with grpc.insecure_channel(f"unix://{sock}") as channel:
            first = next(
                iter(pb_grpc.DevicePluginStub(channel).ListAndWatch(pb.Empty(), timeout=5))
            )
        assert len(first.devices) == 8 and first.devices[0].ID.endswith("::0")
        spec = json.loads(
            (plugin_dir / "cdi" / "k8s.device-plugin.nvidia.com-gpu.json").read_text()
        )
        hosts = {n.get("hostPath") for n in spec["containerEdits"]["deviceNodes"]}
        assert hosts == {"/dev/null"}  # fake: no /dev/nvidia* nodes on this host
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert not sock.exists()
    assert '"shutting down"' in err and "SIGTERM" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--device-list-strategy", "legacy"],
            "--device-list-strategy 'legacy' is not one of: cdi, envvar",
        ),
        (["--mig-strategy", "many"], "--mig-strategy 'many' is not one of: none, single, mixed"),
        (["--resource-name", "gpu"], "resource name 'gpu' is not a valid extended resource name"),
        (["--fake", "a100-mig", "--mig-strategy", "single"], "--mig-strategy single needs"),
        (["--replicas", "0"], "--replicas must be between 1 and"),
    ],
)
def test_bad_settings_exit_2_with_one_clear_line(
    plugin_dir: Path, args: list[str], message: str
) -> None:
    base = [] if "--fake" in args else ["--fake", "pcie-l4"]
    proc = start(plugin_dir, *base, *args)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert f"dra-driver: error: {message}" in err
    assert list(plugin_dir.glob("*.sock")) == []


def test_metrics_and_readiness_follow_registration(plugin_dir: Path) -> None:
    log_path = plugin_dir / "plugin.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dra_driver",
                "--log-format",
                "json",
                "device-plugin",
                "--device-plugin-dir",
                str(plugin_dir),
                "--cdi-root",
                str(plugin_dir / "cdi"),
                "--fake",
                "pcie-l4",
                "--metrics-address",
                "127.0.0.1",
                "--metrics-port",
                "0",
            ],
            stdout=log,
            stderr=log,
        )
    try:
        address = _http_address(log_path)
        assert _get(address, "/healthz")[0] == 200
        status, body = _get(address, "/readyz")  # no kubelet yet: not registered, not ready
        assert (status, json.loads(body)["conditions"]) == (503, {"registered": False})
        assert "dra_driver_build_info" in _get(address, "/metrics")[1]
        rec = Recorder()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pb_grpc.add_RegistrationServicer_to_server(rec, server)
        server.add_insecure_port(f"unix://{plugin_dir / 'kubelet.sock'}")
        server.start()
        try:
            assert rec.arrived.wait(timeout=15)
            deadline = time.monotonic() + 10
            while _get(address, "/readyz")[0] != 200 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _get(address, "/readyz")[0] == 200
        finally:
            server.stop(grace=0)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        proc.wait()


def health_of(response: pb.ListAndWatchResponse) -> dict[str, str]:
    return {d.ID: d.health for d in response.devices}


def test_device_plugin_stream_shows_both_transitions_for_every_replica(
    plugin_dir: Path, recorder: Recorder, run_cli: RunCli
) -> None:
    proc = start(
        plugin_dir, "--fake", "h100-nvl-pairs", "--replicas", "2", "--health-min-hold", "0"
    )
    try:
        assert recorder.arrived.wait(timeout=15)
        sock = plugin_dir / recorder.requests[0].endpoint
        with grpc.insecure_channel(f"unix://{sock}") as channel:
            stream = pb_grpc.DevicePluginStub(channel).ListAndWatch(pb.Empty(), timeout=60)
            first = health_of(next(stream))
            assert set(first.values()) == {"Healthy"} and len(first) == 8
            uuid = fake.FakeBackend.from_name("h100-nvl-pairs").discover().gpu(1).uuid
            done = run_cli(
                "fake-event", "--gpu", "1", "--xid", "79", "--device-plugin-dir", str(plugin_dir)
            )
            assert done.returncode == 0, done.stderr
            sick = {i for i, h in health_of(next(stream)).items() if h == "Unhealthy"}
            assert sick == {f"{uuid}::0", f"{uuid}::1"}  # the GPU and every replica of it
            done = run_cli(
                "fake-event",
                "--gpu",
                "1",
                "--recovered",
                env={"DEVICE_PLUGIN_DIR": str(plugin_dir)},
            )
            assert done.returncode == 0, done.stderr
            assert set(health_of(next(stream)).values()) == {"Healthy"}
            stream.cancel()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
        assert proc.returncode == 0, err
        assert not healthcontrol.device_plugin_socket(plugin_dir).exists()
    finally:
        proc.kill()


def _http_address(log_path: Path, timeout_s: float = 15) -> tuple[str, int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in log_path.read_text().splitlines():
            if '"health server listening"' in line:
                event = json.loads(line)
                return event["host"], int(event["port"])
        time.sleep(0.05)
    raise AssertionError(f"no health server in the log:\n{log_path.read_text()}")


def _get(address: tuple[str, int], path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection(*address, timeout=5)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def test_labels_its_node_for_legacy_pods(plugin_dir: Path, recorder: Recorder) -> None:
    """With --node-name the device plugin keeps GFD's labels, e.g. for nodeAffinity on
    nvidia.com/gpu.product; time-slicing shows as -SHARED. One PATCH, then GETs only."""
    with fakeserver.FakeApiServer(memory.InMemoryApi(use_default_cel=False)) as server:
        server.api.put_node("n1", labels={"kubernetes.io/hostname": "n1"})
        kubeconfig = server.write_kubeconfig(plugin_dir / "kubeconfig")
        proc = start(
            plugin_dir,
            "--fake",
            "pcie-l4",
            "--kubeconfig",
            str(kubeconfig),
            env={"NODE_NAME": "n1", "GPU_REPLICAS": "2", "NODE_LABELS_RESYNC": "0.2"},
        )

        def node_calls(method: str) -> int:
            return sum(1 for c in server.api.calls if c.method == method)

        try:
            deadline = time.monotonic() + 60
            while node_calls("get_node") < 6 and time.monotonic() < deadline:
                assert proc.poll() is None
                time.sleep(0.05)
            with server.api._lock:
                labels = dict(server.api._nodes["n1"]["metadata"]["labels"])
            assert labels["nvidia.com/gpu.product"] == "NVIDIA-L4-SHARED"
            assert labels["nvidia.com/gpu.replicas"] == "2"
            assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
            assert labels["kubernetes.io/hostname"] == "n1"
            assert node_calls("get_node") >= 6 and node_calls("patch_node") == 1
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
        finally:
            proc.kill()
    assert proc.returncode == 0, err


def test_without_a_node_name_there_are_no_labels(plugin_dir: Path) -> None:
    log_path = plugin_dir / "plugin.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dra_driver",
                "--log-format",
                "json",
                "device-plugin",
                "--device-plugin-dir",
                str(plugin_dir),
                "--cdi-root",
                str(plugin_dir / "cdi"),
                "--fake",
                "pcie-l4",
            ],
            stdout=log,
            stderr=log,
            env={**os.environ, "NODE_NAME": ""},
        )
    try:
        deadline = time.monotonic() + 60
        while "not labelling the Node: no --node-name (env NODE_NAME)" not in log_path.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.05)
        assert proc.poll() is None  # serving on, labels off
    finally:
        proc.kill()
        proc.wait()


def test_labels_without_api_access_exit_2(plugin_dir: Path) -> None:
    proc = start(
        plugin_dir,
        "--fake",
        "pcie-l4",
        "--node-name",
        "n1",
        "--kubeconfig",
        str(plugin_dir / "missing"),
    )
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert f"node labels need API access: kubeconfig {plugin_dir / 'missing'} does not exist" in err


def test_a_missing_plugin_dir_is_one_line_and_is_not_created(tmp_path: Path) -> None:
    """No kubelet on the host: the directory the kubelet makes is missing. We say so and leave
    the host as it was (no /var/lib/kubelet/device-plugins made behind the user's back)."""
    missing = tmp_path / "kubelet" / "device-plugins"
    proc = start(missing, "--fake", "pcie-l4")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert f"dra-driver: error: --device-plugin-dir {missing} is not a directory" in err
    assert "the kubelet creates it" in err
    assert not (tmp_path / "kubelet").exists()


def test_without_a_kubelet_it_says_which_socket_it_waits_for(plugin_dir: Path) -> None:
    proc = start(plugin_dir, "--fake", "pcie-l4")
    try:
        deadline = time.monotonic() + 20
        lines: list[dict[str, object]] = []
        assert proc.stderr is not None
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(json.loads(line))
            if lines[-1]["event"] == "waiting for the kubelet's registration socket":
                break
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=10)
    [waiting] = [e for e in lines if e["event"] == "waiting for the kubelet's registration socket"]
    assert waiting["kubelet"] == str(plugin_dir / "kubelet.sock")
    assert proc.returncode == 0


def test_list_and_watch_follows_the_driver_and_a_hot_added_gpu(
    plugin_dir: Path,
    recorder: Recorder,
    run_cli: RunCli,
) -> None:
    proc = start(plugin_dir, "--fake", "pcie-l4", "--health-min-hold", "0")
    where = ["--device-plugin-dir", str(plugin_dir)]
    try:
        assert recorder.arrived.wait(timeout=15)
        sock = plugin_dir / recorder.requests[0].endpoint
        with grpc.insecure_channel(f"unix://{sock}") as channel:
            stream = pb_grpc.DevicePluginStub(channel).ListAndWatch(pb.Empty(), timeout=60)
            first = health_of(next(stream))
            assert set(first.values()) == {"Healthy"} and len(first) == 4
            done = run_cli("fake-event", "--driver-unload", *where)
            assert done.returncode == 0, done.stderr
            assert set(health_of(next(stream)).values()) == {"Unhealthy"}
            done = run_cli("fake-event", "--driver-load", "--driver-version", "590.1.2", *where)
            assert done.returncode == 0, done.stderr
            back = health_of(next(stream))
            assert set(back.values()) == {"Healthy"} and set(back) == set(first)
            done = run_cli("fake-event", "--gpu-add", *where)
            assert done.returncode == 0, done.stderr
            grown = health_of(next(stream))
            assert len(grown) == 5 and set(first) < set(grown)
            assert set(grown.values()) == {"Healthy"}
            stream.cancel()
    finally:
        proc.kill()
        proc.communicate(timeout=15)
