"""``-o/--output table|json|yaml``: one flag, one writer, for every command that prints a result.

Why it exists: each subcommand spelled the flag its own way (``text`` here, ``table`` there, no
JSON at all for ``simulate`` and ``doctor``). A command adds the flag with :func:`add_flag`
(``table`` for people, the default; ``json`` and ``yaml`` the same document for scripts) and
prints a document with :func:`emit`. The documents' shapes: docs/cli-output.md (a test checks
the keys it lists against what the commands print).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any, TextIO

TABLE, JSON, YAML = "table", "json", "yaml"
FORMATS = (TABLE, JSON, YAML)


def add_flag(
    parser: argparse.ArgumentParser,
    *,
    formats: Sequence[str] = FORMATS,
    default: str = TABLE,
    aliases: Sequence[str] = (),
) -> None:
    """``-o/--output``; ``aliases`` are older names of ``table`` still accepted (``text``)."""
    parser.add_argument(
        "-o",
        "--output",
        choices=(*formats, *aliases),
        default=default,
        help=f"result format: {', '.join(formats)} (default {default}; "
        "json and yaml: docs/cli-output.md)",
    )


def fmt(args: argparse.Namespace) -> str:
    """The chosen format, an alias of ``table`` read as ``table``."""
    chosen = str(args.output)
    return chosen if chosen in (JSON, YAML) else TABLE if chosen == "text" else chosen


def emit(doc: Any, form: str, out: TextIO | None = None) -> None:
    """Print ``doc`` as indented JSON or block YAML (keys in the order built)."""
    stream = out or sys.stdout
    if form == JSON:
        stream.write(json.dumps(doc, indent=2) + "\n")
    else:
        import yaml

        stream.write(yaml.safe_dump(doc, sort_keys=False))
