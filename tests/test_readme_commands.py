"""The README's shell blocks are runnable as written from a clone's root: every command names an
entry point that exists there (a Makefile target, a script of the repository, a console script
of ``.venv/bin``, a ``dra-driver`` subcommand, or an outside tool the text says to install), and
every ``dra-driver`` command that needs neither a cluster, a GPU nor a file of the user's runs
and exits 0 exactly as written (a bare ``dra-driver claim --gpus 4`` was exit 127 in a clone)."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from dra_driver import cli

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
BLOCK = re.compile(r"^```sh\n(.*?)^```", re.S | re.M)
# Tools a user installs as the README says (Docker, kind, kubectl, Helm) and shell built-ins.
OUTSIDE = {"docker", "podman", "kind", "kubectl", "helm", "export", "cd", ".", "git"}
# The venv's scripts: these tests run inside it (make test uses .venv), wherever it lives.
VENV_BIN = Path(sys.executable).parent


def commands(text: str) -> list[list[str]]:
    """Each simple command of each ``sh`` block, as words, without comments or env prefixes."""
    found = []
    for block in BLOCK.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            command: list[str] = []
            for word in [*words, "|"]:
                if word in {"|", "&&", ";", "||"}:
                    while command and re.fullmatch(r"[A-Za-z_]\w*=\S*", command[0]):
                        command.pop(0)  # E2E_KUBECONFIG=... e2e/run.sh
                    if command:
                        found.append(command)
                    command = []
                else:
                    command.append(word)
    return found


def make_targets() -> set[str]:
    done = subprocess.run(
        ["make", "--no-print-directory", "-C", str(REPO), "help"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return {line.split()[1] for line in done.stdout.splitlines() if line.startswith("make ")}


def problem(words: list[str], targets: set[str]) -> str | None:
    """Why the command is not runnable as written from the repository's root; None if it is."""
    head = words[0]
    if head == "make":
        unknown = [w for w in words[1:] if "=" not in w and w not in targets]
        return f"no make target {unknown}" if unknown else None
    if head.startswith(".venv/bin/"):
        name = head.removeprefix(".venv/bin/")
        if not (VENV_BIN / name).exists():
            return f"{head}: no such console script in the venv"
        if name == "dra-driver" and words[1] not in cli.SUMMARIES:
            return f"dra-driver has no subcommand {words[1]!r}"
        if name == "python" and words[1] == "-m":
            found = importlib.util.find_spec(words[2]) is not None
            return None if found else f"{words[2]}: no such module"
        if name == "python" and not (REPO / words[1]).is_file():
            return f"{words[1]}: no such script"
        return None
    if "/" in head:
        path = REPO / head
        return None if path.is_file() and os.access(path, os.X_OK) else f"{head}: not executable"
    if head in OUTSIDE:
        return None
    return f"{head!r} is not on the PATH of a clone (write .venv/bin/{head}?)"


def test_every_readme_command_names_an_entry_point_that_exists() -> None:
    targets = make_targets()
    found = commands(README.read_text(encoding="utf-8"))
    assert len(found) > 20  # the blocks were read
    wrong = [f"{shlex.join(w)}: {why}" for w in found if (why := problem(w, targets))]
    assert wrong == []


def test_the_check_catches_a_bare_dra_driver_and_an_unknown_target() -> None:
    text = (
        "```sh\ndra-driver claim --gpus 4  # x\nmake nope\n.venv/bin/dra-driver nope\n"
        ".venv/bin/python -m dra_driver.nope\n```\n"
    )
    targets = make_targets()
    assert [problem(w, targets) for w in commands(text)] == [
        "'dra-driver' is not on the PATH of a clone (write .venv/bin/dra-driver?)",
        "no make target ['nope']",
        "dra-driver has no subcommand 'nope'",
        "dra_driver.nope: no such module",
    ]


def _local(words: list[str]) -> bool:
    """A dra-driver command a clone runs alone: no cluster, no GPU, no file of the user's."""
    if words[0] != ".venv/bin/dra-driver" or words[1] not in {
        "discover",
        "slices",
        "claim",
        "labels",
        "simulate",
    }:
        return False
    if "--kubeconfig" in words or (words[1] in {"discover", "labels"} and "--fake" not in words):
        return False
    files = [w for w in words if re.search(r"\.(ya?ml|json)$", w)]
    return all((REPO / f).is_file() for f in files)


LOCAL = [w for w in commands(README.read_text(encoding="utf-8")) if _local(w)]


def test_some_readme_commands_are_run() -> None:
    assert len(LOCAL) >= 6


@pytest.mark.parametrize("words", LOCAL, ids=[shlex.join(w[1:]) for w in LOCAL])
def test_a_local_readme_command_runs_as_written(words: list[str]) -> None:
    argv = [str(VENV_BIN / "dra-driver"), *words[1:]]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip()
