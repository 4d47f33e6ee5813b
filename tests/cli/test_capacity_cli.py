"""``dra-driver capacity`` as a process: the text answer, and bad input as one clear line on
stderr with exit code 2 (an unreachable server, malformed files, sizes that are not sizes)."""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from dra_driver import cli
from dra_driver.testing import fakefleet
from dra_driver.testing.fakeapi import fakeserver

RunCli = Callable[..., subprocess.CompletedProcess[str]]  # the run_cli fixture (conftest)


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    fleet = fakefleet.make(6, seed=2, profiles=("dgx-h100", "pcie-l4"))
    slices, claims = tmp_path / "slices.json", tmp_path / "claims.json"
    slices.write_text(json.dumps({"kind": "List", "items": fleet.slices}))
    claims.write_text(json.dumps({"kind": "List", "items": fleet.claims}))
    return slices, claims


def test_the_text_answer_names_sizes_nodes_and_stranded_gpus(
    run_cli: RunCli, files: tuple[Path, Path]
) -> None:
    slices, claims = files
    done = run_cli("capacity", "--slices", str(slices), "--allocated", str(claims), "--by-node")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("6 nodes, 36 GPUs: ")
    table = {ln.split()[0]: ln.split()[1:] for ln in lines[3:7]}
    assert list(table) == ["1", "2", "4", "8"]
    json_done = run_cli(
        "capacity", "--slices", str(slices), "--allocated", str(claims), "-o", "json"
    )
    sizes = json.loads(json_done.stdout)["sizes"]
    assert table == {
        s: [str(v["fit"]), str(v["optimal"]), str(v["nodes"])] for s, v in sizes.items()
    }
    assert any(ln.startswith("nodes that fit 8 GPUs: ") for ln in lines)
    assert any(ln.startswith("stranded GPUs (free, in no set of 2, 4 or 8 GPUs): ") for ln in lines)
    assert any(ln.startswith("node-5     4 ") for ln in lines)  # --by-node: a row per node


@dataclasses.dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def in_process(capsys: pytest.CaptureFixture[str]) -> Callable[..., Done]:
    """``dra-driver`` in this process (the cases below differ only in their input)."""

    def run(*argv: str) -> Done:
        code = cli.main(list(argv))
        out, err = capsys.readouterr()
        return Done(code, out, err)

    return run


def _one_error_line(done: Done | subprocess.CompletedProcess[str], *needles: str) -> None:
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dra-driver: error: "), lines
    for needle in needles:
        assert needle in lines[0]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_an_unreachable_server_is_one_line(run_cli: RunCli, tmp_path: Path) -> None:
    kubeconfig = fakeserver.write_kubeconfig(
        tmp_path / "kubeconfig", f"http://127.0.0.1:{_closed_port()}"
    )
    done = run_cli("capacity", "--kubeconfig", str(kubeconfig))
    _one_error_line(done, "cannot list ResourceSlices and ResourceClaims", "unreachable")


def test_a_missing_kubeconfig_is_one_line(in_process: Callable[..., Done], tmp_path: Path) -> None:
    done = in_process("capacity", "--kubeconfig", str(tmp_path / "nope"))
    _one_error_line(done, "does not exist")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("{not: [valid", "not valid YAML or JSON"),
        ("kind: ConfigMap\nmetadata: {name: x}\n", "has kind 'ConfigMap'"),
        ("kind: Pod\nmetadata: {name: x}\n", "no ResourceSlice in it"),
        (
            "kind: ResourceSlice\nmetadata: {name: s1}\nspec: {driver: gpu.nvidia.com}\n",
            "ResourceSlice s1: spec.pool.name is required",
        ),
        (
            "kind: ResourceSlice\nmetadata: {name: s2}\n"
            "spec: {driver: gpu.nvidia.com, nodeName: n, pool: {name: n, generation: x}}\n",
            "ResourceSlice s2: spec.pool.generation",
        ),
    ],
)
def test_a_malformed_slices_file_is_one_line(
    in_process: Callable[..., Done], tmp_path: Path, text: str, needle: str
) -> None:
    path = tmp_path / "slices.yaml"
    path.write_text(text)
    _one_error_line(in_process("capacity", "--slices", str(path)), needle)


def test_a_missing_file_and_a_malformed_claim_are_one_line(
    in_process: Callable[..., Done], tmp_path: Path, files: tuple[Path, Path]
) -> None:
    slices, _ = files
    _one_error_line(
        in_process("capacity", "--slices", str(tmp_path / "gone.yaml")), "cannot read", "gone.yaml"
    )
    bad = tmp_path / "claims.yaml"
    bad.write_text(
        "kind: ResourceClaim\nmetadata: {name: c1, namespace: team}\n"
        "status: {allocation: {devices: {results: [{driver: gpu.nvidia.com, pool: n}]}}}\n"
    )
    _one_error_line(
        in_process("capacity", "--slices", str(slices), "--allocated", str(bad)),
        "ResourceClaim team/c1: result #1 needs driver, pool and device strings",
    )
    _one_error_line(in_process("capacity", "--allocated", str(bad)), "--allocated needs --slices")


@pytest.mark.parametrize("sizes", ["0", "x", "-2", "3,,4", "2.5", "5000"])
def test_sizes_that_are_not_sizes_are_one_line(
    in_process: Callable[..., Done], files: tuple[Path, Path], sizes: str
) -> None:
    slices, _ = files
    done = in_process("capacity", "--slices", str(slices), f"--sizes={sizes}")
    _one_error_line(done, "size ", "must be a whole number of GPUs, 1 to 1024")
