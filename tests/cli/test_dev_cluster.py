"""``dra-driver dev-cluster`` as a process: it starts the in-memory API server over HTTPS and
one real agent per node, ``doctor`` and ``capacity --kubeconfig`` work against its kubeconfig
(nodes x GPUs), kubectl accepts what it serves, and SIGINT/SIGTERM stop it with exit 0, its
agents gone and its directory removed."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from dra_driver.kube import client, objectclient, objects

CLAIMS = objects.Kind("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim")
START_S = 150.0  # three agents starting at once on a loaded 2-core machine


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"


class Running:
    def __init__(self, tmp: Path, *args: str) -> None:
        self.env = {
            **{k: v for k, v in os.environ.items() if k != "KUBECONFIG"},
            "HOME": str(tmp),
            "TMPDIR": str(tmp / "t"),
        }
        (tmp / "t").mkdir()
        self.out_path, self.err_path = tmp / "out", tmp / "err"
        with self.out_path.open("wb") as out, self.err_path.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "dra_driver", "dev-cluster", *args],
                stdout=out,
                stderr=err,
                env=self.env,
            )

    def wait_ready(self) -> str:
        deadline = time.monotonic() + START_S
        while "Ctrl-C" not in self.out_path.read_text():
            assert self.proc.poll() is None, self.err_path.read_text()
            assert time.monotonic() < deadline, self.err_path.read_text()
            time.sleep(0.2)
        return self.out_path.read_text()

    def wait_for_err(self, pattern: str) -> re.Match[str]:
        deadline = time.monotonic() + 60
        while True:
            found = re.search(pattern, self.err_path.read_text())
            if found:
                return found
            assert time.monotonic() < deadline, self.err_path.read_text()
            time.sleep(0.2)

    def cli(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "dra_driver", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={**self.env, **env},
        )

    def stop(self, sig: signal.Signals) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=60)


@pytest.fixture
def short() -> Iterator[Path]:
    """A directory with a short path: pytest's are too deep for the agents' unix sockets."""
    path = Path(tempfile.mkdtemp(prefix="dc-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def dev() -> Iterator[list[Running]]:
    started: list[Running] = []
    yield started
    for running in started:
        if running.proc.poll() is None:
            running.proc.kill()
            running.proc.wait()


def test_doctor_and_capacity_against_it_then_sigint_stops_everything(
    dev: list[Running], short: Path
) -> None:
    running = Running(short, "--nodes", "3", "--fake", "dgx-h100")
    dev.append(running)
    out = running.wait_ready()
    assert out.startswith("A DEVELOPMENT STAND-IN, not a Kubernetes cluster")
    assert "nodes:       3 x dgx-h100: 24 devices in 3 ResourceSlice(s)" in out
    kubeconfig = re.search(r"^kubeconfig:\s+(\S+)$", out, re.M)
    assert kubeconfig is not None
    path = Path(kubeconfig.group(1))
    workdir = path.parent
    assert workdir.parent == short / "t"
    pids = [int(p) for p in re.findall(r"agent pid (\d+)", out)]
    assert len(pids) == 3 and not any(gone(p) for p in pids)
    assert re.search(r"^API server:\s+https://127\.0\.0\.1:\d+ ", out, re.M)

    doctor = running.cli("doctor", "--kubeconfig", str(path))
    assert doctor.returncode == 0, doctor.stderr
    assert "RBAC of these credentials: all the agent needs" in doctor.stdout
    capacity = running.cli("capacity", "--kubeconfig", str(path))
    assert capacity.returncode == 0, capacity.stderr
    assert capacity.stdout.splitlines()[0] == (
        "3 nodes, 24 GPUs: 24 free, 0 held by claims, 0 unhealthy"
    )
    # kubectl's conventions: the same through KUBECONFIG, and --by-node names every node.
    by_node = running.cli("capacity", "--by-node", KUBECONFIG=str(path))
    assert by_node.returncode == 0, by_node.stderr
    assert all(f"\nnode-{i} " in by_node.stdout for i in range(3)), by_node.stdout
    registry = re.search(r"kubeletcli --registry-dir (\S+) info", out)
    assert registry is not None
    info = subprocess.run(
        [
            sys.executable,
            "-m",
            "dra_driver.testing.kubeletcli",
            "--registry-dir",
            registry.group(1),
            "info",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=running.env,
    )
    assert info.returncode == 0, info.stderr
    assert info.stdout.startswith("plugin gpu.nvidia.com: endpoint ")
    # A claim created over the API: the scheduler stand-in allocates it, the kubelet stand-in
    # prepares it on the real agent (CDI devices), then unprepares it.
    claim = running.cli("claim", "--gpus", "2", "--name", "two", "--namespace", "default")
    assert claim.returncode == 0, claim.stderr
    kube = client.KubeClient.connect(path)
    try:
        created = objectclient.ObjectClient(kube).create(CLAIMS, yaml.safe_load(claim.stdout))
    finally:
        kube.close()
    prepare = running.wait_for_err(
        r"kubeletcli --registry-dir (\S+) prepare default/two --uid (\S+)"
    )
    assert prepare.group(2) == created["metadata"]["uid"]
    assert "allocated ResourceClaim default/two on node-" in running.err_path.read_text()
    for verb in ("prepare", "unprepare"):
        kubelet = subprocess.run(
            [
                sys.executable,
                "-m",
                "dra_driver.testing.kubeletcli",
                "--registry-dir",
                prepare.group(1),
                verb,
                "default/two",
                "--uid",
                prepare.group(2),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=running.env,
        )
        assert kubelet.returncode == 0, kubelet.stderr
        assert kubelet.stdout.splitlines()[-1] == f"{verb}d default/two"
        if verb == "prepare":
            cdi = [line for line in kubelet.stdout.splitlines() if ": CDI " in line]
            assert len(cdi) == 2, kubelet.stdout
    kubectl = shutil.which("kubectl")
    if kubectl is not None:  # not everywhere; where it is, it must accept what is served
        got = subprocess.run(
            [kubectl, "--kubeconfig", str(path), "get", "resourceslices", "-o", "name"],
            capture_output=True,
            text=True,
            timeout=60,
            env=running.env,
        )
        assert got.returncode == 0, got.stderr
        assert sorted(got.stdout.split()) == [
            f"resourceslice.resource.k8s.io/node-{i}-gpu.nvidia.com-0" for i in range(3)
        ]
        table = subprocess.run(
            [kubectl, "--kubeconfig", str(path), "get", "resourceslices"],
            capture_output=True,
            text=True,
            timeout=60,
            env=running.env,
        )
        assert table.returncode == 0, table.stderr
        rows = [line.split() for line in table.stdout.splitlines()]
        assert rows[0] == ["NAME", "NODE", "DRIVER", "POOL", "AGE"]
        assert [r[1:4] for r in rows[1:]] == [
            [f"node-{i}", "gpu.nvidia.com", f"node-{i}"] for i in range(3)
        ]

    assert running.stop(signal.SIGINT) == 0, running.err_path.read_text()
    assert all(gone(p) for p in pids)
    assert not workdir.exists()
    assert "stopped 3 agent(s) and the API server" in running.err_path.read_text()


def test_sigterm_stops_it_and_a_kept_dir_stays(dev: list[Running], short: Path) -> None:
    keep = short / "keep"
    running = Running(short, "--nodes", "1", "--fake", "pcie-l4", "--dir", str(keep))
    dev.append(running)
    out = running.wait_ready()
    (pid,) = [int(p) for p in re.findall(r"agent pid (\d+)", out)]
    assert (keep / "kubeconfig").is_file()
    assert running.stop(signal.SIGTERM) == 0, running.err_path.read_text()
    assert gone(pid)
    assert (keep / "n0" / "plugin.log").is_file()
    assert not list(keep.rglob("*.sock"))  # the agent removed its sockets


def test_a_bad_profile_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "dra_driver", "dev-cluster", "--fake", "nope"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "nope" in proc.stderr
    assert proc.stdout == ""


def test_a_directory_too_deep_for_sockets_is_refused(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60)
    proc = subprocess.run(
        [sys.executable, "-m", "dra_driver", "dev-cluster", "--nodes", "1", "--dir", str(deep)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "too deep for the agents' unix sockets" in proc.stderr.splitlines()[-1]


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_agents_stop_when_it_is_killed(dev: list[Running], short: Path) -> None:
    running = Running(short, "--nodes", "1", "--fake", "pcie-l4", "--dir", str(short / "k"))
    dev.append(running)
    (pid,) = [int(p) for p in re.findall(r"agent pid (\d+)", running.wait_ready())]
    assert running.stop(signal.SIGKILL) == -signal.SIGKILL
    deadline = time.monotonic() + 30
    while not gone(pid):  # the agent got SIGTERM from the kernel and stopped
        assert time.monotonic() < deadline, f"agent {pid} outlived a SIGKILLed dev-cluster"
        time.sleep(0.1)
