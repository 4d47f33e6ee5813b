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
        "KUBECONFIG": "/k",  # read when connecting, as kubectl reads it: not a flag twin
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
        None,
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


def test_pod_uid_names_the_sockets_per_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_UID", "0f5e2a64-7c1b-4d39-9a43-1c2b3d4e5f60")
    monkeypatch.setenv("DRIVER_ROOT_MOUNT", "/driver-root")
    s = parse(["--node-name", "n1", "--kubelet-registry-dir", "/r", "--kubelet-plugins-dir", "/p"])
    assert s.pod_uid == "0f5e2a64-7c1b-4d39-9a43-1c2b3d4e5f60"
    assert s.driver_root_mount == Path("/driver-root")
    assert s.registration_socket == Path(
        "/r/gpu.nvidia.com-0f5e2a64-7c1b-4d39-9a43-1c2b3d4e5f60-reg.sock"
    )
    assert s.dra_socket == Path("/p/gpu.nvidia.com/dra-0f5e2a64-7c1b-4d39-9a43-1c2b3d4e5f60.sock")
    assert s.lock_dir == Path("/p/gpu.nvidia.com/locks")


UID_A, UID_B = "0f5e2a64-7c1b-4d39-9a43-1c2b3d4e5f60", "0f5e2a64-7c1b-4d39-9a43-1c2b3d4e5f61"


def test_too_long_socket_paths_fall_back_to_a_short_hash() -> None:
    deep = "/var/lib/kubelet/" + "x" * 40
    a = parse(["--node-name", "n1", "--kubelet-registry-dir", deep, "--pod-uid", UID_A])
    b = parse(["--node-name", "n1", "--kubelet-registry-dir", deep, "--pod-uid", UID_B])
    name = a.registration_socket.name
    assert a.registration_socket.parent == Path(deep) and len(name) == len(
        "0123456789abcdef-reg.sock"
    )
    assert name != b.registration_socket.name  # still one per instance
    assert len(str(a.registration_socket).encode()) <= 107
    s = parse(["--node-name", "n1", "--kubelet-plugins-dir", deep, "--pod-uid", UID_A])
    assert s.dra_socket.name.startswith("dra-") and len(str(s.dra_socket).encode()) <= 107
    assert (
        s.dra_socket
        != parse(
            ["--node-name", "n1", "--kubelet-plugins-dir", deep, "--pod-uid", UID_B]
        ).dra_socket
    )


def test_bad_pod_uid_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        cli.main(["kubelet-plugin", "--node-name", "n1", "--fake", "dgx-h100", "--pod-uid", "a/b"])
        == 2
    )
    assert "--pod-uid 'a/b': not a pod UID" in capsys.readouterr().err


def test_node_label_flags_and_their_twins(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for env in ("NODE_LABELS", "NODE_LABELS_RESYNC"):
        monkeypatch.delenv(env, raising=False)
    s = parse(["--node-name", "n1"])
    assert (s.node_labels, s.node_labels_resync_s) == (True, 60.0)  # on by default
    assert parse(["--node-name", "n1", "--node-labels=false"]).node_labels is False
    assert parse(["--node-name", "n1", "--node-labels"]).node_labels is True
    monkeypatch.setenv("NODE_LABELS", "false")
    monkeypatch.setenv("NODE_LABELS_RESYNC", "2.5")
    s = parse(["--node-name", "n1"])
    assert (s.node_labels, s.node_labels_resync_s) == (False, 2.5)
    assert parse(["--node-name", "n1", "--node-labels=true"]).node_labels is True
    for bad, needle in (
        (["--node-labels=maybe"], "'maybe' is not true or false"),
        (["--node-labels-resync", "0"], "'0' must be more than 0 seconds"),
    ):
        with pytest.raises(SystemExit) as exited:
            parse(["--node-name", "n1", *bad])
        assert exited.value.code == 2
        assert needle in capsys.readouterr().err


def test_gpu_sets_flag_and_env_twin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPU_SETS", raising=False)
    assert parse(["--node-name", "n1"]).gpu_sets is True
    assert parse(["--node-name", "n1", "--gpu-sets=false"]).gpu_sets is False
    monkeypatch.setenv("GPU_SETS", "false")
    assert parse(["--node-name", "n1"]).gpu_sets is False
    assert parse(["--node-name", "n1", "--gpu-sets"]).gpu_sets is True


def test_context_and_namespace_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    """kubectl's spellings: ``--context`` reaches the client; ``-n`` is the pod namespace."""
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    s = parse(["--node-name", "n1", "--context", "staging", "-n", "gpu-system"])
    assert (s.kube_context, s.pod_namespace) == ("staging", "gpu-system")
    assert parse(["--node-name", "n1", "--namespace", "x"]).pod_namespace == "x"
