"""The CLI entry point: every subcommand listed, and only the chosen one imported."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dra_driver import cli


def test_help_lists_every_subcommand() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "dra_driver", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    for name, summary in cli.SUMMARIES.items():
        assert name in proc.stdout
        assert summary.split()[0] in proc.stdout


def test_node_agent_does_not_import_the_local_tools() -> None:
    """The agents' memory must not carry the demo, the simulator or the in-memory API server."""
    code = (
        "import sys\n"
        "from dra_driver import cli\n"
        "cli.build_parser(['--log-level', 'info', 'kubelet-plugin', '--node-name', 'demo'])\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    loaded = set(proc.stdout.split())
    assert "dra_driver.cli.kubelet_plugin" in loaded
    for heavy in (
        "dra_driver.demo",
        "dra_driver.allocation.simulator",
        "dra_driver.testing.fakeapi.memory",
        "dra_driver.cli.demo",
        "dra_driver.cli.device_plugin",
    ):
        assert heavy not in loaded, heavy


@pytest.mark.parametrize("name", list(cli.SUMMARIES))
def test_every_subcommand_parses_its_own_help(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # In this process (each subcommand's module imported as `dra-driver NAME` imports it); a
    # fresh interpreter per subcommand cost 45 s of the suite, and the other CLI tests run
    # `python -m dra_driver ...` processes anyway.
    with pytest.raises(SystemExit) as info:
        cli.main([name, "--help"])
    assert info.value.code == 0
    assert f"dra-driver {name}" in capsys.readouterr().out
