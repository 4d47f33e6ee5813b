"""``dra-driver doctor`` as a process against the fake API server over loopback HTTP, in each
emulated setting of the DRA feature gates, and against a server that is not there."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.cli import doctor
from dra_driver.testing.fakeapi import fakeserver

RunCli = Callable[..., subprocess.CompletedProcess[str]]  # the run_cli fixture (conftest)

TAINTS_KEPT = (
    "device taints: kept — DRADeviceTaints enabled: an unhealthy GPU is tainted in its slice, "
    "so no new claim gets it"
)
TAINTS_DROPPED = (
    "device taints: dropped — DRADeviceTaints disabled: an unhealthy GPU cannot be tainted; "
    "the agent withdraws it from its slice instead"
)
COUNTERS_KEPT = (
    "shared counters: kept — DRAPartitionableDevices enabled: dynamic MIG (--dynamic-mig) can "
    "be published"
)
COUNTERS_DROPPED = (
    "shared counters: dropped — DRAPartitionableDevices disabled: dynamic MIG (--dynamic-mig) "
    "cannot be published"
)
CAPACITY_KEPT = (
    "consumable capacity: kept — DRAConsumableCapacity enabled: GPU shares (--shareable) can be "
    "published"
)
CAPACITY_DROPPED = (
    "consumable capacity: dropped — DRAConsumableCapacity disabled: GPU shares (--shareable) "
    "cannot be published"
)
SET_RANKS = "set ranks: plain attributes, always kept: dra-driver claim gets topology-optimal GPUs"
ALL_RBAC = [
    "RBAC of these credentials: all the agent needs",
    "  resourceslices: list, watch, create, update, delete allowed",
    "  resourceclaims: get allowed",
    "  nodes: get, patch allowed",
]


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    """``serve(**FakeApiServer kwargs)`` → (server, kubeconfig path); stopped afterwards."""
    started: list[fakeserver.FakeApiServer] = []

    def start(**kwargs: Any) -> tuple[fakeserver.FakeApiServer, Path]:
        server = fakeserver.FakeApiServer(token="t0ken", **kwargs).start()
        started.append(server)
        return server, server.write_kubeconfig(tmp_path / f"kubeconfig-{len(started)}")

    yield start
    for server in started:
        server.stop()


@pytest.mark.parametrize(
    ("off", "lines"),
    [
        ((), [TAINTS_KEPT, COUNTERS_KEPT, CAPACITY_KEPT]),
        (("DRADeviceTaints",), [TAINTS_DROPPED, COUNTERS_KEPT, CAPACITY_KEPT]),
        (("DRAPartitionableDevices",), [TAINTS_KEPT, COUNTERS_DROPPED, CAPACITY_KEPT]),
        (("DRAConsumableCapacity",), [TAINTS_KEPT, COUNTERS_KEPT, CAPACITY_DROPPED]),
    ],
    ids=[
        "all-on",
        "DRADeviceTaints-off",
        "DRAPartitionableDevices-off",
        "DRAConsumableCapacity-off",
    ],
)
def test_doctor_prints_what_the_server_keeps(
    run_cli: RunCli, serve: Any, off: tuple[str, ...], lines: list[str]
) -> None:
    server, kubeconfig = serve(disabled_gates=off)
    proc = run_cli("doctor", "--kubeconfig", str(kubeconfig), "--node-name", "n1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert proc.stdout.splitlines() == [
        f"API server: {server.url}",
        "server version: v1.36.2",
        "resource.k8s.io: v1 served (served: v1; preferred v1)",
        "probe: dry-run create of 2 ResourceSlices (node n1, driver gpu.nvidia.com); "
        "nothing stored",
        *lines,
        SET_RANKS,
        "binding conditions: not published by this driver (DRADeviceBindingConditions not needed)",
        *ALL_RBAC,
    ]
    assert server.api.all_resource_slices() == []


def test_doctor_flags_from_the_environment_and_missing_permissions(
    run_cli: RunCli, serve: Any
) -> None:
    server, kubeconfig = serve(denied={("patch", "nodes"), ("delete", "resourceslices")})
    proc = run_cli(
        "doctor",
        env={"KUBECONFIG": str(kubeconfig), "NODE_NAME": "gpu-7", "DRIVER_NAME": "d.example.com"},
    )
    assert proc.returncode == 0, proc.stderr  # the doctor's credentials need not be the agent's
    out = proc.stdout.splitlines()
    assert "(node gpu-7, driver d.example.com)" in out[3]
    assert out[-4:] == [
        "RBAC of these credentials: NOT all the agent needs",
        "  resourceslices: list, watch, create, update allowed; delete DENIED",
        "  resourceclaims: get allowed",
        "  nodes: get allowed; patch DENIED",
    ]
    assert server.api.all_resource_slices() == []


def test_doctor_without_access_reviews_says_rbac_is_unknown(run_cli: RunCli, serve: Any) -> None:
    _, kubeconfig = serve(access_reviews=False)
    proc = run_cli("doctor", "--kubeconfig", str(kubeconfig))
    assert proc.returncode == 0, proc.stderr
    last = proc.stdout.splitlines()[-1]
    assert last.startswith("RBAC: unknown (server did not answer: HTTP 404")
    assert f"(node {doctor.PROBE_NODE}, driver gpu.nvidia.com)" in proc.stdout


def test_doctor_exits_1_when_resource_k8s_io_v1_is_not_served(run_cli: RunCli, serve: Any) -> None:
    _, kubeconfig = serve(served_versions=("v1beta2", "v1beta1"))
    proc = run_cli("doctor", "--kubeconfig", str(kubeconfig))
    assert proc.returncode == 1
    out = proc.stdout.splitlines()
    assert out[2] == (
        "resource.k8s.io: v1 NOT served (served: v1beta2, v1beta1) — the driver needs "
        "resource.k8s.io/v1 (Kubernetes >= 1.34): it cannot work here"
    )
    assert out[3] == "probe: not run — resource.k8s.io/v1 not served"
    assert "device taints: unknown — DRADeviceTaints not probed" in out
    _, kubeconfig = serve(served_versions=())
    proc = run_cli("doctor", "--kubeconfig", str(kubeconfig))
    assert proc.returncode == 1
    assert proc.stdout.splitlines()[2].startswith("resource.k8s.io: not served — ")


def test_doctor_against_an_unreachable_server_exits_2_with_one_line(
    run_cli: RunCli, tmp_path: Path
) -> None:
    with socket.socket() as sock:  # a loopback port that is closed once this block ends
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    kubeconfig = fakeserver.write_kubeconfig(tmp_path / "kubeconfig", url)
    proc = run_cli("doctor", "--kubeconfig", str(kubeconfig))
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"dra-driver: error: cannot reach the API server {url}: ")
    assert "Connection refused" in lines[0]


def test_doctor_with_no_configuration_exits_2_with_one_line(
    run_cli: RunCli, tmp_path: Path
) -> None:
    proc = run_cli("doctor", "--kubeconfig", str(tmp_path / "absent"))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"dra-driver: error: kubeconfig {tmp_path / 'absent'} does not exist"
    ]


def test_doctor_with_a_driver_name_no_slice_can_carry_exits_2(run_cli: RunCli, serve: Any) -> None:
    _, kubeconfig = serve()
    proc = run_cli("doctor", "--kubeconfig", str(kubeconfig), "--driver-name", "Not_A_Domain")
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("dra-driver: error: --node-name/--driver-name:")
    assert "spec.driver" in lines[0]


def test_doctor_against_a_web_server_that_is_not_kubernetes_exits_2_with_one_line(
    run_cli: RunCli, tmp_path: Path
) -> None:
    import http.server
    import threading

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"<html>\n<head>\n<title>Welcome to nginx!</title>\n</head>\n<body>\n</body>\n"
            self.send_response(404)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=web.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{web.server_address[1]}"
        kubeconfig = fakeserver.write_kubeconfig(tmp_path / "kubeconfig", url)
        proc = run_cli("doctor", "--kubeconfig", str(kubeconfig))
    finally:
        web.shutdown()
        web.server_close()
        thread.join(timeout=10)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"dra-driver: error: the API server {url} refused GET /version: HTTP 404: "
        "not a Kubernetes API server: the reply is an HTML page titled 'Welcome to nginx!'"
    ]
