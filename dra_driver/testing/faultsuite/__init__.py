"""The fault suite behind ``benchmarks/faults.py``: what found the defects of issue 16, runnable.

Why it exists: crash safety, bad input and API trouble are promises of the node agent that
ordinary tests check at a few chosen points; this suite checks them at many random ones, against
the real parts (plugin processes killed with SIGKILL, real gRPC over unix sockets, the real API
client through a fault-injecting TCP proxy, real files). Each scenario is a module with a
``run(size, rng, workdir) -> Row``; every trial is checked against the same invariants:

- **leaked specs**: a CDI spec of ours without a prepared claim (or a half-written temporary);
- **lost claims**: a claim the kubelet was told is prepared that is not (record or spec gone);
- **crashes**: a component that died on its own, or a start-up that failed;
- **hangs**: a call or a recovery that did not finish within its deadline;
- **failures**: trials that broke any promise (the four above included), each with a note.

The table (:func:`render`) ends with ``faults: N trials, F failures``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

COLUMNS = ("scenario", "trials", "failures", "leaked specs", "lost claims", "crashes", "hangs")


@dataclasses.dataclass(slots=True)
class Row:
    """One scenario's result."""

    scenario: str
    trials: int = 0
    failures: int = 0
    leaked_specs: int = 0
    lost_claims: int = 0
    crashes: int = 0
    hangs: int = 0
    seconds: float = 0.0
    notes: list[str] = dataclasses.field(default_factory=list)

    def fail(
        self, note: str, *, leaked: int = 0, lost: int = 0, crash: int = 0, hang: int = 0
    ) -> None:
        """Record one failed trial (``note`` says why; the first few are printed)."""
        self.failures += 1
        self.leaked_specs += leaked
        self.lost_claims += lost
        self.crashes += crash
        self.hangs += hang
        if len(self.notes) < 5:
            self.notes.append(note)


def render(rows: Sequence[Row]) -> str:
    """The table, then the notes of failed scenarios, then ``faults: N trials, F failures``."""
    lines = [
        [
            r.scenario,
            str(r.trials),
            str(r.failures),
            str(r.leaked_specs),
            str(r.lost_claims),
            str(r.crashes),
            str(r.hangs),
            f"{r.seconds:.1f}",
        ]
        for r in rows
    ]
    header = [*COLUMNS, "seconds"]
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]

    def fmt(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join([first, *rest])

    out = [fmt(header), fmt(["-" * w for w in widths])]
    out += [fmt(line) for line in lines]
    for r in rows:
        for note in r.notes:
            out.append(f"  {r.scenario}: {note}")
    trials = sum(r.trials for r in rows)
    failures = sum(r.failures for r in rows)
    out.append(f"faults: {trials} trials, {failures} failures")
    return "\n".join(out)
