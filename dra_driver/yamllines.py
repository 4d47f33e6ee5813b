"""The fast path of :mod:`dra_driver.yamlload`: block-style YAML read line by line.

Why it exists: ``capacity --slices`` over a fleet's exported ResourceSlices reads tens of MiB of
YAML (8,194 nodes: 50 MiB, 2.3 million lines). libyaml's parser alone, through PyYAML's event
objects (two ``Mark`` objects per event, 5.8 million events), took three times as long as
``json.load`` of the same objects, and more than the whole command's 5 s budget. What
``yaml.safe_dump_all`` and ``kubectl get -o yaml`` write is almost always a narrow subset of
YAML: block mappings and sequences, one entry a line, one-line scalars. :func:`load_all` reads
exactly that subset, one ``str`` operation or cached dictionary look-up per token, and raises
:class:`Unusual` on the first line outside it, so that the caller reads the whole text with the
full parser instead (its results and its error messages, with their line numbers, are then
PyYAML's own).

The subset, and why each rule gives PyYAML's answer:

* lines of spaces and printable ASCII, no comment, no tab, no blank line, no directive; ``---``
  alone on a line separates documents; every document's root a block collection at column 0;
* a line is ``- `` items (a sequence at the dash's column) then ``KEY: VALUE``, ``KEY:`` or a
  scalar; a line's column must be that of an open collection, or deeper right after a ``KEY:``
  or ``-`` with no value (a nested block), or a ``-`` at its mapping's column (PyYAML's
  indentless sequence); anything else is a continuation line or an error: full parser;
* keys are plain scalars; values are plain scalars, one-line quoted scalars without escapes,
  ``[]`` or ``{}``. A plain scalar holds no ``: ``, no ``#``, no flow indicator or quote, and
  does not start with an indicator: so no line of the subset is a multi-line scalar, an
  anchor, an alias, a tag or a flow collection;
* a plain scalar's type is PyYAML's resolver's and its value PyYAML's constructor's (once per
  distinct text): ``on`` is ``True``, ``1:30`` is ``90``, ``2024-01-02`` a date, as in PyYAML;
  a merge key (``<<``) or a tag without a safe constructor is left to the full parser.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

MAX_DEPTH = 1_000  # as yamlload.MAX_DEPTH: deeper is the full parser's RecursionError
_MAX_KEY = 1_000  # PyYAML's simple keys stop at 1,024 characters
_STR = "tag:yaml.org,2002:str"
_PLAIN = re.compile(r"[A-Za-z0-9_./()~^$+=<;-](?:[A-Za-z0-9_./()~^$+=<>;@%!?*&|: -]*[^: ])?")
# A quoted key and its colon: one line, no escape (the same rules as Scalars.value's).
_QUOTED_KEY = re.compile(r"""(?:'(?:[^']|'')*'|"[^"\\]*"):""")


class Unusual(Exception):
    """The text is outside the subset this module reads (see the module docstring)."""


class _Scalars:
    """Plain scalars resolved and constructed as PyYAML does, each distinct text once."""

    def __init__(self) -> None:
        self.loader = yaml.SafeLoader("")
        self.values: dict[str, Any] = {}

    def plain(self, text: str) -> Any:
        try:
            return self.values[text]
        except KeyError:
            pass
        if (
            _PLAIN.fullmatch(text) is None
            or ": " in text
            or text == "-"
            or text.startswith(("---", "...", "- "))
        ):
            raise Unusual(text)
        tag = self.loader.resolve(yaml.ScalarNode, text, (True, False))  # type: ignore[no-untyped-call]
        if tag == _STR:
            value: Any = text
        else:
            construct = self.loader.yaml_constructors.get(tag)
            if construct is None:
                raise Unusual(tag)
            value = construct(self.loader, yaml.ScalarNode(tag, text))
        if len(self.values) < 200_000:
            self.values[text] = value
        return value

    def value(self, text: str) -> Any:
        if not text:
            raise Unusual("trailing space")
        first = text[0]
        if first == "'":
            body = text[1:-1]
            if len(text) < 2 or text[-1] != "'" or "'" in body.replace("''", ""):
                raise Unusual(text)
            return body.replace("''", "'")
        if first == '"':
            body = text[1:-1]
            if len(text) < 2 or text[-1] != '"' or '"' in body or "\\" in body:
                raise Unusual(text)
            return body
        if text == "[]":
            return _NEW_LIST
        if text == "{}":
            return _NEW_MAP
        return self.plain(text)

    def close(self) -> None:
        self.loader.dispose()


def load_all(text: str) -> list[Any]:
    """Every document of ``text``, as ``yaml.safe_load_all`` gives them; :class:`Unusual` if
    the text is outside the subset (the module docstring)."""
    if not text.isascii() or not text.replace("\n", "").isprintable():
        raise Unusual("not printable ASCII")
    if text.startswith("---\n"):
        text = text[4:]
    if text.endswith("\n"):
        text = text[:-1]
    scalars = _Scalars()
    parser = _Lines(scalars)
    try:
        return [_document(doc.split("\n"), parser) for doc in text.split("\n---\n")]
    finally:
        scalars.close()


# What a line holds after its "- " items; "[]" and "{}" values are a new object each time.
_KV, _KEY, _SCALAR, _DASH, _KV_NEW, _SCALAR_NEW = range(6)
_NEW_LIST, _NEW_MAP = object(), object()


_Parsed = tuple[int, tuple[int, ...], int, int, Any, Any]


