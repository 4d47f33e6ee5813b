"""Topology in a burst: how often the generated claim gets an optimal GPU set when a job's pods
arrive together, on the path users run.

Why it exists: the set ranks (docs/topology.md) are only as good as the agent's knowledge of
what is free. This runs, per profile and design:

* the real agent process (``dra-driver kubelet-plugin --fake P``) publishing to the fake API
  server over HTTP;
* a scheduler: the project's emulation of the 1.36 allocator (:mod:`dra_driver.allocation`)
  allocating pods in arrival order at ``--rate`` pods/s on the slices the agent has published at
  that instant, writing each claim's ``status.allocation`` and then binding its pod
  (``spec.nodeName``), as kube-scheduler's PreBind and Bind do;
* a kubelet stand-in (:mod:`dra_driver.testing.kubeletsim`) preparing each claim a random delay
  (``--delay``, default 0.1-3 s) after its pod was bound.

Each burst is a seeded random sequence of 1/2/4/8-GPU claims (sizes that still fit) until the
node is full; then everything is released and the next burst starts on an empty node. A
multi-GPU claim is *optimal* when its GPUs score (links, same-NUMA pairs, same-root pairs) as the
best set of its size among the GPUs free at its allocation; claims that take every free GPU have
no choice and are not counted. Designs: ``allocation`` (ranks follow allocations: the agent's
default), ``prepare`` (``--watch-allocations=false``: ranks follow prepares only, the design
before), ``plain`` (``--gpu-sets=false`` and ``count: N`` claims).

Also reported, per row: the allocation-to-republish latency (from the claim's allocation
written to the first slice write whose ranks leave its GPUs out; only allocations that needed a
re-rank), the API writes per re-rank (slice creates/updates/deletes per change of the published
ranks) and the time the pool spent with mixed generations (slices of differing
``spec.pool.generation``, or fewer than ``resourceSliceCount`` at the newest; p99 and total).
``--dynamic-mig all`` publishes dgx-h100 in 5 slices; ``--agent-tree DIR`` runs the agent from
another source tree (an export of ``main`` for the figures before).

Run: ``python benchmarks/burst_topology.py [--bursts 6] [--rate 20] [--profiles ...]``.
"""

from __future__ import annotations

import argparse
import heapq
import os
import random
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dra_driver.allocation import allocator, claimgen, simulator  # noqa: E402
from dra_driver.devices import fake, gpusets, model, topology  # noqa: E402
from dra_driver.devices.fake import profiles  # noqa: E402
from dra_driver.driver import claims  # noqa: E402
from dra_driver.kube.objects import PODS  # noqa: E402
from dra_driver.testing.fakeapi import fakeserver, memory  # noqa: E402
from dra_driver.testing.fakeapi.memstate import WRITE_METHODS  # noqa: E402
from dra_driver.testing.kubeletsim import KubeletSim, PluginProcess  # noqa: E402

NODE = "n1"
DRIVER = "gpu.nvidia.com"
NAMESPACE = "bench"
PROFILES = ("dgx-1-v100", "hgx-16-mesh", "dgx-h100", "h100-nvl-pairs")
DESIGNS = {
    "allocation": [],
    "prepare": ["--watch-allocations=false"],
    "plain": ["--gpu-sets=false"],
}
SIZES = (1, 2, 4, 8)


