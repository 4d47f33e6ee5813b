"""A fleet of node agents on one API server: start-up, idle, an API outage, restarts.

Why it exists: operators run one agent per GPU node — hundreds to thousands against one API
server, started all at once by a DaemonSet rollout — so each agent's footprint and the load the
fleet puts on the server are what matter at scale. This runs ``--agents`` real agent processes
(``dra-driver kubelet-plugin --fake P``, mixed profiles, each with its own node name, pod UID and
directories) against the project's fake API server over HTTPS (``fleetkit.py``), or against any
cluster with ``--kubeconfig``, through these phases:

* ``cold``: all agents started at once; until every node's slices are published (each agent's
  first successful pass on its ``/metrics``, and the node's pool complete on the server);
* ``idle``: ``--idle-s`` seconds of nothing (default 300): requests, slice writes, CPU;
* ``outage`` (fake server only: it needs the server stopped and restarted with its store):
  the server down ``--outage-s`` seconds (default 30), then back; until every agent has opened
  its watch again;
* ``rolling``: a seamless restart of every agent, ``--roll-batch`` at a time: the new instance
  (new pod UID) starts beside the old one, which then gets SIGTERM; until each new one has
  published;
* ``kill``: one agent SIGKILLed and started again (a container restart: same pod UID).

Per phase: requests by verb and resource (dry-run apart) and their bytes (fake server), the
time until every node's slices are current, RSS per agent (p50/max, at the phase's end), CPU
seconds per agent, slice writes and slices re-created (UID changed) or gone. The run is bounded
(every wait has a limit; a watchdog ends it) and every process it starts is in one process
group, killed on exit. The agents run as the chart runs them, with ``PYTHONOPTIMIZE=2``
(``--optimize``), and their modules (the tree's, the interpreter's site-packages and standard
library) are compiled to bytecode at that level first, as the container image's are
(docs/fleet.md).

Run: ``python benchmarks/fleet.py --agents 100`` (develop with ``--agents 10 --idle-s 20``).
"""

from __future__ import annotations

import argparse
import atexit
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fleetkit
import imagekit
from fleetkit import Agent, pct

PROFILES = "dgx-h100,pcie-l4,h100-nvl-pairs,dgx-1-v100,a100-mig,hgx-16-mesh"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--profiles", default=PROFILES, help="fake profiles, used in turn")
    parser.add_argument("--idle-s", type=float, default=300.0)
    parser.add_argument("--outage-s", type=float, default=30.0)
    parser.add_argument("--settle-s", type=float, default=10.0, help="counted after each wait")
    parser.add_argument("--phase-timeout-s", type=float, default=300.0)
    parser.add_argument("--roll-batch", type=int, default=0, help="default: a tenth of the agents")
    parser.add_argument("--phases", default="cold,idle,outage,rolling,kill")
    parser.add_argument("--kubeconfig", type=Path, default=None, help="a real cluster")
    parser.add_argument(
        "--tree", type=Path, default=fleetkit.REPO, help="source tree the agents run from"
    )
    parser.add_argument(
        "--agent-python",
        default=sys.executable,
        help="interpreter of the agents (e.g. a venv with the runtime dependencies only)",
    )
    parser.add_argument(
        "--optimize",
        type=int,
        choices=(0, 2),
        default=imagekit.chart_optimize(),
        help="the agents' PYTHONOPTIMIZE (default: the chart's python.optimize, 2)",
    )
    parser.add_argument(
        "--dev",
        action="store_true",
        help="run the agents as before issue 46: python -m dra_driver from --tree with "
        "--agent-python (default: as the image and the chart run them, imagekit.py)",
    )
    parser.add_argument(
        "--bytecode",
        choices=("image", "pip"),
        default="image",
        help="the image venv's byte-code: the image's (levels 0 and 2) or pip's alone (level 0)",
    )
    args = parser.parse_args(argv)
    phases = [p for p in args.phases.split(",") if p]
    if args.kubeconfig is not None and "outage" in phases:
        print("outage phase skipped: it needs the fake API server (stopped and restarted)")
        phases.remove("outage")
    budget = len(phases) * (args.phase_timeout_s + args.settle_s) + args.idle_s + args.outage_s
    budget += 120 + (args.agents // max(1, args.roll_batch or args.agents // 10)) * 60
    base = Path(tempfile.mkdtemp(prefix="fleet-"))
    holder = subprocess.Popen(["sleep", str(int(budget) + 60)], process_group=0)
    group = holder.pid
    cleanup = _cleanup(group, base)
    atexit.register(cleanup)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sys.exit(130))
    watchdog = threading.Timer(
        budget, lambda: (print("watchdog: out of time"), cleanup(), os._exit(3))
    )
    watchdog.daemon = True
    watchdog.start()
    nodes = [f"fleet-{i:03d}" for i in range(args.agents)]
    server: Any = (
        fleetkit.ClusterServer(args.kubeconfig)
        if args.kubeconfig
        else fleetkit.FakeServer(base, nodes, group=group)
    )
    profiles = [p for p in args.profiles.split(",") if p]
    image = None
    if args.dev:
        compile_bytecode(args.agent_python, args.tree.resolve(), args.optimize)
    else:
        image = imagekit.runtime_venv(args.tree.resolve(), bytecode=args.bytecode)
    print(describe(image, args), flush=True)
    agents = [
        Agent(
            base / f"a{i:03d}",
            node,
            profiles[i % len(profiles)],
            server.kubeconfig,
            group,
            tree=args.tree.resolve(),
            python=args.agent_python,
            optimize=args.optimize,
            image=image,
        )
        for i, node in enumerate(nodes)
    ]
    bench = Bench(server, agents, args)
    rows = [bench.run(phase) for phase in phases]
    print_tables(rows, len(agents), fake=args.kubeconfig is None)
    print_checks(rows, len(agents))
    return 0


