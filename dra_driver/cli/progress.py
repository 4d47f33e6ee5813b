"""Progress of long work on stderr, for a person watching a terminal: off in pipes and logs.

Why it exists: ``simulate`` over 112,506 claim templates ran 104 s and ``capacity`` over 8,194
nodes many seconds without a sign of life. A :class:`Progress` rewrites one stderr line
(``capacity: nodes 4,096/8,194``) at most every :data:`INTERVAL` seconds and erases it when done,
so stdout (the result) and the final stderr are what they were. It is on only when stderr is a
terminal and ``--quiet`` is not given; otherwise every call is a no-op.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TextIO

INTERVAL = 0.2  # seconds between two redraws


def add_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress line on stderr (there is none anyway when stderr is not a terminal)",
    )


class Progress:
    """``step(done, total)`` redraws ``LABEL: WHAT done/total``; :meth:`close` erases it."""

    def __init__(self, label: str, *, stream: TextIO | None = None, quiet: bool = False) -> None:
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.enabled = bool(isatty and isatty()) and not quiet
        self.label = label
        self._last = 0.0
        self._width = 0

    @classmethod
    def of(cls, args: argparse.Namespace, label: str) -> Progress:
        return cls(label, quiet=bool(getattr(args, "quiet", False)))

    def say(self, what: str) -> None:
        """Show ``what`` now (a phase: reading a file, ...)."""
        if self.enabled:
            self._draw(f"{self.label}: {what}")

    def step(self, done: int, total: int, what: str = "") -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < INTERVAL and done < total:
            return
        self._last = now
        self._draw(f"{self.label}: {what + ' ' if what else ''}{done:,}/{total:,}")

    def close(self) -> None:
        if self.enabled and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0

    def _draw(self, text: str) -> None:
        pad = max(0, self._width - len(text))
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()
        self._width = len(text)