class SliceLog:
    """Follows the node's slices in-process (the fake API's own watch): the GPUs the published
    ranks leave out, rank changes, mixed-generation windows, and allocation latencies."""

    def __init__(self, mem: memory.InMemoryApi) -> None:
        self._mem = mem
        self._lock = threading.Lock()
        self._slices: dict[str, dict[str, Any]] = {}
        self.zero: frozenset[str] = frozenset()  # GPUs whose every rank is 0
        self.ranks: tuple[Any, ...] = ()
        self.rank_changes = 0
        self._mixed_since: float | None = None
        self._complete = False  # whether the pool was ever complete
        self.mixed: list[float] = []  # seconds per mixed-generation window
        self._pending: list[tuple[float, frozenset[str]]] = []
        self.latencies: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(3.0)

    def expect(self, when: float, gpus: frozenset[str]) -> None:
        """Time the republish that leaves ``gpus`` out of the ranks (if they are in now)."""
        with self._lock:
            if not gpus <= self.zero:
                self._pending.append((when, gpus))

    @property
    def complete(self) -> bool:
        """Whether the node's pool was ever complete (published)."""
        return self._complete

    def unseen(self) -> int:
        with self._lock:
            return len(self._pending)

    def forget(self) -> None:
        with self._lock:
            self._pending.clear()

    def _run(self) -> None:
        rv = ""
        while not self._stop.is_set():
            events = self._mem.watch_resource_slices(
                driver=DRIVER, node_name=NODE, resource_version=rv, timeout_s=0.5
            )
            for event in events:
                now = time.monotonic()
                meta = event.object["metadata"]
                rv = str(meta.get("resourceVersion") or rv)
                with self._lock:
                    if event.type == "DELETED":
                        self._slices.pop(meta["name"], None)
                    elif event.type in ("ADDED", "MODIFIED"):
                        self._slices[meta["name"]] = event.object
                    self._update(now)

    def _update(self, now: float) -> None:
        pools = [s["spec"]["pool"] for s in self._slices.values()]
        generations = {int(p.get("generation") or 0) for p in pools}
        newest = max(generations, default=0)
        at_newest = sum(1 for p in pools if int(p.get("generation") or 0) == newest)
        wanted = max((int(p.get("resourceSliceCount") or 1) for p in pools), default=1)
        mixed = len(generations) > 1 or at_newest < wanted
        if not mixed:
            self._complete = True
        if not self._complete:
            return  # the first publication, slice after slice: not a re-rank
        if mixed and self._mixed_since is None:
            self._mixed_since = now
        elif not mixed and self._mixed_since is not None:
            self.mixed.append(now - self._mixed_since)
            self._mixed_since = None
        if mixed:
            return  # the scheduler sees no device of an incomplete pool
        ranks: dict[str, tuple[int, ...]] = {}
        for s in self._slices.values():
            for d in s["spec"].get("devices") or ():
                found = sorted(
                    (k, v["int"]) for k, v in d["attributes"].items() if k.startswith("setRank")
                )
                if found:
                    ranks[d["name"]] = tuple(v for _, v in found)
        vector = tuple(sorted(ranks.items()))
        if vector != self.ranks:
            self.rank_changes += 1
            self.ranks = vector
        self.zero = frozenset(n for n, r in ranks.items() if not any(r))
        keep = []
        for when, gpus in self._pending:
            if gpus <= self.zero:
                self.latencies.append(now - when)
            else:
                keep.append((when, gpus))
        self._pending = keep


class Kubelet:
    """Prepares each claim at its due time, in its own thread (like the kubelet's pod workers,
    several at once)."""

    def __init__(self, sim: KubeletSim) -> None:
        self._sim = sim
        self._due: list[tuple[float, int, claims.ClaimRef]] = []
        self._cond = threading.Condition()
        self._seq = 0
        self.errors: list[str] = []
        self.prepared = 0
        self._stop = False
        self._busy = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def prepare_at(self, when: float, ref: claims.ClaimRef) -> None:
        with self._cond:
            self._seq += 1
            heapq.heappush(self._due, (when, self._seq, ref))
            self._cond.notify()

    def idle(self) -> bool:
        with self._cond:
            return not self._due and self._busy == 0

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stop and (not self._due or self._due[0][0] > time.monotonic()):
                    self._cond.wait(self._due[0][0] - time.monotonic() if self._due else None)
                if self._stop:
                    return
                _, _, ref = heapq.heappop(self._due)
                self._busy += 1
            threading.Thread(target=self._prepare, args=(ref,), daemon=True).start()

    def _prepare(self, ref: claims.ClaimRef) -> None:
        try:
            error = self._sim.prepare([ref]).claims[ref.uid].error
            if error:
                self.errors.append(error)
        finally:
            with self._cond:
                self._busy -= 1
                self.prepared += 1

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()


def draw(rng: random.Random, gpus: int) -> list[int]:
    """Claim sizes in random order until ``gpus`` GPUs are taken (each size still fits)."""
    sizes, free = [], gpus
    while free:
        size = rng.choice([s for s in SIZES if s <= free])
        sizes.append(size)
        free -= size
    return sizes


