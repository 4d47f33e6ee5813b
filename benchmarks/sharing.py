"""Prepare latency of a GPU share next to an exclusive claim, over the plugin's real socket.

Same set-up as ``benchmarks/prepare.py`` (:mod:`benchkit`: the plugin as a subprocess on a fake
32-GPU node, real checkpoint and CDI files, the in-memory API behind loopback HTTPS with a
client certificate). A share runs through its
GPU's MPS control daemon (the stand-in daemon on a fake node, a real process all the same), so
three cases are timed, each as single-claim NodePrepareResources / NodeUnprepareResources:

* an exclusive claim (no MPS);
* a share of a GPU whose daemon already runs (another share holds it): the common case;
* the first share of a GPU (prepare starts the daemon, sets the compute mode) and thus the
  last one (unprepare stops the daemon and restores the compute mode).

Run: ``python benchmarks/sharing.py [--calls N]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchkit as bench  # the benchmark's node, claims, API server and plugin


def share(name: str, device: str) -> dict[str, Any]:
    """A claim holding one share (4Gi, 10 % compute) of ``device``, as the scheduler leaves it."""
    obj = bench.claim(name, device)
    result = obj["status"]["allocation"]["devices"]["results"][0]
    result["shareID"] = str(uuid.uuid4())
    result["consumedCapacity"] = {"memory": "4Gi", "computeShare": "10"}
    return obj


def ms(seconds: float) -> str:
    return f"{seconds * 1000:8.2f}"


def timed(plugin: bench.Plugin, objs: list[dict[str, Any]]) -> tuple[list[float], list[float]]:
    prep, unprep = [], []
    for obj in objs:
        prep.append(plugin.prepare([obj]))
        unprep.append(plugin.unprepare([obj]))
    return prep, unprep


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=40, help="single-claim calls per case")
    args = parser.parse_args(argv)
    n = args.calls
    base = Path(tempfile.mkdtemp(prefix="dra-bench-", dir="/tmp"))
    profile = bench.make_node(base)
    exclusive = [bench.claim(f"excl-{i}", "gpu-1") for i in range(n + 5)]
    holder = share("holder", "gpu-2")
    joining = [share(f"join-{i}", "gpu-2") for i in range(n + 5)]
    first = [share(f"first-{i}", "gpu-3") for i in range(n + 5)]
    claims_file = base / "claims.json"
    claims_file.write_text(json.dumps([*exclusive, holder, *joining, *first]))
    api: subprocess.Popen[bytes] | None = None
    results: dict[str, tuple[list[float], list[float]]] = {}
    try:
        api, kubeconfig = bench.start_api(base, claims_file, 0.0)
        cdi = bench.cdi_root(base)
        plugin = bench.Plugin(base, kubeconfig, profile, serial=False, cdi=cdi)
        try:
            for group in (exclusive, joining, first):  # warm-up: connections, imports
                timed(plugin, group[:5])
            results["exclusive GPU"] = timed(plugin, exclusive[5:])
            plugin.prepare([holder])  # keeps gpu-2's daemon running
            results["share, daemon running"] = timed(plugin, joining[5:])
            plugin.unprepare([holder])
            results["share, starts/stops daemon"] = timed(plugin, first[5:])
        finally:
            plugin.stop()
    finally:
        if api is not None:
            api.send_signal(signal.SIGTERM)
            api.wait(timeout=20)
        _end_daemons(base)
        shutil.rmtree(base, ignore_errors=True)

    print(
        f"prepare latency: GPU share (MPS) vs exclusive GPU ({n} single-claim calls per case; "
        f"{os.cpu_count()} CPUs; fake node, stand-in MPS daemon)"
    )
    print(f"{'':40} {'p50 ms':>8} {'p90 ms':>8} {'max ms':>8}")
    for label, (prep, unprep) in results.items():
        for what, values in (("prepare", prep), ("unprepare", unprep)):
            row = " ".join(ms(bench.pct(values, p)) for p in (50, 90, 100))
            print(f"{what + ', ' + label:40} {row}")
    return 0


def _end_daemons(base: Path) -> None:
    """Daemons outlive the plugin by design; a benchmark ends its own."""
    records = base / "plugins" / bench.DRIVER / "mps" / "daemons"
    for path in records.glob("*.json") if records.is_dir() else ():
        pid = json.loads(path.read_text()).get("pid")
        if isinstance(pid, int):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


if __name__ == "__main__":
    raise SystemExit(main())
