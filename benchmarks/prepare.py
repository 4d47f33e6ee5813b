"""Prepare latency, bursts and CPU of the kubelet plugin, on the path the kubelet drives.

What it measures, end to end as on a node: the plugin runs as a subprocess on a fake 256-GPU
node (real CDI and checkpoint files with fsync, CDI specs on a tmpfs); the benchmark is the
kubelet — gRPC over the plugin's unix socket, one claim per call, many calls at once for separate
pods — and every prepare GETs its claim from the in-memory API server in another process, over
TLS 1.3 with a client certificate (a throw-away CA, RSA 2048), optionally ``--api-delay-ms``
late. (See ``benchmarks/benchkit.py``.)

As users run it (issue 46), by default: the plugin is installed and started as the container
image and the chart do (``imagekit.py``: a non-editable runtime-only venv, byte-code compiled at
levels 0 and 2, the Dockerfile's ``ENV`` and the chart's ``PYTHONOPTIMIZE`` and log level, the
venv's ``dra-driver`` entry point; ``--dev``: ``python -m dra_driver`` from the tree as before),
and the claims are shaped and sized as a real kube-apiserver's GET answers them (``real-wire/``
of ``../shared/reference``: managedFields, finalizers, reservedFor; without it, small synthetic
claims, labelled so), each with the pod its reservedFor names bound to the node, the agent
publishing and watching its node's pods (so its claim cache, ``dra_driver/slices/claimcache.py``,
and the slice republish are on the measured path; warm runs start once the agent is idle;
``--no-pods``: no pods, ``--no-publish``, as before). Beside it, in the same run, against the
same server: **the floor** (``floorplugin.py``), a minimal plugin that does per claim only the
GET, the CDI spec and a checkpoint, as upstream's Go helper does; every summary figure is given
against it.

Printed as tables:

* bursts of 1, 32, 64 and 256 claims at once (``--sizes``), with the plugin's connection pool
  cold (a plugin just started), warm, and after the server closed idle connections (it closes
  them after ``--idle-s`` seconds, and the burst comes after ``--idle-s`` + 1 s of quiet;
  ``--real-idle``: kube-apiserver's 90 s, and 100 s of quiet), and the floor's warm bursts:
  median wall time of the prepare burst and of the unprepare burst; CPU per claim of the plugin
  (prepare + unprepare, then the prepare burst alone), of the API server and of this process
  (the kubelet's side) during the prepare burst — the last two share the 2 cores with the plugin
  and are the measurement's own overhead; the new TLS connections the server accepted during the
  prepare burst (resumed sessions in brackets);
* one claim at a time for ``--singles`` cycles (≥ 2,000 for a long run), ours and the floor's:
  prepare and unprepare latency percentiles, CPU per prepare + unprepare, the plugin's RSS;
* the same over plain HTTP (one burst size and the single-claim run) for comparison
  (``--plain-singles 0``: skipped);
* a summary of the three figures issues 37 and 46 hold us to (single prepares p50 and p99, 32
  claims at once, warm, over TLS) and CPU per prepare + unprepare: ours, the floor's, ours / the
  floor; the claim GET alone through our client (``--floor-gets``); and upstream's Go helper as
  issue 46 measured it on a real API server (for reference: not the same run).

``--tree`` runs the plugin from another source tree (e.g. an export of ``main``) with this
benchmark's API server and client, for before/after tables.

Run: ``python benchmarks/prepare.py [--singles N] [--rounds N] [--tree DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchkit
import imagekit
from benchkit import REPO, Api, Plugin, claim, pct

GPUS = 256
COLD, WARM, IDLE = "cold", "warm", "after idle"


@dataclass
class Burst:
    prepare_s: list[float] = field(default_factory=list)
    unprepare_s: list[float] = field(default_factory=list)
    cpu_s: float = 0.0
    claims: int = 0
    connections: list[int] = field(default_factory=list)
    resumed: list[int] = field(default_factory=list)
    prepare_cpu_s: float = 0.0  # the plugin's, during the prepare bursts only
    api_cpu_s: float = 0.0  # the API server's, during the prepare bursts
    client_cpu_s: float = 0.0  # this process's (the kubelet's side), during the prepare bursts

    def row(self) -> str:
        per = 1000 / max(1, self.claims)
        conns = f"{statistics.median(self.connections):g}" if self.connections else "-"
        if self.resumed and max(self.resumed):
            conns += f" ({statistics.median(self.resumed):g})"
        return (
            f"{statistics.median(self.prepare_s) * 1000:10.1f} "
            f"{statistics.median(self.unprepare_s) * 1000:10.1f} {self.cpu_s * per:9.2f} "
            f"{self.prepare_cpu_s * per:9.2f} {self.api_cpu_s * per:8.2f} "
            f"{self.client_cpu_s * per:8.2f} {conns:>11}"
        )


def burst(plugin: Plugin, api: Api | None, objs: list[dict[str, Any]], into: Burst) -> None:
    """Prepare ``objs`` at once (one call each), then unprepare them at once; add to ``into``."""
    before = api.stats() if api is not None and api.tls else None
    cpu = plugin.cpu_s()
    api_cpu = api.cpu_s() if api is not None else 0.0
    client_cpu = time.process_time()
    into.prepare_s.append(plugin.burst(objs))
    into.client_cpu_s += time.process_time() - client_cpu
    into.prepare_cpu_s += plugin.cpu_s() - cpu
    into.api_cpu_s += (api.cpu_s() - api_cpu) if api is not None else 0.0
    if before is not None and api is not None:
        after = api.stats()
        into.connections.append(after["connections"] - before["connections"])
        into.resumed.append(after["tlsResumed"] - before["tlsResumed"])
    into.unprepare_s.append(plugin.burst(objs, unprepare=True))
    into.cpu_s += plugin.cpu_s() - cpu
    into.claims += len(objs)


@dataclass
class Singles:
    prepare_s: list[float] = field(default_factory=list)
    unprepare_s: list[float] = field(default_factory=list)
    cpu_s: float = 0.0
    rss_mib: tuple[float, float] = (0.0, 0.0)


def singles(plugin: Plugin, objs: list[dict[str, Any]], cycles: int) -> Singles:
    out = Singles()
    for obj in objs[:50]:  # warm-up: connections, caches
        plugin.prepare([obj])
        plugin.unprepare([obj])
    rss = plugin.rss_mib()
    cpu = plugin.cpu_s()
    for i in range(cycles):
        obj = objs[i % len(objs)]
        out.prepare_s.append(plugin.prepare([obj]))
        out.unprepare_s.append(plugin.unprepare([obj]))
    out.cpu_s = plugin.cpu_s() - cpu
    out.rss_mib = (rss, plugin.rss_mib())
    return out


def claim_gets(kubeconfig: Path, objs: list[dict[str, Any]], count: int) -> list[float]:
    """Wall time of ``count`` claim GETs one after the other, through the client the plugin
    uses (lean transport over TLS), after a warm-up: the floor of a prepare."""
    from dra_driver.kube import client

    kube = client.KubeClient.connect(kubeconfig)
    try:
        for obj in objs[:20]:
            kube.get_resource_claim(obj["metadata"]["namespace"], obj["metadata"]["name"])
        out = []
        for i in range(count):
            meta = objs[i % len(objs)]["metadata"]
            start = time.perf_counter()
            kube.get_resource_claim(meta["namespace"], meta["name"])
            out.append(time.perf_counter() - start)
        return out
    finally:
        kube.close()


# Upstream's Go kubelet-plugin helper, side by side with us on a real v1.36.2 API server over
# TLS (issue 46, the same run as ours there): prepare p50 and p99 (ms), 32 claims at once (s).
# For reference only: the figures that count are against the floor of the same run.
GO_HELPER = (2.47, 40.0, 0.0385)


@dataclass
class Figures:
    """The three figures of one plugin in this run, and its CPU per prepare + unprepare."""

    singles: Singles
    warm32: Burst | None

    def values(self) -> tuple[float, float, float | None, float]:
        p50, p99 = pct(self.singles.prepare_s, 50), pct(self.singles.prepare_s, 99)
        b32 = statistics.median(self.warm32.prepare_s) if self.warm32 else None
        cpu = self.singles.cpu_s / max(1, len(self.singles.prepare_s))
        return p50 * 1000, p99 * 1000, b32, cpu * 1000


def print_summary(ours: Figures, floor: Figures | None, gets: list[float]) -> None:
    """The summary: ours, the same-run floor (``floorplugin.py``), ours against it."""
    print(
        f"{'summary, over TLS':44} {'p50 ms':>8} {'p99 ms':>8} {'32 at once s':>12} {'CPU ms':>7}"
    )

    def row(label: str, values: tuple[float, float, float | None, float]) -> None:
        b32 = f"{values[2]:12.4f}" if values[2] is not None else f"{'-':>12}"
        print(f"{label:44} {values[0]:8.2f} {values[1]:8.2f} {b32} {values[3]:7.2f}")

    mine = ours.values()
    row("  this plugin: prepare", mine)
    if floor is not None:
        base = floor.values()
        row("  the floor: minimal prepare (floorplugin.py)", base)
        ratio = tuple(
            (a / b if a is not None and b else float("nan"))
            for a, b in zip(mine, base, strict=True)
        )
        print(
            f"{'  this plugin / the floor':44} {ratio[0]:7.2f}x {ratio[1]:7.2f}x "
            f"{ratio[2]:11.2f}x {ratio[3]:6.2f}x"
        )
    if gets:
        print(
            f"{'  the claim GET alone (our client)':44} {pct(gets, 50) * 1000:8.2f} "
            f"{pct(gets, 99) * 1000:8.2f} {'-':>12} {'-':>7}"
        )
    go = GO_HELPER
    print(
        f"{'  Go helper, real API server (issue 46)':44} {go[0]:8.2f} {go[1]:8.2f} "
        f"{go[2]:12.4f} {'-':>7}"
    )


def print_singles(title: str, run: Singles) -> None:
    cycles = len(run.prepare_s)
    print(f"{title}, {cycles} cycles    {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for label, values in (("  prepare", run.prepare_s), ("  unprepare", run.unprepare_s)):
        print(
            f"{label:{len(title) + len(str(cycles)) + 11}} "
            + " ".join(f"{pct(values, p) * 1000:8.2f}" for p in (50, 90, 99, 100))
        )
    print(
        f"  CPU per prepare + unprepare {run.cpu_s / cycles * 1000:.2f} ms; "
        f"plugin RSS {run.rss_mib[0]:.1f} -> {run.rss_mib[1]:.1f} MiB"
    )


def settle(plugin: Plugin, most_s: float = 30.0) -> None:
    """Wait until a just-started plugin is idle (under 10 % of a core for 1 s): with pods bound,
    its allocation watch reads every claim they name and the slices are rebuilt meanwhile."""
    deadline = time.monotonic() + most_s
    while time.monotonic() < deadline:
        before = plugin.cpu_s()
        time.sleep(1.0)
        if plugin.cpu_s() - before < 0.1:
            return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--singles", type=int, default=2000, help="one-claim cycles (TLS)")
    parser.add_argument("--plain-singles", type=int, default=500, help="one-claim cycles (HTTP)")
    parser.add_argument("--rounds", type=int, default=5, help="bursts per size, warm pool")
    parser.add_argument("--cold-rounds", type=int, default=3, help="bursts per size, cold/idle")
    parser.add_argument("--sizes", default="1,32,64,256", help="claims at once, comma-separated")
    parser.add_argument("--idle-s", type=float, default=3.0, help="server's idle cut-off (s)")
    parser.add_argument(
        "--real-idle",
        action="store_true",
        help="kube-apiserver's idle cut-off (90 s) and 100 s of quiet before each idle burst "
        "(only the 32-claim burst unless --sizes is given)",
    )
    parser.add_argument("--api-delay-ms", type=float, default=0.0, help="server delay per GET")
    parser.add_argument("--tree", type=Path, default=REPO, help="the plugin's source tree")
    parser.add_argument("--label", default="", help="a name for the tree in the title")
    parser.add_argument(
        "--floor-gets", type=int, default=500, help="claim GETs alone, for the floor (TLS)"
    )
    parser.add_argument(
        "--cdi-on-disk", action="store_true", help="CDI specs on the temp dir's disk, not tmpfs"
    )
    parser.add_argument(
        "--dev",
        action="store_true",
        help="run the plugin as before issue 46: python -m dra_driver from the tree, this "
        "interpreter, no image environment (default: as the image and the chart run it)",
    )
    parser.add_argument(
        "--bytecode",
        choices=("image", "pip"),
        default="image",
        help="the venv's byte-code: the image's (levels 0 and 2) or pip's alone (level 0)",
    )
    parser.add_argument(
        "--synthetic-claims",
        action="store_true",
        help="the old small claim bodies instead of the real server's shape (real-wire/)",
    )
    parser.add_argument("--no-floor", action="store_true", help="skip the floor plugin's run")
    parser.add_argument(
        "--no-pods",
        action="store_true",
        help="no pods bound for the claims, the agent run with --no-publish (before issue 46)",
    )
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    idle_sizes = sizes
    if args.real_idle:
        args.idle_s = 90.0
        if "--sizes" not in " ".join(argv or sys.argv):
            idle_sizes = [32]
    quiet_s = args.idle_s + (10.0 if args.real_idle else 1.0)
    # The keep-alive interval for plugins that have one (kube-apiserver: 90 s cut-off, plugin
    # default 30 s): a third of the cut-off. Older trees ignore the variable.
    env = {"API_KEEPALIVE": f"{args.idle_s / 3:g}"}

    image = None if args.dev else imagekit.runtime_venv(args.tree, bytecode=args.bytecode)
    template = None if args.synthetic_claims else benchkit.real_claim_template()
    if template is not None:
        objs = [benchkit.real_claim(template, f"c-{i}", f"gpu-{i}") for i in range(GPUS)]
        bodies = "real-shaped (real-wire/: managedFields, finalizers, reservedFor)"
    else:
        objs = [claim(f"c-{i}", f"gpu-{i}") for i in range(GPUS)]
        bodies = "SYNTHETIC (small, no managedFields)" + (
            "" if args.synthetic_claims else ": ../shared/reference/real-wire is MISSING"
        )
    base = Path(tempfile.mkdtemp(prefix="dra-bench-", dir="/tmp"))
    profile = benchkit.make_node(base, GPUS)
    claims_file = base / "claims.json"
    pods = [] if args.no_pods or template is None else [benchkit.bound_pod(o) for o in objs]
    claims_file.write_text(json.dumps(objs + pods))
    cdi = benchkit.cdi_root(base, args.cdi_on_disk)
    apis: list[Api] = []
    bursts: dict[tuple[str, int], Burst] = {}
    try:
        tls = Api(base, claims_file, delay_ms=args.api_delay_ms, name="tls")
        tls_idle = Api(
            base, claims_file, delay_ms=args.api_delay_ms, idle_timeout_s=args.idle_s, name="idle"
        )
        plain = Api(base, claims_file, tls=False, delay_ms=args.api_delay_ms, name="plain")
        apis += [tls, tls_idle, plain]

        def plugin(api: Api, label: str, floor: bool = False) -> Plugin:
            started = Plugin(
                base,
                api.kubeconfig,
                profile,
                cdi=cdi,
                tree=args.tree,
                env=env,
                label=label,
                image=image,
                floor=floor,
                publish=bool(pods),
            )
            if pods and not floor and label != "cold":  # its watch reads its pods' claims
                settle(started)
            return started

        for _ in range(args.cold_rounds):  # a plugin just started: its first burst
            for n in sizes:
                p = plugin(tls, "cold")
                try:
                    burst(p, tls, objs[:n], bursts.setdefault((COLD, n), Burst()))
                finally:
                    p.stop()
        p = plugin(tls, "warm")
        try:
            burst(p, tls, objs[:32], Burst())  # warm-up
            for _ in range(args.rounds):
                for n in sizes:
                    burst(p, tls, objs[:n], bursts.setdefault((WARM, n), Burst()))
            long_tls = singles(p, objs, args.singles)
            rss_agent = p.rss_mib()
        finally:
            p.stop()
        floor_run: Figures | None = None
        if not args.no_floor:  # the same bursts and singles, the minimal plugin
            p = plugin(tls, "floor", floor=True)
            try:
                burst(p, tls, objs[:32], Burst())  # warm-up
                for _ in range(args.rounds):
                    for n in sizes:
                        burst(p, tls, objs[:n], bursts.setdefault(("floor", n), Burst()))
                floor_run = Figures(singles(p, objs, args.singles), bursts.get(("floor", 32)))
            finally:
                p.stop()
        floor = claim_gets(tls.kubeconfig, objs, args.floor_gets)
        if args.cold_rounds > 0:
            p = plugin(tls_idle, "idle")
            try:
                burst(p, tls_idle, objs[:32], Burst())  # warm-up
                for _ in range(args.cold_rounds):
                    for n in idle_sizes:
                        time.sleep(quiet_s)
                        burst(p, tls_idle, objs[:n], bursts.setdefault((IDLE, n), Burst()))
            finally:
                p.stop()
        plain_burst, long_plain = Burst(), None
        if args.plain_singles > 0:
            p = plugin(plain, "plain")
            try:
                burst(p, None, objs[:32], Burst())  # warm-up
                for _ in range(args.rounds):
                    burst(p, None, objs[:32], plain_burst)
                long_plain = singles(p, objs, args.plain_singles)
            finally:
                p.stop()
    finally:
        for api in apis:
            api.stop()
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(cdi, ignore_errors=True)

    tree = args.label or (str(args.tree) if args.tree != REPO else "this tree")
    print(
        f"kubelet plugin prepare benchmark, plugin from {tree}: {os.cpu_count()} CPUs, "
        f"CDI specs on {benchkit.fs_type(cdi)}, API delay {args.api_delay_ms:g} ms"
    )
    where = imagekit.chart_metadata_dir(args.tree)
    print(
        "claim metadata files: "
        + (f"beside the CDI specs (the chart's metadataDir {where})" if where else "plugin dir")
    )
    if image is not None:
        envs = " ".join(f"{k}={v}" for k, v in sorted(imagekit.image_env(args.tree).items()))
        print(
            f"run as the image runs it: {imagekit.agent_command(image)[0]} (non-editable "
            f"runtime venv, byte-code: {args.bytecode}), log level "
            f"{imagekit.chart_log_level(args.tree)}, {envs}"
        )
    else:
        print("run as a checkout (--dev): python -m dra_driver, PYTHONPATH, this interpreter")
    size = len(json.dumps(objs[0], separators=(",", ":")))
    print(
        f"a bound pod per claim, the agent publishing and watching its node's pods ({len(pods)} "
        "pods; warm runs wait until the agent is idle: its watch has read their claims)"
        if pods
        else "no pods, the agent run with --no-publish (its claim cache unused)"
    )
    print(f"claim bodies: {bodies}, ~{size} bytes each; load average {os.getloadavg()[0]:.1f}")
    print(
        f"API over TLS 1.3 + client certificate (RSA 2048); server closes idle connections "
        f"after {args.idle_s:g} s, idle bursts after {quiet_s:g} s of quiet"
    )
    print(
        f"{'claims at once (1 per call)':30} {'prepare':>10} {'unprepare':>10} {'CPU/claim':>9} "
        f"{'prep. CPU':>9} {'API CPU':>8} {'kubelet':>8} {'new conns':>11}"
    )
    print(
        f"{'  median of rounds, ms':30} {'wall ms':>10} {'wall ms':>10} {'ms':>9} {'ms':>9} "
        f"{'ms':>8} {'CPU ms':>8} {'(resumed)':>11}"
    )
    for state in (COLD, WARM, IDLE, "floor"):
        for n in sizes:
            if (state, n) in bursts:
                print(f"{f'  {n:>3} claims, {state}':30} " + bursts[(state, n)].row())
    warm32, idle32 = bursts.get((WARM, 32)), bursts.get((IDLE, 32))
    if warm32 and idle32:
        ratio = statistics.median(idle32.prepare_s) / statistics.median(warm32.prepare_s)
        print(f"  32 at once after idle / warm: {ratio:.2f}x")
    print()
    print_singles("one claim at a time (TLS)", long_tls)
    print(f"  plugin RSS at the end of the warm run: {rss_agent:.1f} MiB")
    if floor_run is not None:
        print_singles("the floor, one claim at a time (TLS)", floor_run.singles)
    if long_plain is not None:
        print()
        print(f"plain HTTP (no TLS), for comparison, {args.rounds} rounds")
        print(f"{f'  {32:>3} claims, {WARM}':30} " + plain_burst.row())
        print_singles("one claim at a time (HTTP)", long_plain)
    print()
    print_summary(Figures(long_tls, bursts.get((WARM, 32))), floor_run, floor)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
