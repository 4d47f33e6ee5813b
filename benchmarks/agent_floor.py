"""The resident memory a node agent cannot go below: its interpreter and the libraries it needs.

Why it exists: issue 38 holds each agent to the Go helper's footprint. This prints, step by step
in fresh processes, the RSS of the interpreter alone, then with each dependency the agent cannot
do without (gRPC with the kubelet's two servers, TLS, protobuf, structlog, prometheus-client,
pynvml; not PyYAML, which an agent with an in-cluster or JSON configuration never loads), so the
agent's own share (``benchmarks/fleet.py``) can be read against that floor (docs/fleet.md).

Run: ``python benchmarks/agent_floor.py [--python PATH] [--optimize 0|2]`` (e.g. a venv with the
runtime dependencies only, as the container image has; ``PYTHONOPTIMIZE=2`` by default, as the
chart runs the agents).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="the agents' interpreter")
    parser.add_argument(
        "--optimize",
        type=int,
        choices=(0, 2),
        default=2,
        help="PYTHONOPTIMIZE, as the chart runs the agents (default 2)",
    )
    args = parser.parse_args(argv)
    env = {**os.environ, "PYTHONOPTIMIZE": str(args.optimize) if args.optimize else ""}
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
