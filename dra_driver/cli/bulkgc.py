"""The cyclic garbage collector paused while a one-shot command reads and counts bulk input.

Why it exists: ``capacity`` and ``simulate`` build millions of small dicts, lists and strings
from their input files (8,194 nodes of slices are ~60 MB of YAML), all of them trees that hold
no reference cycles. CPython's collector still runs a generation-0 pass every 700 allocations
and keeps promoting the growing heap, so every full pass walks all of it again: 1.3 to 1.8 s of a
4 s ``capacity`` run over 8,194 nodes (issue 47's ≤ 5 s bar). Reference counting still frees
everything as usual; only cycle detection waits until the command is done, and the process
ends soon after. The long-running agent never pauses its collector.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No cyclic collection inside; the collector's previous state restored after."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
