"""Where one node agent's resident memory goes, run as the image and the chart run it (issue 46).

Why it exists: ``fleet.py`` gives the RSS p50 of a fleet, ``agent_floor.py`` the floor of the
interpreter and the libraries; neither says what the rest is. This starts the fake API server
(TLS, as ``fleet.py`` does) and ``--agents`` agents (``kubelet-plugin --fake PROFILE``) from the
image's venv (``imagekit.py``: runtime dependencies only, the image's byte-code and environment,
the chart's ``PYTHONOPTIMIZE``), waits for each to publish, lets them settle, and prints per
agent its RSS, its threads and the RSS by kind of mapping from ``/proc/PID/smaps``: the heap
(``[heap]`` and anonymous memory: Python objects, malloc arenas, thread stacks), each shared
library (``libpython``, grpc's C core, OpenSSL, protobuf's upb) and the byte-code files.

Run: ``python benchmarks/agent_rss.py [--agents N] [--profile dgx-h100] [--settle-s 10]
[--optimize 0|2] [--bytecode image|pip] [--env KEY=VALUE ...]``; the numbers are for one
machine at one moment: compare runs of the same invocation, not with a remembered figure.
"""

from __future__ import annotations

import argparse
import collections
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fleetkit
import imagekit


def smaps(pid: int) -> dict[str, float]:
    """RSS (MiB) of the process by mapping kind: anonymous memory, each file's name."""
    kinds: dict[str, float] = collections.defaultdict(float)
    name = ""
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if not fields:
            continue
        if not fields[0].endswith(":") or "-" in fields[0]:
            name = fields[5] if len(fields) > 5 else "[anon]"
            if name.startswith("/"):
                name = Path(name).name
                if name.endswith(".so") or ".so." in name or ".cpython-" in name:
                    name = name.split(".cpython-")[0].split(".so")[0]
        elif fields[0] == "Rss:":
            kinds[name] += int(fields[1]) / 1024
    return dict(kinds)


def threads(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/task").iterdir()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--profile", default="dgx-h100")
    parser.add_argument("--settle-s", type=float, default=10.0)
    parser.add_argument("--optimize", type=int, choices=(0, 2), default=imagekit.chart_optimize())
    parser.add_argument("--bytecode", choices=("image", "pip"), default="image")
    parser.add_argument("--tree", type=Path, default=fleetkit.REPO)
    parser.add_argument(
        "--env", action="append", default=[], help="KEY=VALUE added to the agents' environment"
    )
    parser.add_argument("--top", type=int, default=12, help="mappings shown")
    args = parser.parse_args(argv)
    venv = imagekit.runtime_venv(args.tree.resolve(), bytecode=args.bytecode)
    extra = dict(item.split("=", 1) for item in args.env)
    base = Path(tempfile.mkdtemp(prefix="agent-rss-"))
    nodes = [f"rss-{i}" for i in range(args.agents)]
    group = 0
    server = fleetkit.FakeServer(base, nodes, group=group)
    agents = [
        fleetkit.Agent(
            base / n,
            n,
            args.profile,
            server.kubeconfig,
            group,
            image=venv,
            tree=args.tree.resolve(),
            optimize=args.optimize,
        )
        for n in nodes
    ]
    if extra:
        original = imagekit.process_env

        def with_extra(*a: object, **kw: object) -> dict[str, str]:
            return {**original(*a, **kw), **extra}  # type: ignore[arg-type]

        imagekit.process_env = with_extra
    try:
        for agent in agents:
            agent.start(str(uuid.uuid4()))
        deadline = time.monotonic() + 180
        while any(a.publishes() < 1 for a in agents):
            if time.monotonic() > deadline or not all(a.alive() for a in agents):
                raise SystemExit(f"an agent did not publish; logs under {base}")
            time.sleep(0.5)
        time.sleep(args.settle_s)
        rows = []
        for agent in agents:
            assert agent.proc is not None
            rows.append((agent.rss_mib(), threads(agent.proc.pid), smaps(agent.proc.pid)))
        env = imagekit.image_env(args.tree, optimize=args.optimize) | extra
        print(f"{args.agents} x {args.profile}, " + " ".join(f"{k}={v}" for k, v in env.items()))
        rss = [r[0] for r in rows]
        print(
            f"RSS MiB p50 {statistics.median(rss):.1f}  each " + " ".join(f"{r:.1f}" for r in rss)
        )
        print(f"threads {rows[0][1]}")
        total: dict[str, float] = collections.defaultdict(float)
        for _, _, kinds in rows:
            for name, value in kinds.items():
                total[name] += value
        print(f"{'mapping (mean over agents)':40} {'RSS MiB':>8}")
        ranked = sorted(total.items(), key=lambda kv: -kv[1])
        for name, value in ranked[: args.top]:
            print(f"{name[:40]:40} {value / len(rows):8.2f}")
        rest = sum(v for _, v in ranked[args.top :]) / len(rows)
        print(f"{'(the rest)':40} {rest:8.2f}")
    finally:
        for agent in agents:
            agent.stop(signal.SIGTERM, timeout_s=10)
        server.proc.terminate()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
