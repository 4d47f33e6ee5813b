"""The resident memory a node agent cannot go below: its interpreter and the libraries it needs.

Why it exists: issue 38 holds each agent to the Go helper's footprint. This prints, step by step
in fresh processes, the RSS of the interpreter alone, then with each dependency the agent cannot
do without (gRPC with the kubelet's two servers, TLS, protobuf, structlog, prometheus-client,
pynvml; not PyYAML, which an agent with an in-cluster or JSON configuration never loads), so the
agent's own share (``benchmarks/fleet.py``) can be read against that floor (docs/fleet.md).

Run: ``python benchmarks/agent_floor.py [--python PATH] [--optimize 0|2]``. By default the
interpreter is the venv the image builds (``imagekit.py``: runtime dependencies only, byte-code of
levels 0 and 2) with the image's environment and ``PYTHONOPTIMIZE=2``, as the chart runs the
agents; ``--python`` runs another one with this process's environment.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import imagekit

STEPS = [
    ("interpreter", ""),
    ("+ grpc, two servers on unix sockets", "grpc"),
    ("+ protobuf", "google.protobuf.message"),
    ("+ structlog", "structlog"),
    ("+ prometheus_client", "prometheus_client"),
    ("+ pynvml", "pynvml"),
]

PROBE = """
import importlib, os, sys, time
for name in sys.argv[1:]:
    importlib.import_module(name)
if "grpc" in sys.argv[1:]:
    import grpc
    from concurrent import futures
    for i in range(2):
        server = grpc.server(futures.ThreadPoolExecutor(16))
        path = f"/tmp/agent-floor-{os.getpid()}-{i}.sock"
        server.add_insecure_port(f"unix:{path}")
        server.start()
        os.unlink(path)  # bound: the server keeps listening, the name goes
    time.sleep(1)
with open("/proc/self/status") as status:
    print([line.split()[1] for line in status if line.startswith("VmRSS:")][0])
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "agent floor").split("\n\n")[0])
    parser.add_argument(
        "--python", default=None, help="the agents' interpreter (default: the image's venv)"
    )
    parser.add_argument(
        "--optimize",
        type=int,
        choices=(0, 2),
        default=2,
        help="PYTHONOPTIMIZE, as the chart runs the agents (default 2)",
    )
    args = parser.parse_args(argv)
    if args.python is None:
        venv = imagekit.runtime_venv()
        args.python = str(venv / "bin/python")
        env = imagekit.process_env(venv, optimize=args.optimize)
    else:
        env = {**os.environ, "PYTHONOPTIMIZE": str(args.optimize) if args.optimize else ""}
    print(f"interpreter {args.python}, PYTHONOPTIMIZE={args.optimize}")
    names: list[str] = []
    print(f"{'step':40} {'RSS MiB':>8} {'added':>7}")
    last = 0.0
    for label, module in STEPS:
        if module:
            names.append(module)
        out = subprocess.run(
            [args.python, "-c", PROBE, *names], capture_output=True, text=True, check=True, env=env
        ).stdout
        rss = int(out.split()[-1]) / 1024
        print(f"{label:40} {rss:8.1f} {rss - last:7.1f}")
        last = rss
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
