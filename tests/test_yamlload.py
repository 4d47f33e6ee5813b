"""The YAML loader: libyaml for ordinary files, and no crash on any nesting."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dra_driver import yamlload
from dra_driver.allocation import documents

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "path",
    sorted((REPO / "deployments" / "examples").glob("*.yaml"))
    + sorted((REPO / "deployments" / "static").glob("*.yaml")),
    ids=lambda p: p.name,
)
def test_the_repos_yaml_is_read_by_libyaml_as_safe_load_all_reads_it(path: Path) -> None:
    text = path.read_text()
    assert yamlload.depth_bound(text) <= yamlload.C_DEPTH
    assert yamlload.load_all(text) == list(yaml.safe_load_all(text))


@pytest.mark.parametrize(
    "text",
    ["[" * 50_000 + "]" * 50_000, "- " * 50_000 + "x\n", "{a: " * 30_000 + "b" + "}" * 30_000],
    ids=["flow-sequences", "compact-block-sequences", "flow-mappings"],
)
def test_deep_nesting_is_an_error_not_a_crash(text: str) -> None:
    assert yamlload.depth_bound(text) > yamlload.C_DEPTH
    with pytest.raises(documents.SimulateError, match="nested too deeply"):
        documents.parse_documents(text, source="deep.yaml")


def test_libyaml_would_have_crashed() -> None:
    """Why the bound exists: the C loader on 50,000 levels dies of SIGSEGV (a process)."""
    code = "import yaml; yaml.load('[' * 50000 + ']' * 50000, Loader=yaml.CSafeLoader)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert proc.returncode == -11


def test_block_nesting_is_measured() -> None:
    text = "".join(" " * i + "a:\n" for i in range(1500)) + " " * 1500 + "b\n"
    assert yamlload.depth_bound(text) >= 1500
    shallow = "".join(" " * 1200 + f"k{i}: v\n" for i in range(3))
    assert yamlload.depth_bound(shallow) >= 1200  # a bound: indentation alone counts


TRICKY = """\
plain: text
quoted: "123"
int: 123
octal: 0o17
float: 1.5e3
bools: [true, false, yes, no, on, off]
nulls: [~, null, ""]
date: 2024-01-02
stamp: 2024-01-02T03:04:05Z
binary: !!binary aGVsbG8=
explicit: !!str 42
anchor: &a {x: 1, y: [1, 2]}
alias: *a
scalar-anchor: &s 7
scalar-alias: *s
merged:
  <<: *a
  y: 3
set: !!set {a, b}
---
- second document
---
"""


@pytest.mark.parametrize(
    "text",
    [TRICKY, TRICKY.split("merged:")[0], "a: 1\n---\n---\nb: [1, {c: d}]\n", ""],
    ids=["tricky", "no-merge-key", "documents", "empty"],
)
def test_equal_to_safe_load_all(text: str) -> None:
    assert yamlload.load_all(text) == list(yaml.safe_load_all(text))


def test_exported_slices_are_built_from_events(capsys: pytest.CaptureFixture[str]) -> None:
    from dra_driver import cli

    assert cli.main(["slices", "--fake", "dgx-h100", "--node-name", "n1"]) == 0
    text = capsys.readouterr().out
    assert yamlload._from_events(text) == list(yaml.safe_load_all(text))


@pytest.mark.parametrize("text", ["? [a]\n: 1\n", "a: *nowhere\n", "[1, 2\n"])
def test_errors_are_pyyamls(text: str) -> None:
    with pytest.raises(yaml.YAMLError):
        yamlload.load_all(text)


def test_the_event_builder_stops_at_max_depth() -> None:
    ok = "[" * yamlload.MAX_DEPTH + "]" * yamlload.MAX_DEPTH
    assert yamlload.load_all(ok)
    deep = "[" * (yamlload.MAX_DEPTH + 1) + "]" * (yamlload.MAX_DEPTH + 1)
    with pytest.raises(RecursionError):
        yamlload._from_events(deep)
