"""``dra-driver publish`` against the fake API server over real HTTP, as real subprocesses."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.testing.fakeapi import fakeserver


@pytest.fixture
def server() -> Iterator[fakeserver.FakeApiServer]:
    with fakeserver.FakeApiServer() as srv:
        srv.api.put_node("n1", uid="uid-n1")
        yield srv


def command(kubeconfig: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "dra_driver",
        "--log-format",
        "json",
        "publish",
        "--node-name",
        "n1",
        "--fake",
        "dgx-h100",
        "--kubeconfig",
        str(kubeconfig),
        *extra,
    ]


def test_once_publishes_then_writes_nothing(
    server: fakeserver.FakeApiServer, tmp_path: Path
) -> None:
    kubeconfig = server.write_kubeconfig(tmp_path / "kc")
    first = subprocess.run(
        command(kubeconfig, "--once"), capture_output=True, text=True, timeout=60, check=False
    )
    assert first.returncode == 0, first.stderr
    stored = sorted(server.api.all_resource_slices(), key=lambda s: s["metadata"]["name"])
    assert all(obj["metadata"]["ownerReferences"][0]["uid"] == "uid-n1" for obj in stored)
    # One slice: the 8 GPUs of a DGX H100, each with its set ranks, no counters.
    (only,) = stored
    assert "sharedCounters" not in only["spec"]
    assert [d["name"] for d in only["spec"]["devices"]] == [f"gpu-{i}" for i in range(8)]
    assert all("setRanks" in d["attributes"] for d in only["spec"]["devices"])
    server.api.reset_calls()
    again = subprocess.run(
        command(kubeconfig, "--once"), capture_output=True, text=True, timeout=60, check=False
    )
    assert again.returncode == 0, again.stderr
    assert server.api.writes == 0


def test_once_retries_server_errors_and_gives_up_after_the_timeout(
    server: fakeserver.FakeApiServer, tmp_path: Path
) -> None:
    kubeconfig = server.write_kubeconfig(tmp_path / "kc")
    server.api.fail_next("list_resource_slices", 503, times=2)
    ok = subprocess.run(
        command(kubeconfig, "--once"), capture_output=True, text=True, timeout=60, check=False
    )
    assert ok.returncode == 0, ok.stderr
    assert "retrying" in ok.stderr
    server.api.fail_next("list_resource_slices", 503, times=1000)
    gave_up = subprocess.run(
        command(kubeconfig, "--once", "--timeout", "1"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert gave_up.returncode == 1 and "giving up" in gave_up.stderr


def test_runs_until_sigterm_and_recreates_a_deleted_slice(
    server: fakeserver.FakeApiServer, tmp_path: Path
) -> None:
    kubeconfig = server.write_kubeconfig(tmp_path / "kc")
    proc = subprocess.Popen(command(kubeconfig), stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30

        def generations() -> dict[str, int]:
            return {
                s["metadata"]["name"]: s["spec"]["pool"]["generation"]
                for s in server.api.all_resource_slices()
            }

        while len(generations()) < 1:  # the whole pool: one slice of 8 GPUs
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        server.api.remove_resource_slice("n1-gpu.nvidia.com-0")
        # Recreated, and the pool moves to the next generation.
        while set(generations().values()) != {2}:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        assert generations() == {"n1-gpu.nvidia.com-0": 2}
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr


def test_missing_kubeconfig_is_a_clear_error(tmp_path: Path) -> None:
    proc = subprocess.run(
        command(tmp_path / "nope"), capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 2 and "does not exist" in proc.stderr


def test_once_without_gpu_sets_and_with_dynamic_mig(
    server: fakeserver.FakeApiServer, tmp_path: Path
) -> None:
    """``publish`` takes the agent's publishing flags: ``--gpu-sets=false`` leaves out the set
    ranks, ``--dynamic-mig all`` adds the MIG placements and their counters."""
    kubeconfig = server.write_kubeconfig(tmp_path / "kc")
    flags = ("--once", "--gpu-sets=false", "--dynamic-mig", "all")
    done = subprocess.run(
        command(kubeconfig, *flags), capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    stored = server.api.all_resource_slices()
    counter_sets = {c["name"] for s in stored for c in s["spec"].get("sharedCounters", [])}
    assert counter_sets == {f"gpu-{i}-mig" for i in range(8)}  # one per dynamic GPU only
    devices = [d for s in stored for d in s["spec"].get("devices", [])]
    kinds = {d["attributes"]["type"]["string"] for d in devices}
    assert kinds == {"gpu", "mig"}
    assert not any(k.startswith("setRank") for d in devices for k in d["attributes"])
    bad = subprocess.run(
        command(kubeconfig, "--once", "--dynamic-mig", "("),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2 and "dynamic-mig" in bad.stderr
