"""``dra-driver publish`` learns what the API server keeps (the fake server over real HTTP, gates
off, real subprocesses), and ``--gpu-sets`` takes ``auto``."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from dra_driver import cli
from dra_driver.cli import common, kubelet_plugin
from dra_driver.testing.fakeapi import fakeserver


def run(
    server: fakeserver.FakeApiServer, tmp_path: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    server.api.put_node("n1", uid="uid-n1")
    argv = [
        sys.executable,
        "-m",
        "dra_driver",
        "--log-format",
        "json",
        "publish",
        "--node-name",
        "n1",
        "--kubeconfig",
        str(server.write_kubeconfig(tmp_path / "kc")),
        "--once",
        *extra,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(
    ("gate", "flags"),
    [
        ("DRAPartitionableDevices", ("--fake", "h100-mig", "--dynamic-mig", "all")),
        ("DRAConsumableCapacity", ("--fake", "dgx-h100", "--shareable", "all")),
    ],
)
def test_publish_refuses_what_the_server_would_drop(
    tmp_path: Path, gate: str, flags: tuple[str, ...]
) -> None:
    with fakeserver.FakeApiServer(disabled_gates={gate}) as server:
        done = run(server, tmp_path, *flags)
        assert done.returncode == 1, done.stderr
        errors = [x for x in done.stderr.splitlines() if x.startswith("dra-driver: error:")]
        assert len(errors) == 1 and gate in errors[0] and " ".join(flags[2:]) in errors[0]
        assert server.api.all_resource_slices() == []


def test_publish_with_taints_off_and_defaults_publishes_and_says_what_is_dropped(
    tmp_path: Path,
) -> None:
    with fakeserver.FakeApiServer(disabled_gates={"DRADeviceTaints"}) as server:
        done = run(server, tmp_path, "--fake", "dgx-h100")
        assert done.returncode == 0, done.stderr
        assert '"feature": "deviceTaints"' in done.stdout + done.stderr
        (stored,) = server.api.all_resource_slices()
        assert len(stored["spec"]["devices"]) == 8


def parse(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(["kubelet-plugin", "--node-name", "n1", *argv])


def test_gpu_sets_auto_is_the_default_and_means_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPU_SETS", raising=False)
    assert parse().gpu_sets == "auto"
    assert kubelet_plugin.settings_from(parse()).gpu_sets is True
    assert kubelet_plugin.settings_from(parse("--gpu-sets=auto")).gpu_sets is True
    assert kubelet_plugin.settings_from(parse("--gpu-sets=false")).gpu_sets is False
    assert kubelet_plugin.settings_from(parse("--gpu-sets")).gpu_sets is True
    monkeypatch.setenv("GPU_SETS", "AUTO")
    assert common.gpu_sets_from(parse()) is True
    with pytest.raises(SystemExit):
        parse("--gpu-sets=maybe")
