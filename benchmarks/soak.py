"""Memory of the kubelet plugin over many prepare/unprepare cycles (leaks show up here).

Why it exists: the node agent runs for months; anything a prepare leaves behind (a lock per
claim, a record, a connection, a log binding) grows its memory until the kubelet's node runs
short. This runs the plugin as ``benchmarks/prepare.py`` does (a subprocess on a fake 32-GPU
node, real CDI and checkpoint files, the API over TLS with a client certificate on loopback
through the real client; ``benchmarks/benchkit.py``) and drives ``--cycles`` prepare + unprepare
calls through its socket, ``--batch`` claims per call, sampling the plugin process's ``VmRSS``
(and peak ``VmHWM``) from ``/proc``. Target: ≤ 80 MiB after 10,000 cycles, flat (± 2 MiB) once
warm.

Run: ``python benchmarks/soak.py [--cycles N] [--batch K] [--tree DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import benchkit as bench  # noqa: E402  (the benchmark's node, claims, API server and plugin)

TARGET_MIB = 80.0
FLAT_MIB = 2.0


def memory_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pid`` in MiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024  # kB
    return fields["VmRSS"], fields["VmHWM"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=10_000, help="prepare+unprepare cycles")
    parser.add_argument("--batch", type=int, default=1, help="claims per call (≤ 32)")
    parser.add_argument("--samples", type=int, default=10, help="memory samples along the way")
    parser.add_argument("--tree", type=Path, default=bench.REPO, help="the plugin's source tree")
    args = parser.parse_args(argv)
    batch = max(1, min(bench.GPUS, args.batch))
    calls = max(1, args.cycles // batch)
    base = Path(tempfile.mkdtemp(prefix="dra-soak-", dir="/tmp"))
    profile = base / "profile.yaml"
    profile.write_text(bench.profile_yaml())
    lib = base / "driver-root/usr/lib/x86_64-linux-gnu"
    lib.mkdir(parents=True)
    (lib / "libcuda.so.580.95.05").write_text("x")
    (lib / "libcuda.so.1").symlink_to("libcuda.so.580.95.05")
    # Distinct claims (distinct UIDs, so per-claim state cannot hide in reuse), 32 devices.
    objs = [bench.claim(f"soak-{i}", f"gpu-{i % bench.GPUS}") for i in range(256)]
    claims_file = base / "claims.json"
    claims_file.write_text(json.dumps(objs))
    api, kubeconfig = bench.start_api(base, claims_file, 0.0)
    rows: list[tuple[int, float, float, float]] = []
    try:
        plugin = bench.Plugin(
            base, kubeconfig, profile, cdi=bench.cdi_root(base), tree=args.tree, label="soak"
        )
        pid = plugin.proc.pid
        try:
            rss, hwm = memory_mib(pid)
            rows.append((0, rss, hwm, 0.0))
            began = time.perf_counter()
            step = max(1, calls // args.samples)
            for call in range(1, calls + 1):
                first = (call * batch) % len(objs)
                group = [objs[(first + k) % len(objs)] for k in range(batch)]
                group = list({o["metadata"]["uid"]: o for o in group}.values())
                plugin.prepare(group)
                plugin.unprepare(group)
                if call % step == 0 or call == calls:
                    rss, hwm = memory_mib(pid)
                    rows.append((call * batch, rss, hwm, time.perf_counter() - began))
        finally:
            plugin.stop()
    finally:
        api.send_signal(signal.SIGTERM)
        api.wait(timeout=20)
        shutil.rmtree(base, ignore_errors=True)

    print(
        f"kubelet plugin memory soak: {calls * batch} prepare+unprepare cycles, {batch} "
        f"claim(s) per call, 256 distinct claims ({os.cpu_count()} CPUs)"
    )
    print(f"{'cycles':>8} {'VmRSS MiB':>10} {'VmHWM MiB':>10} {'elapsed s':>10}")
    for cycles, rss, hwm, elapsed in rows:
        print(f"{cycles:>8} {rss:>10.1f} {hwm:>10.1f} {elapsed:>10.1f}")
    warm = rows[min(2, len(rows) - 1)]
    end = rows[-1]
    per_k = (end[1] - warm[1]) / max(1, end[0] - warm[0]) * 1000
    grown = end[1] - warm[1]
    ok = end[1] <= TARGET_MIB and abs(grown) <= FLAT_MIB
    print(
        f"after {end[0]} cycles: VmRSS {end[1]:.1f} MiB (target <= {TARGET_MIB:.0f}); "
        f"{grown:+.1f} MiB since cycle {warm[0]} (target within +-{FLAT_MIB:g}; "
        f"{per_k:+.2f} MiB per 1000 cycles): {'ok' if ok else 'MISSED'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
