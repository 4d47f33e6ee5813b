"""The kubelet plugin on the real GPUs: its own process, real NVML (no ``--fake``), the in-memory
API server on loopback, the test kubelet on its unix sockets. It publishes every GPU, prepares
and unprepares one claim per GPU with a CDI spec whose device nodes and mounts exist on this
host, reports every device healthy, and a CUDA program given only what the spec gives a
container (its device nodes, its environment, its driver libraries) runs a kernel on the GPU.
The last check shows no GPU setting changed (docs/gpu-check.md)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.devices import model
from dra_driver.pb.dra_health.v1 import health_pb2 as v1_pb2
from dra_driver.slices import validate
from dra_driver.testing.fakeapi import fakeserver, memory
from dra_driver.testing.kubeletsim import KubeletSim, PluginProcess

from . import gpukit

pytestmark = pytest.mark.gpu
HERE = Path(__file__).resolve().parent


@dataclasses.dataclass
class Agent:
    server: fakeserver.FakeApiServer
    proc: PluginProcess
    kubelet: KubeletSim
    devices: dict[str, gpukit.Claimable]  # GPU UUID -> the published device claimed for it

    def spec(self, uid: str) -> dict[str, Any]:
        path = self.proc.cdi_root / f"k8s.{gpukit.DRIVER}-claim_{uid}.json"
        loaded: dict[str, Any] = json.loads(path.read_text())
        return loaded


@pytest.fixture(scope="module")
def agent(node: gpukit.GpuNode) -> Iterator[Agent]:
    base = Path(tempfile.mkdtemp(prefix="gpuck-", dir="/tmp"))  # unix socket paths stay short
    server = fakeserver.FakeApiServer(memory.InMemoryApi(use_default_cel=False)).start()
    server.api.put_node(gpukit.NODE)
    proc = PluginProcess(
        base=base,
        kubeconfig=server.write_kubeconfig(base / "kubeconfig"),
        node=gpukit.NODE,
        driver=gpukit.DRIVER,
        publish=True,
        extra=["--driver-root", str(node.driver_root), "--dynamic-mig", "none"],
    )
    at = proc.argv.index("--fake")
    del proc.argv[at : at + 2]  # real NVML
    proc.argv += ["--shareable", "none"]
    with proc.log_path.open("ab") as log:  # PluginProcess.start, with our environment
        proc.proc = subprocess.Popen(
            proc.argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=gpukit.clean_env()
        )
    kubelet = KubeletSim(proc.registry_dir)
    try:
        proc.wait_ready(timeout_s=90)
        kubelet.register(gpukit.DRIVER)
        slices = _published(server, node, proc)
        yield Agent(server, proc, kubelet, gpukit.device_per_gpu(slices, node.uuids))
        kubelet.close()
        proc.signal(signal.SIGTERM)
        assert proc.wait(timeout_s=30) == 0, proc.log()[-4000:]
    finally:
        kubelet.close()
        proc.kill()
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


def _published(
    server: fakeserver.FakeApiServer, node: gpukit.GpuNode, proc: PluginProcess
) -> list[dict[str, Any]]:
    """The pool once it names every GPU (NVML's discovery may take a few seconds)."""
    deadline = time.monotonic() + 90
    while True:
        slices: list[dict[str, Any]] = server.api.all_resource_slices()
        if set(gpukit.device_per_gpu(slices, node.uuids)) == node.uuids:
            return slices
        assert time.monotonic() < deadline, f"not every GPU published:\n{proc.log()[-4000:]}"
        time.sleep(0.2)


def test_published_slices_are_valid_and_name_every_gpu(agent: Agent, node: gpukit.GpuNode) -> None:
    slices = agent.server.api.all_resource_slices()
    for item in slices:
        assert validate.validate(item) == [], item["metadata"]["name"]
        assert item["spec"]["nodeName"] == gpukit.NODE
    assert set(agent.devices) == node.uuids
    assert agent.proc.http_get("/readyz")[0] == 200


def _host_node(entry: dict[str, Any]) -> str:
    return str(entry.get("hostPath") or entry["path"])


def check_spec(spec: dict[str, Any], gpu: model.Gpu, device: gpukit.Claimable) -> None:
    """Every device node of the spec is a character device on this host, every mount's source
    exists, the GPU's own node and the driver's libraries are among them."""
    edits = [spec["containerEdits"], *(d["containerEdits"] for d in spec["devices"])]
    nodes = [n for e in edits for n in e.get("deviceNodes") or []]
    for entry in nodes:
        assert stat.S_ISCHR(os.stat(_host_node(entry)).st_mode), entry
    paths = {n["path"] for n in nodes}
    assert {"/dev/nvidiactl", "/dev/nvidia-uvm"} <= paths, paths
    if device.full:  # its own /dev/nvidia<minor> (a MIG device adds its /dev/nvidia-caps nodes)
        assert f"/dev/nvidia{gpu.minor}" in paths, paths
    mounts = [m for e in edits for m in e.get("mounts") or []]
    for mount in mounts:
        assert os.path.exists(mount["hostPath"]), mount
    names = {Path(m["containerPath"]).name for m in mounts}
    assert any(n.startswith("libcuda.so") for n in names), names
    assert any(n.startswith("libnvidia-ml.so") for n in names), names
    env = dict(v.split("=", 1) for e in edits for v in e.get("env") or [])
    visible = {gpu.uuid} if device.full else {m.uuid for m in gpu.mig_devices}
    assert env.get("NVIDIA_VISIBLE_DEVICES") in visible, env


def test_one_claim_per_gpu_prepares_and_unprepares(agent: Agent, node: gpukit.GpuNode) -> None:
    for gpu in node.devices.gpus:
        device = agent.devices[gpu.uuid]
        ref = gpukit.put_claim(agent.server, f"gpu-check-{gpu.index}", device.name)
        got = agent.kubelet.prepare([ref]).claims[ref.uid]
        assert got.error == "", (device, got.error)
        assert [(d.pool_name, d.device_name) for d in got.devices] == [(gpukit.NODE, device.name)]
        assert list(got.devices[0].cdi_device_ids) == [
            f"k8s.{gpukit.DRIVER}/claim={ref.uid}-{device.name}"
        ]
        check_spec(agent.spec(ref.uid), gpu, device)
        done = agent.kubelet.unprepare([ref]).claims[ref.uid]
        assert done.error == "", (device, done.error)
        assert list(agent.proc.cdi_root.glob(f"*{ref.uid}*")) == []


def test_the_health_stream_reports_every_device_healthy(agent: Agent) -> None:
    stream = agent.kubelet.watch_health("v1.DRAResourceHealth")
    try:
        first = next(stream)
    finally:
        stream.cancel()
    health = {(d.device.pool_name, d.device.device_name): d.health for d in first.devices}
    for device in agent.devices.values():
        assert health.get((gpukit.NODE, device.name)) == v1_pb2.HEALTHY, (device, health)


# --- a CUDA program with only what the spec gives a container ---------------------------------


def _cuda_python() -> tuple[str, str]:
    """(interpreter, runtime) of the first Python here that imports torch, cupy or cuda-python
    (``GPU_CHECK_PYTHON`` first when set), or a skip."""
    candidates = [os.environ.get("GPU_CHECK_PYTHON"), sys.executable, shutil.which("python3")]
    for python in dict.fromkeys(c for c in candidates if c):
        done = subprocess.run(
            [python, str(HERE / "cudakernel.py"), "--which"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode == 0 and done.stdout.strip():
            return python, done.stdout.strip()
    pytest.skip("no CUDA runtime importable (torch, cupy or cuda-python; or GPU_CHECK_PYTHON)")


def _unshare() -> list[str]:
    """``unshare`` for a private mount namespace — as is when root, else (or when that is refused,
    as in a container without CAP_SYS_ADMIN) inside a user namespace — or a skip."""
    binary = shutil.which("unshare")
    if binary is None:
        pytest.skip("unshare (util-linux) not found")
    mount = ["--mount", "--propagation", "private"]
    tries = [[binary, *mount]] if os.geteuid() == 0 else []
    tries.append([binary, "--user", "--map-root-user", *mount])
    refused = ""
    for argv in tries:
        done = subprocess.run([*argv, "true"], capture_output=True, text=True, check=False)
        if done.returncode == 0:
            return argv
        refused = done.stderr.strip()
    pytest.skip(f"a private mount namespace is not permitted here: {refused}")


def _child_env(spec: dict[str, Any]) -> list[str]:
    """The spec's environment, plus the loader path to the driver libraries it mounts (seen at
    their host paths here: nothing is mounted over the host's library directories)."""
    edits = [spec["containerEdits"], *(d["containerEdits"] for d in spec["devices"])]
    env = [v for e in edits for v in e.get("env") or []]
    libraries = dict.fromkeys(
        str(Path(m["hostPath"]).parent)
        for e in edits
        for m in e.get("mounts") or []
        if ".so" in Path(m["hostPath"]).name
    )
    extra = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": ":".join(libraries)}
    if "HOME" in os.environ:
        extra["HOME"] = os.environ["HOME"]
    return [*env, *(f"{k}={v}" for k, v in extra.items())]


def test_a_cuda_kernel_runs_with_only_the_specs_device_nodes(
    agent: Agent, node: gpukit.GpuNode, tmp_path: Path
) -> None:
    python, runtime = _cuda_python()
    unshare = _unshare()
    full = [g for g in node.devices.gpus if agent.devices[g.uuid].full]
    if not full:
        pytest.skip("every GPU is in MIG mode: no full GPU to run a kernel on")
    for gpu in full:
        device = agent.devices[gpu.uuid]
        ref = gpukit.put_claim(agent.server, f"gpu-check-cuda-{gpu.index}", device.name)
        got = agent.kubelet.prepare([ref]).claims[ref.uid]
        assert got.error == "", (device, got.error)
        try:
            spec = agent.spec(ref.uid)
            edits = [spec["containerEdits"], *(d["containerEdits"] for d in spec["devices"])]
            entries = [n for e in edits for n in e.get("deviceNodes") or []]
            nodes = sorted({n["path"]: _host_node(n) for n in entries}.items())
            stage = tmp_path / f"dev-{gpu.index}"
            stage.mkdir()
            argv = [*unshare, sys.executable, str(HERE / "nsexec.py"), "--stage", str(stage)]
            argv += [f"--node={path}={host}" for path, host in nodes]
            argv += [f"--env={v}" for v in _child_env(spec)]
            argv += ["--", python, str(HERE / "cudakernel.py"), runtime]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
            assert done.returncode == 0, f"{device}: {done.stderr[-4000:]}"
            report = json.loads(done.stdout.strip().splitlines()[-1])
            assert report["dev"] == sorted(p.removeprefix("/dev/") for p, _ in nodes), report
            assert report["count"] == 1, report  # only the claimed GPU's node: one GPU
            if report["uuid"]:
                assert gpukit.uuid_hex(report["uuid"]) == gpukit.uuid_hex(gpu.uuid), report
            assert report["sum"] == report["expected"], report
        finally:
            done_unprepare = agent.kubelet.unprepare([ref]).claims[ref.uid]
            assert done_unprepare.error == ""


def test_no_gpu_setting_changed(settings_before: dict[str, object], nvidia_smi: Path) -> None:
    """Last in the session's order: compute and MIG modes and the MIG devices are as they were."""
    assert gpukit.settings(nvidia_smi) == settings_before
