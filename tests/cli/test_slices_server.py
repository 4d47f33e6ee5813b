"""``dra-driver slices --kubeconfig``: the slices the agent would publish to that API server,
asked which gated fields it keeps (the fake API server over loopback HTTP, gates off)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.testing.fakeapi import fakeserver

RunCli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    started: list[fakeserver.FakeApiServer] = []

    def start(**kwargs: Any) -> Path:
        server = fakeserver.FakeApiServer(token="t0ken", **kwargs).start()
        started.append(server)
        return server.write_kubeconfig(tmp_path / f"kubeconfig-{len(started)}")

    yield start
    for server in started:
        server.stop()


def slices(run_cli: RunCli, *args: str) -> tuple[int, list[dict[str, Any]], str]:
    proc = run_cli("slices", "--node-name", "n1", "-o", "json", *args)
    items = json.loads(proc.stdout)["items"] if proc.returncode == 0 else []
    return proc.returncode, items, proc.stderr


def test_a_server_that_keeps_everything_gets_what_the_agent_always_publishes(
    run_cli: RunCli, serve: Any
) -> None:
    code, items, err = slices(run_cli, "--fake", "dgx-h100", "--kubeconfig", str(serve()))
    assert code == 0, err
    assert "drops the fields of none" in err
    assert [len(s["spec"]["devices"]) for s in items] == [8]
    assert "setRanks" in items[0]["spec"]["devices"][0]["attributes"]


def test_explicit_dynamic_mig_on_a_server_without_counters_is_refused(
    run_cli: RunCli, serve: Any
) -> None:
    kubeconfig = serve(disabled_gates=frozenset({"DRAPartitionableDevices"}))
    args = ("--fake", "h100-mig", "--dynamic-mig", "all", "--kubeconfig", str(kubeconfig))
    code, items, err = slices(run_cli, *args)
    assert code == 2 and items == []
    assert "drops the fields of sharedCounters" in err
    (error,) = [line for line in err.splitlines() if line.startswith("dra-driver: error:")]
    assert "DRAPartitionableDevices is off" in error and "--dynamic-mig none" in error
    # The same node without dynamic MIG prints plain slices.
    code, items, err = slices(run_cli, "--fake", "h100-mig", "--kubeconfig", str(kubeconfig))
    assert code == 0, err
    assert not any(s["spec"].get("sharedCounters") for s in items)


def test_shares_on_a_server_without_consumable_capacity_are_refused(
    run_cli: RunCli, serve: Any
) -> None:
    kubeconfig = serve(disabled_gates=frozenset({"DRAConsumableCapacity"}))
    args = ("--fake", "dgx-h100", "--shareable", "all", "--kubeconfig", str(kubeconfig))
    code, _, err = slices(run_cli, *args)
    assert code == 2 and "DRAConsumableCapacity is off" in err


def test_a_server_that_cannot_be_reached_is_one_error_line(run_cli: RunCli, tmp_path: Path) -> None:
    server = fakeserver.FakeApiServer(token="t0ken").start()
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
    server.stop()
    code, items, err = slices(run_cli, "--fake", "dgx-h100", "--kubeconfig", str(kubeconfig))
    assert code == 2 and items == []
    assert len(err.strip().splitlines()) == 1 and "cannot reach the API server" in err


def _strip_names(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**s, "metadata": {}} for s in items]


def test_auto_shares_on_a_server_without_consumable_capacity_are_full_gpus(
    run_cli: RunCli, serve: Any
) -> None:
    kubeconfig = str(serve(disabled_gates=frozenset({"DRAConsumableCapacity"})))
    code, items, err = slices(
        run_cli, "--fake", "dgx-h100", "--shareable", "auto:all", "--kubeconfig", kubeconfig
    )
    assert code == 0, err
    devices = [d for s in items for d in s["spec"]["devices"]]
    assert len(devices) == 8
    assert not any(d.get("allowMultipleAllocations") for d in devices)
    notes = [line for line in err.splitlines() if "--shareable auto:all" in line]
    assert notes == [
        "dra-driver: --shareable auto:all: GPU shares are off, its GPUs are published as full GPUs"
    ]
    # The explicit form keeps being refused, naming the auto: way out.
    code, _, err = slices(
        run_cli, "--fake", "dgx-h100", "--shareable", "all", "--kubeconfig", kubeconfig
    )
    assert code == 2 and "DRAConsumableCapacity is off" in err and "auto:all" in err


def test_auto_dynamic_mig_on_a_server_without_counters_is_static(
    run_cli: RunCli, serve: Any
) -> None:
    kubeconfig = str(serve(disabled_gates=frozenset({"DRAPartitionableDevices"})))
    args = ("--fake", "h100-mig", "--kubeconfig", kubeconfig)
    code, items, err = slices(run_cli, *args, "--dynamic-mig", "auto:all")
    assert code == 0, err
    assert not any(s["spec"].get("sharedCounters") for s in items)
    assert not any(d.get("consumesCounters") for s in items for d in s["spec"].get("devices", ()))
    assert "--dynamic-mig auto:all: dynamic MIG is off" in err
    code, plain, err = slices(run_cli, *args)  # as without --dynamic-mig
    assert code == 0, err
    assert _strip_names(items) == _strip_names(plain)
    code, _, err = slices(run_cli, *args, "--dynamic-mig", "all")
    assert code == 2 and "DRAPartitionableDevices is off" in err


@pytest.mark.parametrize(
    ("flag", "profile", "field"),
    [
        ("--shareable", "dgx-h100", "allowMultipleAllocations"),
        ("--dynamic-mig", "h100-mig", "consumesCounters"),
    ],
)
def test_auto_on_a_server_that_keeps_everything_is_the_explicit_form(
    run_cli: RunCli, serve: Any, flag: str, profile: str, field: str
) -> None:
    args = ("--fake", profile, "--kubeconfig", str(serve()))
    code, auto, err = slices(run_cli, *args, flag, "auto:all")
    assert code == 0, err
    code, explicit, err = slices(run_cli, *args, flag, "all")
    assert code == 0, err
    assert auto == explicit
    assert any(d.get(field) for s in auto for d in s["spec"].get("devices", ()))
