"""Regenerate the JSON twins of the built-in fake GPU profiles from their YAML sources.

Why this exists: the built-in profiles are written in YAML, with comments, for people; a fake
node's agent loads its profile from the ``.json`` twin next to each ``.yaml``, so it needs no YAML
parser (PyYAML costs each agent ~1 MiB for its life, and a real node's agent in a DaemonSet loads
none: fleet figures measured on fake nodes should not carry it, docs/fleet.md). This script is the
only way the twins are produced, byte-identical on every run; ``--check`` names every twin that
is missing, stale or has no source (``tests/devices/test_profiles.py`` runs it).

Usage::

    python scripts/gen_profiles.py            # rewrite the .json twins
    python scripts/gen_profiles.py --check    # exit 1 if any twin differs from its source
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

FOLDER = Path(__file__).resolve().parent.parent / "dra_driver" / "devices" / "fake" / "profiles"


def twin(source: Path) -> str:
    """The JSON text for the YAML profile at ``source``."""
    data = yaml.safe_load(source.read_text(encoding="utf-8"))
    return json.dumps(data, indent=1, ensure_ascii=False) + "\n"


def drift(folder: Path = FOLDER) -> list[str]:
    """One line per twin that regenerating would change (or remove)."""
    problems = []
    sources = sorted(folder.glob("*.yaml"))
    for source in sources:
        target = source.with_suffix(".json")
        if not target.exists():
            problems.append(f"{target.name}: missing")
        elif target.read_text(encoding="utf-8") != twin(source):
            problems.append(f"{target.name}: differs from {source.name}")
    stems = {s.stem for s in sources}
    problems += [
        f"{t.name}: no {t.stem}.yaml" for t in sorted(folder.glob("*.json")) if t.stem not in stems
    ]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="JSON twins of the built-in fake GPU profiles")
    parser.add_argument("--check", action="store_true", help="report drift, change nothing")
    args = parser.parse_args(argv)
    if args.check:
        problems = drift()
        for line in problems:
            print(line)
        if problems:
            print("run `python scripts/gen_profiles.py` and commit the result", file=sys.stderr)
        return 1 if problems else 0
    for source in sorted(FOLDER.glob("*.yaml")):
        source.with_suffix(".json").write_text(twin(source), encoding="utf-8")
    for stale in FOLDER.glob("*.json"):
        if not stale.with_suffix(".yaml").exists():
            stale.unlink()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