def describe(image: Path | None, args: argparse.Namespace) -> str:
    """How the agents run, for the first line of the output."""
    if image is None:
        return (
            f"agents run as a checkout (--dev): {args.agent_python} -m dra_driver, "
            f"PYTHONPATH={args.tree}, PYTHONOPTIMIZE={args.optimize}, MALLOC_ARENA_MAX=2"
        )
    env = imagekit.image_env(args.tree, optimize=args.optimize)
    return (
        f"agents run as the image runs them: {imagekit.agent_command(image)[0]} (non-editable "
        f"runtime venv, byte-code: {args.bytecode}), "
        + " ".join(f"{k}={v}" for k, v in sorted(env.items()))
    )


def compile_bytecode(python: str, tree: Path, optimize: int) -> None:
    """Bytecode at the agents' optimization level, as the container image has it: run with
    PYTHONDONTWRITEBYTECODE, a module without its .pyc is compiled at every agent's start (~0.4 s
    of CPU for the tree alone, and memory the agent keeps). The tree must compile; the
    interpreter's own folders are compiled where they can be written."""
    levels = ["-o", "0", "-o", str(optimize)]
    subprocess.run(
        [python, "-m", "compileall", "-q", *levels, "dra_driver"],
        cwd=tree,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    where = "import sysconfig as s; print(s.get_path('stdlib')); print(s.get_path('purelib'))"
    folders = subprocess.run(
        [python, "-c", where], capture_output=True, text=True, check=True
    ).stdout.split()
    skip = ["-x", "/(test|tests|idle_test)/"]
    subprocess.run(
        [python, "-m", "compileall", "-q", "-j", "0", *levels, *skip, *folders],
        check=False,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


class Bench:
    def __init__(self, server: Any, agents: list[Agent], args: argparse.Namespace) -> None:
        self.server, self.agents, self.args = server, agents, args
        self.uids: dict[str, list[str]] = {}

    def run(self, phase: str) -> dict[str, Any]:
        before = self.server.ask("stats")
        cpu_before = self._cpu()
        began = time.monotonic()
        current = getattr(self, f"_{phase}")()
        time.sleep(self.args.settle_s if phase != "idle" else 0)
        wall = time.monotonic() - began
        after = self.server.ask("stats")
        cpu = self._cpu() - cpu_before
        live = [a for a in self.agents if a.alive()]
        rss = [a.rss_mib() for a in live]
        row = {
            "phase": phase,
            "wall": wall,
            "current": current,
            "requests": fleetkit.requests_between(before["requests"], after["requests"]),
            "rss": rss,
            "cpu": cpu,
            "recreated": self._recreated(before["nodes"], after["nodes"]),
            "idle_cpu": getattr(self, "idle_cpu", None) if phase == "idle" else None,
        }
        if phase == "idle":
            row["current"] = "-"
        print(f"# {phase}: {wall:.1f} s, current after {_s(row['current'])}", flush=True)
        return row

    # ------------------------------------------------------------------ phases
    def _cold(self) -> float | None:
        began = time.monotonic()
        for agent in self.agents:
            agent.start(str(uuid.uuid4()))
        return self._published(self.agents, began)

    def _idle(self) -> float | None:
        live = [a for a in self.agents if a.alive()]
        start = {a.node: a.cpu_s() for a in live}
        time.sleep(self.args.idle_s)
        self.idle_cpu = [
            100 * (a.cpu_s() - start[a.node]) / self.args.idle_s for a in live if a.alive()
        ]
        return None

    def _outage(self) -> float | None:
        self.server.ask("down")
        time.sleep(self.args.outage_s)
        up = self.server.ask("up")["up"]
        began = time.monotonic()

        def watching() -> bool:
            nodes = self.server.ask("stats")["nodes"]
            return all(n["complete"] and n["lastWatch"] > up for n in nodes.values())

        return self._until(watching, began)

    def _rolling(self) -> float | None:
        batch = self.args.roll_batch or max(1, len(self.agents) // 10)
        began = time.monotonic()
        for first in range(0, len(self.agents), batch):
            olds = self.agents[first : first + batch]
            news = [a.successor() for a in olds]
            for new in news:
                new.start(str(uuid.uuid4()))
            if self._until(lambda b=news: all(n.registered() for n in b), time.monotonic()) is None:
                print("# rolling: new instances did not register in time", flush=True)
            for old in olds:
                old.send(signal.SIGTERM)
            for old in olds:
                old.stop()
            self.agents[first : first + batch] = news
            if self._published(news, time.monotonic()) is None:
                return None
        return time.monotonic() - began

    def _kill(self) -> float | None:
        victim = self.agents[0]
        victim.stop(signal.SIGKILL)
        began = time.monotonic()
        victim.start(victim.pod_uid)  # the container restarted: same pod
        return self._published([victim], began)

    # ------------------------------------------------------------------ waits and figures
    def _published(self, agents: list[Agent], began: float) -> float | None:
        """Until each of ``agents`` reports a successful pass and its node's pool is complete;
        the seconds since ``began`` (None: not within the phase's limit)."""
        pending = {a.node: a for a in agents}

        def done() -> bool:
            for node, agent in list(pending.items()):
                if not agent.alive():
                    raise RuntimeError(f"agent {node} exited; see {agent.log_path}")
                if agent.publishes() >= 1:
                    del pending[node]
            if pending:
                return False
            nodes = self.server.ask("stats")["nodes"]
            return all(nodes.get(a.node, {}).get("complete") for a in agents)

        return self._until(done, began)

    def _until(self, check: Callable[[], bool], began: float) -> float | None:
        deadline = began + self.args.phase_timeout_s
        while time.monotonic() < deadline:
            if check():
                return time.monotonic() - began
            time.sleep(0.5)
        return None

    def _cpu(self) -> float:
        """CPU seconds of the live agents plus of every agent process waited for."""
        waited = resource.getrusage(resource.RUSAGE_CHILDREN)
        live = sum(a.cpu_s() for a in self.agents if a.alive())
        return live + waited.ru_utime + waited.ru_stime

    def _recreated(self, before: dict[str, Any], after: dict[str, Any]) -> int:
        """Slices of a node that existed before and are gone or have a new UID now."""
        return sum(
            len(set(state["uids"]) - set(after.get(node, {}).get("uids", ())))
            for node, state in before.items()
        )


# ---------------------------------------------------------------- output


def print_tables(rows: list[dict[str, Any]], agents: int, *, fake: bool) -> None:
    print(
        f"\nfleet of {agents} agents, {os.cpu_count()} cores, server: "
        f"{'fake (HTTPS, this machine)' if fake else 'real cluster'}\n"
    )
    head = (
        f"{'phase':8} {'wall s':>7} {'current s':>9} {'slice req/agent':>15} {'dry-run/agent':>13}"
        f" {'slice writes':>12} {'re-created':>10} {'all req':>8} {'KiB in':>8} {'KiB out':>8}"
        f" {'RSS p50/max MiB':>16} {'CPU s/agent':>11} {'idle CPU % p50/max':>18}"
    )
    print(head)
    print("-" * len(head))
    for row in rows:
        reqs = row["requests"]
        if reqs is None:
            slice_req = dry = writes = total = kin = kout = "n/a"
        else:
            rs = {k: v for k, v in reqs.items() if k[1] == "resourceslices"}
            slice_req = f"{sum(v['requests'] for k, v in rs.items() if not k[2]) / agents:.2f}"
            dry = f"{sum(v['requests'] for k, v in rs.items() if k[2]) / agents:.2f}"
            writes = str(
                sum(v["requests"] for k, v in rs.items() if not k[2] and k[0] in fleetkit.WRITES)
            )
            total = str(sum(v["requests"] for v in reqs.values()))
            kin = f"{sum(v['bytesIn'] for v in reqs.values()) / 1024:.0f}"
            kout = f"{sum(v['bytesOut'] for v in reqs.values()) / 1024:.0f}"
        rss = row["rss"]
        idle = row["idle_cpu"]
        print(
            f"{row['phase']:8} {row['wall']:7.1f} {_s(row['current']):>9} {slice_req:>15}"
            f" {dry:>13} {writes:>12} {row['recreated']:>10} {total:>8} {kin:>8} {kout:>8}"
            f" {f'{pct(rss, 50):.1f}/{max(rss, default=0):.1f}':>16}"
            f" {row['cpu'] / agents:11.3f}"
            f" {(f'{statistics.median(idle):.3f}/{max(idle):.3f}' if idle else ''):>18}"
        )
    if not fake:
        print(
            "\nrequests: the server's apiserver_request_total (every client of it, not only the"
            " agents; n/a when /metrics may not be read); bytes: n/a"
        )
    print("\nrequests by verb and resource (dry-run apart), all agents:")
    keys = sorted({k for row in rows for k in (row["requests"] or {})})
    print(f"{'verb':8} {'resource':28} " + " ".join(f"{r['phase']:>8}" for r in rows))
    for key in keys:
        verb, res, dry_run = key
        cells = " ".join(
            f"{(r['requests'] or {}).get(key, {}).get('requests', 0):8d}" for r in rows
        )
        print(f"{verb:8} {res + (' (dry-run)' if dry_run else ''):28} {cells}")


def print_checks(rows: list[dict[str, Any]], agents: int) -> None:
    """The issues' acceptance bars (#38; #46's memory bar), each with its figure."""
    by = {row["phase"]: row for row in rows}

    def slice_requests(row: dict[str, Any], writes_only: bool) -> int | None:
        if row["requests"] is None:
            return None
        return sum(
            v["requests"]
            for (verb, res, dry), v in row["requests"].items()
            if res == "resourceslices"
            and (not writes_only or (verb in fleetkit.WRITES and not dry))
        )

    checks: list[tuple[str, bool | None, str]] = []
    if "cold" in by:
        current = by["cold"]["current"]
        ok = isinstance(current, float) and current <= 60
        checks.append(("every node published within 60 s", ok, _s(current)))
        rss = pct(by["cold"]["rss"], 50)
        checks.append(("RSS per agent p50 <= 50 MiB", rss <= 50, f"{rss:.1f} MiB"))
        checks.append(("RSS per agent p50 <= 45 MiB (#46)", rss <= 45, f"{rss:.1f} MiB"))
    if by.get("idle", {}).get("idle_cpu"):
        idle = statistics.median(by["idle"]["idle_cpu"])
        checks.append(("idle CPU per agent <= 0.5 % of a core", idle <= 0.5, f"{idle:.3f} %"))
    for phase in ("idle", "outage"):
        if phase in by:
            writes = slice_requests(by[phase], True)
            ok = None if writes is None else writes == 0
            checks.append((f"0 slice writes ({phase})", ok, str(writes)))
    if "outage" in by:
        total = slice_requests(by["outage"], False)
        per = None if total is None else total / agents
        ok = None if per is None else per <= 5
        checks.append(("<= 5 slice requests per agent on reconnect", ok, f"{per}"))
    gone = sum(row["recreated"] for row in rows)
    checks.append(("no slice deleted or re-created", gone == 0, str(gone)))
    print("\nacceptance (#38):")
    for what, ok, figure in checks:
        verdict = "n/a " if ok is None else ("PASS" if ok else "FAIL")
        print(f"  {verdict}  {what}: {figure}")


def _s(value: float | str | None) -> str:
    if isinstance(value, str):
        return value
    return "timeout" if value is None else f"{value:.1f}"


def _cleanup(group: int, base: Path) -> Callable[[], None]:
    done = threading.Event()

    def run() -> None:
        if done.is_set():
            return
        done.set()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(group, sig)
            except ProcessLookupError:
                break
            time.sleep(2)
        shutil.rmtree(base, ignore_errors=True)

    return run


if __name__ == "__main__":
    raise SystemExit(main())
