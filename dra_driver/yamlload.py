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
"""

from __future__ import annotations

import re
from typing import Any

import yaml

_C_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# libyaml's composer took 20,000 levels on an 8 MiB stack and crashed at 50,000.
C_DEPTH = 10_000
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
    loader = _C_LOADER if depth_bound(text) <= C_DEPTH else yaml.SafeLoader
    return list(yaml.load_all(text, Loader=loader))
