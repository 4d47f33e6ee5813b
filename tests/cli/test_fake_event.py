"""``dra-driver fake-event``: flags, the socket it picks, and the agent's refusals are clear.

(Against running agents: tests/kubelet/test_health_agent.py for the DRA kubelet plugin,
tests/cli/test_device_plugin.py for the device plugin.)"""

from __future__ import annotations

import argparse
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from dra_driver import logs, metrics, nodehealth
from dra_driver.cli import agentflags, fake_event
from dra_driver.devices import fake, health, healthpolicy

RunCli = Callable[..., subprocess.CompletedProcess[str]]  # the run_cli fixture (conftest)


def test_no_agent_is_a_clear_error(tmp_path: Path, run_cli: RunCli) -> None:
    done = run_cli("fake-event", "--gpu", "0", "--lost", "--kubelet-plugins-dir", str(tmp_path))
    assert done.returncode == 1
    assert f"no node agent health socket at {tmp_path}/gpu.nvidia.com/health.sock" in done.stderr


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gpu", "0", "--lost", "--action", "gpu-reset"], "--action goes with --xid"),
        (["--gpu", "0", "--lost", "--mig", "1:0"], "--mig goes with --xid or --ecc-dbe"),
        (["--gpu", "0", "--xid", "79", "--mig", "one"], "--mig 'one': expected GI:CI"),
    ],
)
def test_bad_flags_exit_2(argv: list[str], message: str, run_cli: RunCli) -> None:
    done = run_cli("fake-event", *argv)
    assert done.returncode == 2 and message in done.stderr


