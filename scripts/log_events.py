"""The catalogue of log events: every event the driver's code logs, its level and its fields.

Why it exists: operators alert and search on log events, so an event's text, level and fields
are an interface. ``docs/log-events.md`` lists them all; this script writes that page from the
source (``python scripts/log_events.py --write``), and the test suite holds both ends of it:
the page must match the source, and every event a test makes the code log must be on the page
with its level and the fields listed there, each with a value (``tests/conftest.py``). A
renamed event, a dropped field or a changed level is then a visible change to the page.

An event is the first argument of a logger call (``log.info("claim prepared", devices=...)``):
a literal, a choice between two literals, or an f-string (its ``{...}`` parts match any text).
A ``failed=`` literal is the event of a periodic loop's failed round (logged at error level).
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "dra_driver"
PAGE = REPO / "docs" / "log-events.md"
LEVEL_OF = {
    "debug": "debug",
    "info": "info",
    "warning": "warning",
    "warn": "warning",
    "error": "error",
    "exception": "error",
    "critical": "critical",
}
# Fields that are null on some lines of an event (written ``name?`` on the page): every other
# listed field must have a value.
MAY_BE_NULL = {
    ("device unhealthy", "ended"),  # no condition ended with this change
    ("device health changed", "ended"),
    ("stopped MPS control daemon", "pid"),  # a daemon that never got a process
}
SKIP_FILES = ("logs.py",)  # the stdlib bridge re-logs other libraries' records as they are
HEADER = """# Log events

Every event the driver logs (the `event` key of a JSON log line), with its level and the
fields that are always on it. Lines about a claim also carry `claim_uid`, `claim_namespace`
and `claim_name`; every line carries `logger`, `level` and `timestamp`. `{...}` in an event
stands for a part that varies (a gRPC method, an operation). Every listed field has a value
except those written `name?`, which are null on some lines.

Written by `python scripts/log_events.py --write` from the source. The tests check that this
page matches the source and that every event a test run logs is listed here with its level
and fields, so a change to an event shows up here.

| level | event | fields | where |
|---|---|---|---|
"""


@dataclass(frozen=True, order=True)
class Event:
    level: str
    text: str
    fields: tuple[str, ...]
    where: str

    def pattern(self) -> re.Pattern[str]:
        parts = re.split(r"\{[^{}]*\}", self.text)
        return re.compile(".+?".join(re.escape(p) for p in parts) + r"\Z", re.S)


def _texts(node: ast.expr) -> list[str] | None:
    """The event texts an argument can be; None when it is not a literal form."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        body, other = _texts(node.body), _texts(node.orelse)
        return body + other if body is not None and other is not None else None
    if isinstance(node, ast.JoinedStr):
        out = ""
        for part in node.values:
            if isinstance(part, ast.Constant):
                out += str(part.value)
            else:
                out += "{" + ast.unparse(part).strip("{}").removeprefix("f") + "}"
        return [re.sub(r"\{.*?\}", lambda m: "{" + m.group(0)[1:-1].split("!")[0] + "}", out)]
    return None


def scan(package: Path = PACKAGE) -> list[Event]:
    """Every log event in the package's source, sorted."""
    found: set[Event] = set()
    for path in sorted(package.rglob("*.py")):
        if path.name in SKIP_FILES or path.name.endswith("_pb2.py") or "_pb2_" in path.name:
            continue
        where = path.relative_to(package.parent).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            for kw in node.keywords:
                if kw.arg == "failed" and (texts := _texts(kw.value)):
                    found.update(Event("error", t, (), where) for t in texts)
            func = node.func
            if not (isinstance(func, ast.Attribute) and func.attr in LEVEL_OF and node.args):
                continue
            if not _is_logger(func.value):
                continue
            if isinstance(node.args[0], ast.Attribute) and node.args[0].attr == "_failed":
                continue  # the periodic loop's event: the ``failed=`` literals above
            texts = _texts(node.args[0])
            if texts is None:
                raise SystemExit(f"{where}:{node.lineno}: a log event that is not a literal")
            names = sorted(kw.arg for kw in node.keywords if kw.arg is not None)
            for t in texts:
                fields = tuple(f"{f}?" if (t, f) in MAY_BE_NULL else f for f in names)
                found.add(Event(LEVEL_OF[func.attr], t, fields, where))
    return sorted(found)


def _is_logger(node: ast.expr) -> bool:
    """``log``, ``clog``, ``self._log``, ``logger``, ``self._claim_log(ref)``…: a receiver
    whose name says it is a logger."""
    if isinstance(node, ast.Call):
        node = node.func
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    return bool(re.fullmatch(r"_?[a-z_]*log(ger)?", name))


def render(events: list[Event]) -> str:
    rows = []
    for e in events:
        text = e.text.replace("|", "\\|")
        fields = ", ".join(f"`{f}`" for f in e.fields) or "—"
        rows.append(f"| {e.level} | `{text}` | {fields} | {e.where} |")
    return HEADER + "\n".join(rows) + "\n"


def parse(text: str) -> list[Event]:
    """The events listed on the page."""
    events = []
    row = re.compile(r"^\| (\w+) \| `(.*)` \| (.*) \| (\S+) \|$")
    for line in text.splitlines():
        if m := row.match(line):
            fields = tuple(re.findall(r"`([^`]+)`", m.group(3)))
            events.append(Event(m.group(1), m.group(2).replace("\\|", "|"), fields, m.group(4)))
    return events


class Catalogue:
    """Checks logged events against the page."""

    def __init__(self, events: list[Event]) -> None:
        # level -> (event pattern, fields, the fields that may be null)
        self.by_level: dict[str, list[tuple[re.Pattern[str], frozenset[str], frozenset[str]]]]
        self.by_level = {}
        for e in events:
            fields = frozenset(f.rstrip("?") for f in e.fields)
            nullable = frozenset(f.rstrip("?") for f in e.fields if f.endswith("?"))
            self.by_level.setdefault(e.level, []).append((e.pattern(), fields, nullable))

    def problem(self, method: str, event_dict: dict[str, object]) -> str | None:
        """Why this logged event breaks the catalogue; None when it is listed."""
        level, text = LEVEL_OF.get(method, method), event_dict.get("event")
        if not isinstance(text, str):
            return f"a {level} event that is not text: {text!r}"
        rows = [(f, n) for pattern, f, n in self.by_level.get(level, []) if pattern.match(text)]
        if not rows:
            return f"{level} event {text!r} is not in docs/log-events.md"
        if not any(fields <= event_dict.keys() for fields, _ in rows):
            want = " or ".join(sorted(", ".join(sorted(f)) for f, _ in rows))
            return f"{level} event {text!r} lacks its fields ({want}): has {sorted(event_dict)}"
        empty = [
            {f for f in fields - nullable if event_dict.get(f) is None} for fields, nullable in rows
        ]
        if all(empty):
            names = sorted(set().union(*empty))
            return f"{level} event {text!r}: fields without a value: {', '.join(names)}"
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write {PAGE.relative_to(REPO)}")
    args = parser.parse_args()
    text = render(scan())
    if args.write:
        PAGE.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
