"""What the README and docs/ claim, held to the repository where it can be checked: every file
path they name exists (links, and paths such as ``deployments/examples/one-gpu.yaml`` in text
and commands), every docs page is linked from the README, the demo's scene list and the Helm
values table agree with the code and ``values.yaml``, and no page cites reference material a
clone does not have."""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver import demo

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PAGES = sorted((REPO / "docs").glob("*.md"))
VALUES = REPO / "deployments" / "helm" / "dra-driver" / "values.yaml"
# Top-level folders of this repository: a word starting with one of them and a slash is a path.
ROOTS = ("dra_driver", "deployments", "docs", "tests", "benchmarks", "scripts", "e2e", "proto")
PATH = re.compile(r"(?<![\w./~-])((?:\.ci|" + "|".join(ROOTS) + r")/[\w./*<>{}-]*)")
LINK = re.compile(r"\]\(([^)\s]+)\)")
PLACEHOLDER = re.compile(r"/[A-Z_]+(\.\w+)?$")
NUMBERS = {"four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8}


def _docs() -> list[Path]:
    return [README, *PAGES]


def named_paths(text: str) -> set[str]:
    """Repository paths named in a page's text, without trailing punctuation."""
    return {match.group(1).rstrip(".,:;") for match in PATH.finditer(text)}


def missing_paths(text: str, base: Path) -> list[str]:
    """Named paths (and relative link targets, resolved from ``base``) that do not exist."""
    missing = []
    for path in sorted(named_paths(text)):
        if "<" in path or "{" in path or PLACEHOLDER.search(path):
            continue  # tests/<pkg>, benchmarks/NAME.py
        if "*" in path:
            if not list(REPO.glob(path)):
                missing.append(path)
        elif not (REPO / path).exists():
            missing.append(path)
    made: set[str] = set()
    for line in text.splitlines():  # transcripts (``$ command``) ran on files the repo ships
        if not line.startswith("$ "):
            continue
        words = line.split("#")[0].split()
        for before, word in itertools.pairwise(words):
            if before == ">":
                made.add(word)
            elif (
                re.fullmatch(r"[\w./-]+\.(yaml|json)", word)
                and word not in made
                and not (REPO / word).exists()
            ):
                missing.append(f"transcript file {word}")
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a URL or an anchor of this page
        if not (base / target.split("#")[0]).exists():
            missing.append(f"link {target}")
    return missing


@pytest.mark.parametrize("page", _docs(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_file_a_doc_names_exists(page: Path) -> None:
    assert missing_paths(page.read_text(encoding="utf-8"), page.parent) == []


def test_the_path_check_catches_a_missing_file() -> None:
    text = (
        "$ dra-driver claim --gpus 2 > plain.yaml\n"
        "$ dra-driver simulate plain.yaml --allocated gpu0-taken.yaml  # gpu-0 held\n"
        "try `dra-driver simulate x.yaml --allocated docs/simulate/gpu1-taken.yaml`, "
        "see [the page](nothing.md) and deployments/examples/*.nope; "
        "deployments/examples/one-gpu.yaml, tests/<pkg> and benchmarks/NAME.py are fine."
    )
    assert missing_paths(text, REPO) == [
        "deployments/examples/*.nope",
        "docs/simulate/gpu1-taken.yaml",
        "transcript file gpu0-taken.yaml",
        "link nothing.md",
    ]


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {t.split("#")[0] for t in LINK.findall(README.read_text(encoding="utf-8"))}
    unlinked = [p.relative_to(REPO).as_posix() for p in PAGES]
    assert [p for p in unlinked if p not in linked] == []


def test_the_readme_lists_every_demo_scene_and_counts_them() -> None:
    text = " ".join(README.read_text(encoding="utf-8").split())
    assert re.findall(r"`--scene ([\w-]+)`", text) == demo.scene_names()
    count = re.search(r"`make demo` runs `(?:\.venv/bin/)?dra-driver demo`, (\w+) scenes", text)
    assert count is not None and NUMBERS[count.group(1)] == len(demo.scene_names())


def values_table() -> list[tuple[list[str], list[Any]]]:
    """The README's Helm values table: (value names, their stated defaults) per row."""
    text = README.read_text(encoding="utf-8")
    start = text.index("| value | default | what |")
    rows = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        names = re.findall(r"`([\w.]+)`", cells[0])
        defaults = [yaml.safe_load(d) for d in re.findall(r"`([^`]*)`", cells[1])]
        rows.append((names, defaults))
    return rows


def test_the_readme_values_table_states_the_defaults_of_values_yaml() -> None:
    values = yaml.safe_load(VALUES.read_text(encoding="utf-8"))
    rows = values_table()
    assert len(rows) >= 10
    wrong = []
    for names, defaults in rows:
        assert len(names) == len(defaults), names
        for name, stated in zip(names, defaults, strict=True):
            actual: Any = values
            for key in name.split("."):
                actual = actual[key]  # a KeyError: the README names a value the chart lacks
            if actual != stated:
                wrong.append(f"{name}: README says {stated!r}, values.yaml has {actual!r}")
    assert wrong == []


def test_no_page_or_module_cites_the_reference_contracts_for_api_limits() -> None:
    # A clone has no ../shared: the limits it relies on are in docs/api-limits.md.
    sources = [*_docs(), *(REPO / "dra_driver").rglob("*.py"), *(REPO / "tests").rglob("*.py")]
    citing = [
        p.relative_to(REPO).as_posix()
        for p in sources
        if p.name != "test_docs.py" and "contracts.md §5" in p.read_text(encoding="utf-8")
    ]
    assert citing == []
