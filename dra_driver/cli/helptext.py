"""``--help`` in plain text: the descriptions come from module docstrings written in RST.

Several subcommands take their description from their module's docstring (one text for the
developer and the operator), which marks code as ``double backticks`` and cross-references as
:func:`~module.name`. A terminal shows that markup literally; :class:`PlainParser`, the class of
the top-level parser and of every subcommand's, prints the help with it removed.
"""

from __future__ import annotations

import argparse
import re

# :role:`~pkg.mod.name` -> name; :role:`text` -> text
_ROLE = re.compile(r":[a-z]+:`(~?)([^`]*)`")


def plain(text: str) -> str:
    """``text`` without RST inline markup (literals, roles)."""

    def role(match: re.Match[str]) -> str:
        tilde, inner = match.groups()
        return inner.rsplit(".", 1)[-1] if tilde else inner

    return _ROLE.sub(role, text).replace("``", "")


class PlainParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose help and usage carry no RST markup."""

    def format_help(self) -> str:
        return plain(super().format_help())

    def format_usage(self) -> str:
        return plain(super().format_usage())
