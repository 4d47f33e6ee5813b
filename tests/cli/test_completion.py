"""``dra-driver completion``: the script names every subcommand, parses, and completes in bash."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dra_driver import cli


@pytest.fixture(scope="module")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("completion")
    out = {}
    for shell in ("bash", "zsh"):
        proc = subprocess.run(
            [sys.executable, "-m", "dra_driver", "completion", shell],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        out[shell] = root / f"dra-driver.{shell}"
        out[shell].write_text(proc.stdout)
    return out


def complete(script: Path, *words: str) -> list[str]:
    """What bash offers for ``dra-driver WORDS`` (the last word being completed)."""
    quoted = " ".join(f"'{w}'" for w in ("dra-driver", *words))
    code = (
        f"source {script}; COMP_WORDS=({quoted}); COMP_CWORD={len(words)}; "
        '_dra_driver; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    proc = subprocess.run(
        ["bash", "--norc", "-c", code], capture_output=True, text=True, timeout=30, check=True
    )
    return proc.stdout.split()


def test_the_script_names_every_subcommand_and_parses(scripts: dict[str, Path]) -> None:
    for shell, script in scripts.items():
        text = script.read_text()
        for name in cli.SUMMARIES:
            assert name in text, (shell, name)
    subprocess.run(["bash", "-n", str(scripts["bash"])], check=True, timeout=30)
    if shutil.which("zsh"):
        subprocess.run(["zsh", "-n", str(scripts["zsh"])], check=True, timeout=30)


def test_bash_completes_subcommands_flags_choices_and_files(
    scripts: dict[str, Path], tmp_path: Path
) -> None:
    bash = scripts["bash"]
    assert sorted(complete(bash, "")) == sorted(
        ["-h", "--help", "--version", "--log-level", "--log-format", *cli.SUMMARIES]
    )
    assert complete(bash, "sim") == ["simulate"]
    assert complete(bash, "--log-level", "debug", "ca") == ["capacity"]
    assert sorted(complete(bash, "capacity", "--s")) == ["--sizes", "--slices"]
    assert complete(bash, "discover", "--output", "") == ["table", "json", "yaml"]
    assert complete(bash, "--log-format", "") == ["auto", "json", "console"]
    (tmp_path / "fleet-slices.json").write_text("{}")
    assert complete(bash, "capacity", "--slices", str(tmp_path / "fleet-")) == [
        str(tmp_path / "fleet-slices.json")
    ]