def wait(condition: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def run_design(
    profile: str, design: str, args: argparse.Namespace, devices: model.NodeDevices
) -> dict[str, Any]:
    rng = random.Random(f"{args.seed}-{profile}")  # the same bursts for every design
    gpus = gpusets.eligible(devices)
    topo = topology.build(devices)
    classes = simulator.builtin_classes()
    gpusets.ranked(devices)  # the rank-key tables, built once (~0.4 s for 16 GPUs), not mid-burst
    base = Path(tempfile.mkdtemp(prefix="burst-", dir="/tmp"))
    mem = memory.InMemoryApi(use_default_cel=False)
    mem.put_node(NODE, uid="uid-" + NODE)
    mem.put_namespace(NAMESPACE)
    # The agent reads Pods only as NODE: its own token reads none outside its namespace (chart).
    server = fakeserver.FakeApiServer(mem, bound_node=NODE, pod_namespaces=("dra-driver",)).start()
    warm = _pod("warm-up")  # the fake server builds its Pod schema validator on first use
    warm["spec"]["nodeName"] = "elsewhere"
    mem.objects.create(PODS, warm)
    mem.objects.delete(PODS, "warm-up", namespace=NAMESPACE)
    extra = [*DESIGNS[design], *(["--dynamic-mig", args.dynamic_mig] if args.dynamic_mig else [])]
    agent = PluginProcess(
        base=base,
        kubeconfig=server.write_kubeconfig(base / "kubeconfig"),
        node=NODE,
        fake=profile,
        publish=True,
        extra=extra,
    )
    log = SliceLog(mem)
    row: dict[str, Any] = {"profile": profile, "design": design}
    counted = optimal = unplaced = 0
    writes = 0
    try:
        agent.start()
        agent.wait_ready(60)
        log.start()
        sim = KubeletSim(agent.registry_dir)
        sim.register(DRIVER)
        kubelet = Kubelet(sim)
        if not wait(lambda: log.complete and (bool(log.ranks) or design == "plain"), 30):
            raise RuntimeError(f"{profile}/{design}: no slices published:\n{agent.log()[-3000:]}")
        empty_ranks = log.ranks
        for burst in range(args.bursts):
            wait(lambda: log.unseen() == 0, 1.0)
            log.forget()
            before = sum(1 for c in mem.calls if c.method in WRITE_METHODS)
            changes = log.rank_changes
            live: list[tuple[claims.ClaimRef, str, frozenset[str]]] = []
            last = time.monotonic() - 1 / args.rate
            for i, size in enumerate(draw(rng, len(gpus))):
                pause = last + 1 / args.rate - time.monotonic()  # never faster than the rate
                if pause > 0:
                    time.sleep(pause)
                last = time.monotonic()
                taken = frozenset(g for _, _, held in live for g in held)
                nvlink = "any" if design == "plain" else "best"
                name = f"b{burst}-c{i}-{size}"
                claim = claimgen.claim(size, nvlink=nvlink, name=name, namespace=NAMESPACE)
                current = [s for s in mem.all_resource_slices() if s["spec"].get("nodeName")]
                outcome = allocator.allocate(
                    claim,
                    slices=current,
                    classes=classes,
                    node_name=NODE,
                    allocated={(DRIVER, NODE, g) for g in taken},
                    node_devices=devices,
                )
                if outcome.allocation is None:
                    unplaced += 1
                    continue
                got = frozenset(r["device"] for r in outcome.allocation["devices"]["results"])
                free = [g for g in gpus if g.name not in taken]
                if 2 <= size < len(free):
                    best = gpusets.ranked(devices, taken=taken, max_ranks=1)[size][0].score
                    score = gpusets.set_score(topo, [g.index for g in gpus if g.name in got])
                    counted += 1
                    optimal += score == best
                uid = str(uuid.uuid4())
                mem.put_resource_claim(
                    {
                        "metadata": {"name": name, "namespace": NAMESPACE, "uid": uid},
                        "spec": claim["spec"],
                        "status": {"allocation": outcome.allocation},
                    }
                )
                written = time.monotonic()
                if os.environ.get("BURST_LOG"):
                    print(f"#   {time.time():.3f} allocated {name}: {sorted(got)}", file=sys.stderr)
                if design != "plain":
                    log.expect(written, got)
                mem.objects.create(PODS, _pod(name))
                ref = claims.ClaimRef(uid=uid, namespace=NAMESPACE, name=name)
                kubelet.prepare_at(written + rng.uniform(*args.delay), ref)
                live.append((ref, name, got))
            wait(kubelet.idle, 60)
            wait(lambda: log.unseen() == 0, 5.0)
            row.setdefault("missed", 0)
            row["missed"] += log.unseen()
            writes += sum(1 for c in mem.calls if c.method in WRITE_METHODS) - before
            row["reranks"] = row.get("reranks", 0) + log.rank_changes - changes
            for ref, name, _ in live:
                mem.objects.delete(PODS, name, namespace=NAMESPACE)
                sim.unprepare([ref])
                mem.delete_resource_claim(NAMESPACE, name)
            if design != "plain" and not wait(lambda: log.ranks == empty_ranks, 10):
                raise RuntimeError(f"{profile}/{design}: ranks did not return to the empty node's")
            time.sleep(0.2)
        kubelet.stop()
        row["errors"] = len(kubelet.errors)
    finally:
        log.stop()
        agent.kill()
        if os.environ.get("BURST_LOG"):
            shutil.copy(agent.log_path, os.environ["BURST_LOG"])
        server.stop()
        shutil.rmtree(base, ignore_errors=True)
    row.update(
        counted=counted,
        optimal=optimal,
        unplaced=unplaced,
        latencies=log.latencies,
        writes=writes,
        mixed=log.mixed,
    )
    return row


def _pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "nodeName": NODE,
            "containers": [{"name": "c", "image": "busybox"}],
            "resourceClaims": [{"name": "gpus", "resourceClaimName": name}],
        },
    }


