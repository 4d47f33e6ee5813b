"""The fault suite: SIGKILLs, corrupted checkpoints, gRPC fuzz, contention, API faults, restarts.

Why it exists: the defects of issue 16 were found by running the node agent through faults —
hundreds of SIGKILLs at random points, corrupted checkpoint files, thousands of odd gRPC calls,
concurrent duplicate and contested calls, API errors and outages through a fault-injecting
proxy, kubelet restarts under the device plugin, and two agents of one node handing over the
publishing. This runs all of it (:mod:`dra_driver.testing.faultsuite`), bounded in time, and prints
one table: per scenario the trials, failures, leaked specs, lost claims, crashes and hangs (and the
notes of failed trials). The last line is ``faults: N trials, F failures``; the exit code is 1
when F > 0.

Run: ``python benchmarks/faults.py [--quick] [--seed N] [--only NAME ...]`` (``make faults``).
The defaults take a few minutes on 2 cores; ``--quick`` (CI, through pytest) well under one.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dra_driver import logs  # noqa: E402
from dra_driver.testing import faultsuite  # noqa: E402
from dra_driver.testing.faultsuite import (  # noqa: E402
    apifaults,
    contention,
    corrupt,
    fuzz,
    kills,
    lifecycle,
    restarts,
)

Scenario = Callable[[random.Random, Path], list[faultsuite.Row]]

# name → (default size, quick size, runner). The forking scenarios come first: a process may
# only fork safely before grpc has started threads in it.
SIZES: dict[str, tuple[int, int]] = {
    "corrupt": (12, 0),
    "kills": (320, 40),
    "process-kills": (20, 1),
    "fuzz": (6000, 600),
    "contention": (600, 100),
    "api": (24, 3),
    "kubelet-restarts": (30, 5),
    "handovers": (6, 1),
    "lifecycle": (300, 12),
}


def scenarios(quick: bool) -> dict[str, Scenario]:
    def size(name: str) -> int:
        return SIZES[name][1 if quick else 0]

    long_outage = 0.0 if quick else 20.0
    return {
        "corrupt": lambda rng, w: [corrupt.run(size("corrupt"), rng, w)],
        "kills": lambda rng, w: [kills.run(size("kills"), rng, w)],
        "process-kills": lambda rng, w: [kills.run_process(size("process-kills"), rng, w)],
        "fuzz": lambda rng, w: fuzz.run(size("fuzz"), rng, w),
        "contention": lambda rng, w: [contention.run(size("contention"), rng, w)],
        "api": lambda rng, w: [apifaults.run(size("api"), rng, w, long_outage_s=long_outage)],
        "kubelet-restarts": lambda rng, w: [restarts.run_kubelet(size("kubelet-restarts"), rng, w)],
        "handovers": lambda rng, w: [restarts.run_handover(size("handovers"), rng, w)],
        "lifecycle": lambda rng, w: [lifecycle.run(size("lifecycle"), rng, w)],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the small sizes CI runs")
    parser.add_argument("--seed", type=int, default=16, help="random seed (default 16)")
    parser.add_argument(
        "--only", nargs="+", choices=sorted(SIZES), metavar="NAME", help="run only these"
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    logs.configure(level="critical", fmt="json")  # the scenarios report; agents log to files
    workdir = Path(tempfile.mkdtemp(prefix="faults-", dir="/tmp"))  # short: socket paths
    rows: list[faultsuite.Row] = []
    try:
        for name, scenario in scenarios(args.quick).items():
            if args.only and name not in args.only:
                continue
            started = time.monotonic()
            found = scenario(random.Random(f"{args.seed}-{name}"), workdir)
            for row in found:
                row.seconds = (time.monotonic() - started) / len(found)
            rows += found
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print(faultsuite.render(rows), flush=True)
    return 1 if any(r.failures for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