def test_request_and_socket_from_flags(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    fake_event.register(sub)
    args = parser.parse_args(
        ["fake-event", "--gpu", "2", "--xid", "94", "--mig", "1:0", "--action", "gpu-reset"]
    )
    assert fake_event.request_from(args) == {
        "op": "inject",
        "gpu": 2,
        "event": "xid",
        "xid": 94,
        "action": "gpu-reset",
        "gpuInstance": 1,
        "computeInstance": 0,
    }
    args = parser.parse_args(
        ["fake-event", "--gpu", "0", "--remap-failure", "--kubelet-plugins-dir", str(tmp_path)]
    )
    assert fake_event.request_from(args)["event"] == "remap-failure"
    (tmp_path / "gpu.nvidia.com").mkdir()
    for name in ("health.sock", "health-0123456789abcdef.sock"):
        (tmp_path / "gpu.nvidia.com" / name).touch()
    assert [p.name for p in agentflags.sockets(args)] == [
        "health-0123456789abcdef.sock",
        "health.sock",
    ]


def node_health(real: bool) -> nodehealth.NodeHealth:
    backend = fake.FakeBackend.from_name("pcie-l4")
    devices = backend.discover()
    api = backend.nvml_api
    node = nodehealth.start(
        policy=healthpolicy.HealthPolicy(),
        nvml_api=api,
        devices=devices,
        published={g.uuid for g in devices.gpus},
        board=health.HealthBoard(),
        log=logs.get("test"),
        metrics=metrics.new(),
        socket=None,
    )
    if real:
        node.fake = None  # as with real NVML
    return node


@pytest.mark.parametrize(
    ("request_", "error"),
    [
        (
            {"op": "inject", "gpu": 9, "event": "lost"},
            "no GPU 9 on this fake node (GPUs: 0, 1, 2, 3)",
        ),
        ({"op": "inject", "gpu": 0, "event": "melt"}, "unknown event 'melt'"),
        ({"op": "inject", "gpu": 0, "event": "xid"}, "xid None: a positive XID number"),
        ({"op": "inject", "gpu": 0, "event": "xid", "xid": 1, "action": "x"}, "action 'x'"),
        ({"op": "inject", "gpu": 0, "event": "xid", "xid": 8, "gpuInstance": 1}, "give both"),
        ({"op": "nope"}, "unknown op 'nope'"),
    ],
)
def test_bad_requests_are_refused_with_the_reason(request_: dict[str, object], error: str) -> None:
    node = node_health(real=False)
    try:
        answer = node.handle(request_)
        assert answer["ok"] is False and error in answer["error"]
    finally:
        node.stop()


def test_real_gpus_refuse_fake_events_but_report_status() -> None:
    node = node_health(real=True)
    try:
        answer = node.handle({"op": "inject", "gpu": 0, "event": "lost"})
        assert answer == {
            "ok": False,
            "error": "this node agent watches real GPUs: fake events are refused",
        }
        status = node.handle({"op": "status"})
        assert status["ok"] and not status["fake"]
        assert [d["health"] for d in status["devices"]] == ["Healthy"] * 4
    finally:
        node.stop()


@pytest.mark.parametrize(
    ("argv", "request_"),
    [
        (["--driver-unload"], {"action": "driver-unload", "mode": "not-loaded"}),
        (["--driver-unload", "mismatch"], {"action": "driver-unload", "mode": "mismatch"}),
        (["--driver-load"], {"action": "driver-load"}),
        (
            ["--driver-load", "--driver-version", "590.1.2"],
            {"action": "driver-load", "driverVersion": "590.1.2"},
        ),
        (["--gpu-remove", "3"], {"action": "gpu-remove", "gpu": 3}),
        (["--gpu-add"], {"action": "gpu-add"}),
        (["--gpu-add", "2"], {"action": "gpu-add", "like": 2}),
        (["--mig-destroy", "1:4"], {"action": "mig-destroy", "gpu": 1, "gpuInstance": 4}),
    ],
)
def test_lifecycle_requests_from_flags(argv: list[str], request_: dict[str, object]) -> None:
    parser = argparse.ArgumentParser()
    fake_event.register(parser.add_subparsers())
    args = parser.parse_args(["fake-event", *argv])
    assert fake_event.request_from(args) == {"op": "lifecycle", **request_}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gpu", "0", "--driver-unload"], "--gpu goes with the GPU health events"),
        (["--xid", "79"], "--gpu is required for a GPU health event"),
        (["--gpu", "0", "--lost", "--driver-version", "1.2"], "--driver-version goes with"),
        (["--gpu-add", "--driver-version", "1.2"], "--driver-version goes with --driver-load"),
        (["--mig-destroy", "one"], "--mig-destroy 'one': expected N:GI"),
        (["--driver-unload", "sideways"], "invalid choice"),
    ],
)
def test_bad_lifecycle_flags_exit_2(argv: list[str], message: str, run_cli: RunCli) -> None:
    done = run_cli("fake-event", *argv)
    assert done.returncode == 2 and message in done.stderr, done.stderr


def test_the_lifecycle_op_is_refused_on_real_gpus_and_for_bad_requests() -> None:
    from dra_driver import lifecycleparts

    board = health.HealthBoard()
    real = nodehealth.start(
        policy=healthpolicy.HealthPolicy(enabled=False),
        nvml_api=None,
        devices=fake.FakeBackend.from_name("pcie-l4").discover(),
        published=set(),
        board=board,
        log=logs.get("test"),
        metrics=metrics.new(),
        socket=None,
    )
    handle = lifecycleparts.fake_lifecycle(real, logs.get("test"))
    assert "real GPUs" in handle({"action": "driver-unload"})["error"]
    backend = fake.FakeBackend.from_name("pcie-l4")
    real.fake = backend.nvml
    assert "unknown lifecycle action" in handle({"action": "explode"})["error"]
    assert "unknown outage mode" in handle({"action": "driver-unload", "mode": "x"})["error"]
    assert "no GPU with index 9" in handle({"action": "gpu-remove", "gpu": 9})["error"]
    assert handle({"action": "driver-unload"})["ok"] and not backend.nvml.driver_loaded
