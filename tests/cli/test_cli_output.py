"""docs/cli-output.md is what the commands print: the keys of each documented JSON document are
exactly the keys the command prints, at every level; and json and yaml print the same document."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver import cli
from dra_driver.testing.fakeapi import fakeserver

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "cli-output.md"
SECTION = re.compile(
    r"^### `dra-driver (?P<cmd>[^`]+)`\n.*?^```json\n(?P<doc>.*?)^```", re.M | re.S
)


def sections() -> list[tuple[str, Any]]:
    return [(m["cmd"], json.loads(m["doc"])) for m in SECTION.finditer(DOC.read_text())]


def shape(value: Any) -> Any:
    """The keys at every level; a list stands for its first element's shape."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return None


def same_keys(documented: Any, printed: Any, where: str = "$") -> list[str]:
    a, b = shape(documented), shape(printed)
    if isinstance(a, dict) and isinstance(b, dict):
        problems = [f"{where}: documented, not printed: {k}" for k in a.keys() - b.keys()]
        problems += [f"{where}: printed, not documented: {k}" for k in b.keys() - a.keys()]
        for k in a.keys() & b.keys():
            problems += same_keys(documented[k], printed[k], f"{where}.{k}")
        return problems
    if isinstance(a, list) and isinstance(b, list) and a and b:
        return same_keys(documented[0], printed[0], f"{where}[0]")
    return []


@pytest.fixture
def files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Iterator[dict[str, str]]:
    assert cli.main(["slices", "--fake", "dgx-h100", "--node-name", "n1"]) == 0
    (tmp_path / "n1.yaml").write_text(capsys.readouterr().out)
    server = fakeserver.FakeApiServer(token="t0ken").start()
    try:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        yield {"n1.yaml": str(tmp_path / "n1.yaml"), "KUBECONFIG": str(kubeconfig)}
    finally:
        server.stop()


def test_the_doc_documents_the_commands_with_a_json_choice() -> None:
    documented = {cmd.split()[0] for cmd, _ in sections()}
    assert documented == {"simulate", "capacity", "doctor"}


@pytest.mark.parametrize(("cmd", "documented"), sections(), ids=lambda v: str(v).split()[0])
def test_documented_keys_are_the_printed_keys(
    cmd: str, documented: Any, files: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [files.get(word, word) for word in shlex.split(cmd)]
    assert cli.main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    assert same_keys(documented, printed) == []
    yaml_argv = [*argv[:-1], "yaml"]
    assert cli.main(yaml_argv) == 0
    again = yaml.safe_load(capsys.readouterr().out)
    if argv[0] == "doctor":  # the probe's dry-run names differ per run; the shape does not
        assert shape(again) == shape(printed)
    else:
        assert again == printed


def test_every_result_command_takes_dash_o(capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("simulate", "capacity", "doctor", "discover", "labels", "slices", "claim"):
        with pytest.raises(SystemExit):
            cli.main([name, "--help"])
        assert "-o {" in capsys.readouterr().out.replace("--output", ""), name
