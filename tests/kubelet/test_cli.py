"""``dra-driver kubelet-plugin`` flags: environment twins, defaults and clear usage errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_driver import cli
from dra_driver.cli import kubelet_plugin


def parse(argv: list[str]) -> kubelet_plugin.app.PluginSettings:
    args = cli.build_parser().parse_args(["kubelet-plugin", *argv])
    return kubelet_plugin.settings_from(args)


def test_defaults_and_derived_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    for env in ("NODE_NAME", "DRIVER_NAME", "CDI_ROOT", "KUBECONFIG", "FAKE_PROFILE"):
        monkeypatch.delenv(env, raising=False)
    s = parse(["--node-name", "n1"])
    assert (s.node_name, s.driver_name, s.fake) == ("n1", "gpu.nvidia.com", False)
    assert s.registration_socket == Path(
        "/var/lib/kubelet/plugins_registry/gpu.nvidia.com-reg.sock"
    )
    assert s.dra_socket == Path("/var/lib/kubelet/plugins/gpu.nvidia.com/dra.sock")
    assert s.cdi_root == Path("/var/run/cdi") and s.kubeconfig is None


def test_environment_twins(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {
        "NODE_NAME": "node-7",
        "DRIVER_NAME": "gpu.example.com",
        "KUBELET_REGISTRY_DIR": "/r",
        "KUBELET_PLUGINS_DIR": "/p",
        "CDI_ROOT": "/c",
        "KUBECONFIG": "/k",
        "DRIVER_ROOT": "/run/nvidia/driver",
        "FAKE_PROFILE": "dgx-h100",
        "PREPARE_SERIAL": "true",
        "CLEANUP_INTERVAL": "5",
        "DEV_ROOT": "/host",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    s = parse([])
    assert (s.node_name, s.driver_name, s.registry_dir, s.plugins_dir, s.cdi_root) == (
        "node-7",
        "gpu.example.com",
        Path("/r"),
        Path("/p"),
        Path("/c"),
    )
    assert (s.kubeconfig, s.driver_root, s.fake, s.serial, s.cleanup_interval_s, s.dev_root) == (
        Path("/k"),
        Path("/run/nvidia/driver"),
        True,
        True,
        5.0,
        Path("/host"),
    )
    assert parse(["--node-name", "flag-wins"]).node_name == "flag-wins"


def test_usage_errors_are_one_clear_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert cli.main(["kubelet-plugin", "--fake", "dgx-h100"]) == 2
    assert "error: --node-name (or NODE_NAME) is required" in capsys.readouterr().err
    missing = tmp_path / "nope.yaml"
    assert (
        cli.main(
            [
                "kubelet-plugin",
                "--node-name",
                "n1",
                "--fake",
                "dgx-h100",
                "--kubeconfig",
                str(missing),
            ]
        )
        == 2
    )
    assert f"kubeconfig {missing} does not exist" in capsys.readouterr().err
    assert cli.main(["kubelet-plugin", "--node-name", "n1", "--fake", "no-such-profile"]) == 2
    assert "no-such-profile" in capsys.readouterr().err
