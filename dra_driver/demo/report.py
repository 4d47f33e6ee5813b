"""The demo's printed walk-through and its checks: every scene reports through one ``Report``.

Why it exists: the demo's exit code is the verdict of many small checks spread over several
scenes; one object prints them in order and remembers which failed.
"""

from __future__ import annotations

import dataclasses
from typing import TextIO


@dataclasses.dataclass
class Report:
    """Prints the walk-through and remembers every check that failed."""

    out: TextIO
    problems: list[str] = dataclasses.field(default_factory=list)
    step: int = 0

    def section(self, title: str) -> None:
        self.step += 1
        self.out.write(f"\n== {self.step}. {title}\n")

    def say(self, text: str = "") -> None:
        self.out.write(text + "\n")

    def block(self, text: str, indent: str = "    ") -> None:
        for line in text.rstrip("\n").splitlines():
            self.out.write(indent + line + "\n")

    def check(self, ok: bool, text: str) -> bool:
        self.out.write(f"  [{'ok' if ok else 'FAILED'}] {text}\n")
        if not ok:
            self.problems.append(text)
        return ok
