"""Safe YAML loading that no input can crash: libyaml's speed, PyYAML's checks past a depth.

Why it exists: libyaml's composer (PyYAML's ``CSafeLoader``, used for a fleet's megabytes of
exported slices) recurses in C without a check, so a text nested 50,000 levels deep
(``[`` * 50,000, or ``- `` * 50,000) was a segmentation fault in every reader that used it, and
100,000 levels took 47 s before crashing. :func:`depth_bound` bounds the nesting a text can hold
cheaply: the flow brackets that are not empty pairs, plus the longest run of indentation and
``- ``/``? ``/``: `` at a line's start (a nested block node starts further right). Within
:data:`C_DEPTH` the C loader runs; past it PyYAML's pure-Python loader, whose recursion stops
with a :class:`RecursionError` in under a second: the callers' "nested too deeply" (exit 2).
A file of 8,194 nodes' slices (50 MiB) bounds at 1,001 and is read by libyaml as before.

Speed: block-style text as exporters write it (``yaml.safe_dump_all``, ``kubectl -o yaml``) is
read line by line (:mod:`dra_driver.yamllines`, 4.4 times faster than libyaml's events on a
fleet's slices); other files are built straight from libyaml's events (:func:`_from_events`,
3.2 times faster than ``CSafeLoader``; iterative, past :data:`MAX_DEPTH` levels a
RecursionError); what that leaves to PyYAML (merge keys, tagged collections, collection keys)
takes the path above.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from dra_driver import yamllines

_C_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# libyaml's composer took 20,000 levels on an 8 MiB stack and crashed at 50,000.
C_DEPTH = 10_000
_STR, _MAP, _SEQ = ("tag:yaml.org,2002:" + t for t in ("str", "map", "seq"))
_BLOCK_SCAN = 1_000  # a line starting with a longer run than this is measured
_BLOCK_PREFIX = re.compile(rf"^[ ?:-]{{{_BLOCK_SCAN},}}", re.MULTILINE)
_ANY_PREFIX = re.compile(r"^[ ?:-]+", re.MULTILINE)


def depth_bound(text: str) -> int:
    """An upper bound of the nesting depth of the YAML ``text`` (see the module docstring)."""
    flow = text.count("[") + text.count("{") - text.count("[]") - text.count("{}")
    block = _BLOCK_SCAN
    if _BLOCK_PREFIX.search(text):
        block = max(len(m.group()) for m in _ANY_PREFIX.finditer(text))
    return flow + block + 1


def load_all(text: str) -> list[Any]:
    """Every document of ``text``, as ``yaml.safe_load_all`` gives them. Raises
    :class:`yaml.YAMLError`, or :class:`RecursionError` for a text nested too deeply."""
    try:
        return yamllines.load_all(text)
    except yamllines.Unusual:
        pass
    if _C_LOADER is not yaml.SafeLoader:
        try:
            return _from_events(text)
        except _Unusual:
            pass
    loader = _C_LOADER if depth_bound(text) <= C_DEPTH else yaml.SafeLoader
    return list(yaml.load_all(text, Loader=loader))


class _Unusual(Exception):
    """Something :func:`_from_events` leaves to PyYAML: a merge key, a tag on a collection,
    a collection as a mapping key, a scalar tag without a safe constructor."""


_NO_KEY = object()
MAX_DEPTH = 1_000  # Python's own recursion limit: what the code reading the objects can walk
_COLLECTION_TAGS = (None, "!")


def _from_events(text: str) -> list[Any]:
    """The documents built straight from libyaml's parse events, in a loop (no recursion, so no
    depth can crash it): 3.2 times faster than ``CSafeLoader`` on exported slices (1.25 s
    against 4.0 s for 10 MB), which composes a node graph first and constructs it in Python.
    A plain scalar's tag is resolved once per distinct text, by PyYAML's own resolver; a scalar
    that is not a string is built by PyYAML's own constructor for its tag."""
    loader = _C_LOADER(text)
    constructors = loader.yaml_constructors
    tags: dict[str, str] = {}
    docs: list[Any] = []
    stack: list[list[Any]] = []  # [container, key waiting for its value]
    anchors: dict[str, Any] = {}
    root: list[Any] = []
    try:
        while True:
            event = loader.get_event()
            kind = type(event)
            value: Any
            if kind is yaml.ScalarEvent:
                tag = event.tag
                if tag is None or tag == "!":
                    if event.implicit[0]:
                        tag = tags.get(event.value)
                        if tag is None:
                            tag = loader.resolve(yaml.ScalarNode, event.value, (True, False))
                            if len(tags) < 200_000:
                                tags[event.value] = tag
                    else:
                        tag = _STR
                if tag == _STR:
                    value = event.value
                else:
                    construct = constructors.get(tag)
                    if construct is None:
                        raise _Unusual(tag)
                    node = yaml.ScalarNode(
                        tag, event.value, event.start_mark, event.end_mark, event.style
                    )
                    value = construct(loader, node)
            elif kind is yaml.MappingStartEvent or kind is yaml.SequenceStartEvent:
                mapping = kind is yaml.MappingStartEvent
                if event.tag not in (*_COLLECTION_TAGS, _MAP if mapping else _SEQ):
                    raise _Unusual(event.tag)
                made: Any = {} if mapping else []
                if event.anchor is not None:
                    anchors[event.anchor] = made
                stack.append([made, _NO_KEY])
                if len(stack) > MAX_DEPTH:
                    raise RecursionError(f"nested deeper than {MAX_DEPTH:,} levels")
                continue
            elif kind is yaml.MappingEndEvent or kind is yaml.SequenceEndEvent:
                value = stack.pop()[0]
            elif kind is yaml.AliasEvent:
                if event.anchor not in anchors:
                    raise _Unusual(event.anchor)  # PyYAML words the error
                value = anchors[event.anchor]
            elif kind is yaml.DocumentEndEvent:
                docs.append(root.pop() if root else None)
                anchors = {}
                continue
            elif kind is yaml.StreamEndEvent:
                return docs
            else:  # stream and document starts
                continue
            if kind is yaml.ScalarEvent and event.anchor is not None:
                anchors[event.anchor] = value
            if not stack:
                root.append(value)
                continue
            top = stack[-1]
            if type(top[0]) is list:
                top[0].append(value)
            elif top[1] is _NO_KEY:
                if value == "<<" or isinstance(value, (dict, list)):
                    raise _Unusual("merge key or collection key")
                top[1] = value
            else:
                top[0][top[1]] = value
                top[1] = _NO_KEY
    finally:
        loader.dispose()
