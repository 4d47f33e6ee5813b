"""Every subcommand that takes ``--kubeconfig``, given a malformed one, as a process: one line
on stderr naming the file and the reason, exit 2 (``dra-driver --help``: "cannot run")."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

RunCli = Callable[..., subprocess.CompletedProcess[str]]  # the run_cli fixture (conftest)

SUBCOMMANDS = {
    "doctor": [],
    "slices": ["--node-name", "n1", "--fake", "dgx-h100"],
    "publish": ["--node-name", "n1", "--fake", "dgx-h100"],
    "controller": ["--namespace", "ns"],
    "kubelet-plugin": ["--node-name", "n1", "--fake", "dgx-h100", "--metrics-port", "0"],
    "device-plugin": ["--node-name", "n1", "--fake", "dgx-h100", "--metrics-port", "0"],
}


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_a_malformed_kubeconfig_is_one_line_and_exit_2(
    command: str, run_cli: RunCli, tmp_path: Path
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("this: is: not: [valid\n")
    # The device plugin first needs the kubelet's plugin directory (it creates none on the host).
    where = ["--device-plugin-dir", str(tmp_path)] if command == "device-plugin" else []
    proc = run_cli(command, *SUBCOMMANDS[command], *where, "--kubeconfig", str(kubeconfig))
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("dra-driver: error: ")
    assert lines[0].endswith(
        f"cannot load kubeconfig {kubeconfig}: not valid YAML at line 1, column 9: "
        "mapping values are not allowed here"
    )


def test_the_help_documents_exit_2_for_cannot_run(run_cli: RunCli) -> None:
    proc = run_cli("--help")
    assert proc.returncode == 0
    assert "Exit code 2 with one line on stderr: the command cannot run" in " ".join(
        proc.stdout.split()
    )
