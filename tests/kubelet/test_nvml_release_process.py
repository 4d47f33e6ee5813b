"""A real driver upgrade on a running agent (docs/lifecycle.md): the fake kernel refuses
``rmmod nvidia`` while the agent holds NVML, ``dra-driver nvml-release`` lets go of every
initialisation, the module is unloaded and loaded with a new version, and the agent resumes on
its own, watching only the module's version file meanwhile (no ``nvmlInit``)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver import healthcontrol
from dra_driver.testing.fakeapi import fakeserver

from .claimkit import put_claim
from .test_driver_lifecycle_process import BOUND_S, GONE, TAINT, Node, start


@pytest.fixture
def node(short_dir: Path, apiserver: fakeserver.FakeApiServer) -> Iterator[Node]:
    n = start(short_dir, apiserver)
    yield n
    n.kubelet.close()
    n.proc.kill()


def status(node: Node) -> dict[str, Any]:
    return healthcontrol.request(node.proc.settings.health_socket, {"op": "status"})


def cli(node: Node, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "dra_driver",
            *args,
            "--kubelet-plugins-dir",
            str(node.proc.plugins_dir),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def released_taints(node: Node) -> bool:
    gpus = node.gpus()
    return node.whole_pool() and all(
        any(t["key"] == TAINT and t["value"] == "released" for t in d.get("taints", []))
        for d in gpus.values()
    )


def test_release_lets_rmmod_succeed_and_the_agent_resumes_on_the_new_driver(node: Node) -> None:
    version_file = node.proc.plugins_dir / "gpu.nvidia.com" / "fake-proc-nvidia" / "version"
    old = version_file.read_text()
    running = put_claim(node.server, "running", ["gpu-0"])
    assert node.kubelet.prepare([running]).claims[running.uid].error == ""
    checkpoint, cdi = node.checkpoint(), node.cdi()
    assert status(node)["nvmlInits"] >= 2  # backend, driver watch, health watcher

    # Without a release the unload is refused, as rmmod refuses a module in use.
    refused = cli(node, "fake-event", "--driver-unload", "--rmmod")
    assert refused.returncode == 1 and "Module nvidia is in use" in refused.stderr
    assert node.gpus() and not node.unschedulable()

    # The release: every init shut down, the GPUs unschedulable, readiness and metric say why.
    done = cli(node, "nvml-release")
    assert done.returncode == 0, done.stderr
    assert "NVML released for a driver upgrade" in done.stdout
    assert status(node)["nvmlInits"] == 0
    node.wait(lambda: released_taints(node), timeout_s=BOUND_S)
    code, ready = node.readyz()
    assert code == 503 and "released for a driver upgrade" in ready["reasons"]["nvidia_driver"]
    assert node.metric("dra_driver_nvml_released") == 1
    assert node.metric("dra_driver_nvidia_driver_available") == 0
    waiting = put_claim(node.server, "waiting", ["gpu-1"])
    answer = node.kubelet.prepare([waiting, running]).claims
    assert GONE in answer[waiting.uid].error and answer[running.uid].error == ""
    calls = status(node)["nvmlInitCalls"]

    # Now the module unloads; the agent reads the version file only, and never calls nvmlInit.
    node.fake_event("--driver-unload", "--rmmod")
    assert not version_file.exists()
    time.sleep(1.0)  # several of the watch's turns
    assert status(node)["nvmlInitCalls"] == calls

    # The new module: the agent resumes by itself and republishes the new version.
    node.fake_event("--driver-load", "--driver-version", "590.10.01")
    assert version_file.read_text() != old and "590.10.01" in version_file.read_text()
    node.wait(lambda: node.schedulable("590.10.1"), timeout_s=BOUND_S)
    assert status(node)["nvmlInits"] >= 1
    assert node.metric("dra_driver_nvml_released") == 0
    node.wait(lambda: node.readyz()[0] == 200)
    # Prepared claims stayed prepared, untouched; the waiting one prepares now.
    assert node.checkpoint() == checkpoint and node.cdi() == cdi
    answer = node.kubelet.prepare([waiting, running]).claims
    assert answer[waiting.uid].error == "" and answer[running.uid].error == ""


def test_an_explicit_resume_takes_nvml_again_without_an_unload(node: Node) -> None:
    assert cli(node, "nvml-release").returncode == 0
    node.wait(lambda: released_taints(node), timeout_s=BOUND_S)
    again = cli(node, "nvml-release")  # a second ask: still released, nothing shut down twice
    assert again.returncode == 0 and status(node)["nvmlInits"] == 0
    version = node.gpus()["gpu-0"]["attributes"]["driverVersion"]["version"]
    done = cli(node, "nvml-release", "--resume")
    assert done.returncode == 0 and "resuming" in done.stdout
    node.wait(lambda: node.schedulable(version), timeout_s=BOUND_S)
    assert status(node)["nvmlInits"] >= 1
    # Released again after the resume: the backend's init was given back once only.
    assert cli(node, "nvml-release").returncode == 0
    assert status(node)["nvmlInits"] == 0
