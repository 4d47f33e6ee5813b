"""Whether this process found the byte-code of its optimization level, or compiled from source.

Why it exists (issue 46): the chart runs the agents with ``PYTHONOPTIMIZE=2`` to keep docstrings
out of memory, and the image runs them with ``PYTHONDONTWRITEBYTECODE=1``. Python looks for a
module's byte-code at the *current* level only (``__pycache__/m.cpython-311.opt-2.pyc`` at level
2). Where that file is missing — a plain ``pip install`` compiles level 0 alone — every import
compiles its source in memory, and nothing is written for the next start. That costs CPU at
every start of every agent and memory the agent keeps (the compiler's peak heap is not given
back); measured with one agent (docs/fleet.md): more than ``PYTHONOPTIMIZE=2`` saves. The image
compiles both levels at build (Dockerfile, guarded by ``tests/deploy/test_dockerfile.py``); this
lets an agent installed any other way say so at start instead of silently paying for it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from types import ModuleType


@dataclass(frozen=True, slots=True)
class Report:
    """Modules loaded from source without byte-code at this process's level."""

    level: int
    checked: int
    missing: tuple[str, ...]


def check(modules: Iterable[ModuleType] | None = None) -> Report | None:
    """The modules (default: every one loaded) whose byte-code at this optimization level does
    not exist, so that each was compiled from source in this process and will be again at the
    next start. None when that cannot happen: byte-code may be written (the next start finds it)
    or no module has a source file to compile."""
    if not sys.dont_write_bytecode:
        return None
    level = sys.flags.optimize
    checked, missing = 0, []
    for module in list(sys.modules.values()) if modules is None else modules:
        spec = getattr(module, "__spec__", None)
        cached = getattr(spec, "cached", None) if spec is not None else None
        origin = getattr(spec, "origin", None) if spec is not None else None
        if not cached or not origin or not origin.endswith(".py"):
            continue  # built-in, frozen, an extension module, or loaded from byte-code only
        checked += 1
        if not os.path.exists(cached):
            missing.append(module.__name__)
    if not checked:
        return None
    return Report(level=level, checked=checked, missing=tuple(sorted(missing)))


def advice(report: Report) -> str:
    """What to do about ``report``'s missing byte-code, in one sentence."""
    levels = "-o 0 -o 2" if report.level else "-o 0"
    return (
        f"{len(report.missing)} of {report.checked} modules have no byte-code at optimization "
        f"level {report.level} and were compiled from source at this start (again at every "
        "start, with PYTHONDONTWRITEBYTECODE): CPU, and memory the process keeps. Compile "
        f"them once with `python -m compileall {levels}` over site-packages and the standard "
        "library (the image does)" + (", or unset PYTHONOPTIMIZE" if report.level else "")
    )
