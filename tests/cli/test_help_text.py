"""Every ``--help`` is plain text: no RST markup from the docstrings it is built from."""

from __future__ import annotations

import re

import pytest

from dra_driver import cli
from dra_driver.cli import helptext

MARKUP = re.compile(r"``|:[a-z]+:`")


def test_plain_strips_literals_and_roles() -> None:
    text = "``--slices`` see :func:`~dra_driver.cli.slices.summaries` and :mod:`dra_driver.demo`"
    assert helptext.plain(text) == "--slices see summaries and dra_driver.demo"


@pytest.mark.parametrize("name", [None, *cli.SUMMARIES])
def test_help_has_no_rst_markup(name: str | None, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main([name, "--help"] if name else ["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: dra-driver")
    assert not MARKUP.findall(out), [ln for ln in out.splitlines() if MARKUP.search(ln)]
