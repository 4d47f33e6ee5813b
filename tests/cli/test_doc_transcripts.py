"""The ``dra-driver simulate`` transcripts in docs/simulate.md and docs/sharing.md, rerun on the
files the repository ships: every explanation line a page shows is what the command prints."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from dra_driver import cli

REPO = Path(__file__).resolve().parents[2]


def transcripts() -> list[tuple[str, list[str], list[str]]]:
    """(page, command words, lines shown after it) per ``$ dra-driver simulate`` line."""
    found = []
    for page in ("docs/simulate.md", "docs/sharing.md"):
        lines = (REPO / page).read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if not line.startswith("$ dra-driver simulate "):
                continue
            shown = []
            for after in lines[i + 1 :]:
                if after.startswith(("$ ", "```")):
                    break
                shown.append(after)
            found.append((page, shlex.split(line[2:].split("  #")[0])[1:], shown))
    return found


def checkable(line: str) -> bool:
    """Explanation lines, shown whole (not elided with ``...`` nor annotated)."""
    return "..." not in line and line.startswith(("ResourceClaim ", "  - ", "    "))


@pytest.mark.parametrize("page,words,shown", transcripts(), ids=lambda v: str(v)[:60])
def test_a_simulate_transcript_prints_what_the_page_shows(
    page: str,
    words: list[str],
    shown: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(REPO)
    if "plain.yaml" in words:  # made by the line before: dra-driver claim --gpus 4 --nvlink any
        assert cli.main(["claim", "--gpus", "4", "--nvlink", "any"]) == 0
        plain = tmp_path / "plain.yaml"
        plain.write_text(capsys.readouterr().out)
        words = [str(plain) if w == "plain.yaml" else w for w in words]
    cli.main(words)
    out = capsys.readouterr().out.splitlines()
    expected = [line for line in shown if checkable(line)]
    assert expected or any(line.startswith("# explain:") for line in shown), page
    assert [line for line in expected if line not in out] == []
    explain = [ln for ln in shown if ln.startswith("# explain:") and "..." not in ln]
    assert [line for line in explain if line not in out] == []