def pct(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profiles", nargs="+", default=list(PROFILES))
    parser.add_argument("--designs", nargs="+", default=list(DESIGNS), choices=list(DESIGNS))
    parser.add_argument("--bursts", type=int, default=6, help="bursts per profile and design")
    parser.add_argument("--rate", type=float, default=20.0, help="pods allocated per second")
    parser.add_argument(
        "--delay",
        type=float,
        nargs=2,
        default=(0.1, 3.0),
        metavar=("MIN", "MAX"),
        help="seconds from binding to prepare (uniform)",
    )
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--dynamic-mig", default="", help="the agent's --dynamic-mig (e.g. all)")
    parser.add_argument("--agent-tree", type=Path, help="run the agent from this source tree")
    args = parser.parse_args()
    if args.agent_tree:
        os.environ["PYTHONPATH"] = str(args.agent_tree.resolve())
        # The agent runs as ``python -m dra_driver``, which puts the working directory first on
        # its path: from inside this checkout it would run the checkout, not the tree.
        os.chdir(args.agent_tree.resolve())
    print(
        f"# {args.bursts} bursts per row at {args.rate:g} pods/s, prepare "
        f"{args.delay[0]:g}-{args.delay[1]:g} s after binding, seed {args.seed}"
        + (f", --dynamic-mig {args.dynamic_mig}" if args.dynamic_mig else "")
        + (f", agent from {args.agent_tree}" if args.agent_tree else "")
    )
    print(
        "| profile | design | multi-GPU claims with a choice | optimal | alloc→republish "
        "p50 / p99 ms (n, missed) | writes per re-rank | mixed-generation window p99 ms "
        "(windows, total ms) |"
    )
    print("|---|---|---|---|---|---|---|")
    for profile in args.profiles:
        devices = fake.FakeBackend(profiles.load_builtin(profile)).discover()
        for design in args.designs:
            row = run_design(profile, design, args, devices)
            share = 100.0 * row["optimal"] / row["counted"] if row["counted"] else float("nan")
            lat = row["latencies"]
            latency = (
                "—"
                if design == "plain"
                else f"{1000 * pct(lat, 0.5):.0f} / {1000 * pct(lat, 0.99):.0f} "
                f"({len(lat)}, {row.get('missed', 0)})"
            )
            reranks = row.get("reranks", 0)
            per = f"{row['writes'] / reranks:.2f}" if reranks else "—"
            mixed = row["mixed"]
            window = (
                f"{1000 * pct(mixed, 0.99):.0f} ({len(mixed)}, {1000 * sum(mixed):.0f})"
                if mixed
                else "0 (0, 0)"
            )
            print(
                f"| {profile} | {design} | {row['counted']} | {share:.1f} % | {latency} | "
                f"{per} | {window} |",
                flush=True,
            )
            if row.get("errors") or row["unplaced"]:
                print(f"#   {row.get('errors')} prepare errors, {row['unplaced']} unplaced")
    return 0


if __name__ == "__main__":
    sys.exit(main())
