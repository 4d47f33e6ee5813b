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