class _Lines:
    """Each distinct line taken apart once: ``(column, dash columns, content column, kind, key,
    value)``. A fleet's export repeats most of its lines (``string: Hopper`` under every GPU),
    so most lines cost one dictionary look-up here."""

    def __init__(self, scalars: _Scalars) -> None:
        self.scalars = scalars
        self.seen: dict[str, _Parsed] = {}

    def parse(self, line: str) -> _Parsed:
        content = line.lstrip(" ")
        col = len(line) - len(content)
        if not content or content[0] == "#":
            raise Unusual("a blank or comment line")
        first = col
        dashes: list[int] = []
        while content == "-" or content.startswith("- "):
            dashes.append(col)
            if content == "-":
                break
            if len(dashes) > MAX_DEPTH:
                raise Unusual("deep")
            rest = content[2:].lstrip(" ")
            col += len(content) - len(rest)
            content = rest
            if not content:
                raise Unusual("trailing space")
        if content == "-":
            parsed = (first, tuple(dashes), col, _DASH, None, None)
        else:
            parsed = (first, tuple(dashes), col, *self._content(content))
        if len(self.seen) < 200_000:
            self.seen[line] = parsed
        return parsed

    def _content(self, content: str) -> tuple[int, Any, Any]:
        quoted = _QUOTED_KEY.match(content)
        if quoted is not None:  # 'KEY': VALUE, "KEY": VALUE, or the same without a value
            cut = quoted.end() - 1
            key = self.scalars.value(content[:cut])
            if len(content) == cut + 1:
                return _KEY, key, None
            if content[cut + 1] != " ":
                raise Unusual("a quoted scalar with more after it")
        else:
            cut = content.find(": ")
            if cut < 0 and content[-1] != ":":
                value = self.scalars.value(content)
                return (_SCALAR_NEW if type(value) is object else _SCALAR), None, value
            if cut < 0:
                cut = len(content) - 1
            key = self.scalars.plain(content[:cut])
            if type(key) not in (str, int, bool, float) and key is not None:
                raise Unusual("a key PyYAML constructs otherwise")
            if cut == len(content) - 1:
                return _KEY, key, None
        if cut > _MAX_KEY:
            raise Unusual(f"a key longer than {_MAX_KEY} characters")
        value = self.scalars.value(content[cut + 2 :])
        return (_KV_NEW if type(value) is object else _KV), key, value


def _document(lines: list[str], parser: _Lines) -> Any:
    if lines == [""]:
        raise Unusual("an empty document")
    seen = parser.seen
    parse = parser.parse
    first = seen.get(lines[0]) or parse(lines[0])
    if first[0] != 0:
        raise Unusual("an indented root")
    root: Any = [] if first[1] else {}
    # Open collections, innermost last: (column, is a mapping, container).
    stack: list[tuple[int, bool, Any]] = [(0, not first[1], root)]
    col, is_map, into = stack[-1]
    pending = False  # the last line was a "KEY:" or "-" without a value
    waiting: Any = None  # that line's key
    for line in lines:
        at, dashes, content_col, kind, key, value = seen.get(line) or parse(line)
        if pending:
            pending = False
            if at > col and not dashes:  # a nested mapping (``KEY:`` then deeper entries)
                made: Any = {}
                if is_map:
                    into[waiting] = made
                else:
                    into.append(made)
                stack.append((at, True, made))
                if len(stack) > MAX_DEPTH:
                    raise Unusual("deep")
                col, is_map, into = at, True, made
                if kind == _KV:
                    made[key] = value
                elif kind == _KEY:
                    pending, waiting = True, key
                elif kind == _KV_NEW:
                    made[key] = _fresh(value)
                else:
                    raise Unusual("a scalar where a mapping entry belongs")
                continue
            if at > col or (at == col and dashes and is_map):  # a nested sequence
                made = []
                stack.append((at, False, made))
                if is_map:
                    into[waiting] = made
                else:
                    into.append(made)
                col, is_map, into = at, False, made
                if len(stack) > MAX_DEPTH:
                    raise Unusual("deep")
            elif is_map:
                into[waiting] = None
            else:
                into.append(None)
        if at != col:
            if at > col:
                raise Unusual("a continuation line or a misaligned one")
            while stack[-1][0] > at:
                stack.pop()
            col, is_map, into = stack[-1]  # never empty: the root is at column 0
            if col != at:
                raise Unusual("a misaligned line")
        if not dashes:
            if not is_map:
                # A line at an indentless sequence's column that is not an item ends it.
                if len(stack) == 1 or stack[-2][0] != at:
                    raise Unusual("a mapping entry where a sequence item belongs")
                stack.pop()
                col, is_map, into = stack[-1]
            if kind == _KV:
                into[key] = value
            elif kind == _KEY:
                pending, waiting = True, key
            elif kind == _KV_NEW:
                into[key] = _fresh(value)
            else:
                raise Unusual("a scalar where a mapping entry belongs")
            continue
        if is_map:
            raise Unusual("a sequence item where a mapping entry belongs")
        for dash in dashes[1:]:
            made = []
            into.append(made)
            stack.append((dash, False, made))
            col, into = dash, made
        if kind == _SCALAR:
            into.append(value)
        elif kind == _SCALAR_NEW:
            into.append(_fresh(value))
        elif kind == _DASH:
            pending, waiting = True, None
        else:
            made = {}
            into.append(made)
            stack.append((content_col, True, made))
            col, is_map, into = content_col, True, made
            if kind == _KEY:
                pending, waiting = True, key
            else:
                into[key] = _fresh(value) if kind == _KV_NEW else value
        if len(stack) > MAX_DEPTH:
            raise Unusual("deep")
    if pending:
        if is_map:
            into[waiting] = None
        else:
            into.append(None)
    return root


def _fresh(marker: object) -> Any:
    return [] if marker is _NEW_LIST else {}
