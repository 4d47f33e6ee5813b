"""How long ``dra-driver capacity`` takes to answer for a fleet, and what the agent's set-capacity
gauges cost per update.

The fleet: ``--nodes`` fake nodes of 8 GPUs (DGX H100 and DGX-1 in turn; their slices built by
the real slice builder, set ranks of the GPUs left free), about half the GPUs held by seeded
claims of 1, 2 and 4 GPUs (dra_driver/testing/fakefleet.py). The command runs as a process, as
an operator runs it (Python start-up included), the median of ``--repeats`` runs:

* from files: the slices and claims exported as JSON (``kubectl get -o json``) and as YAML;
* from the fake API server over HTTP (``--kubeconfig``; the server in this process, the command
  in its own): two LISTs, every slice and claim of the cluster. The fake server copies and
  encodes every object in Python (a real API server answers from its watch cache): the time
  its two LISTs take alone is printed next to the row.

Then the agent side: one update of the gauges (devices/setcapacity.py) on random holdings, per
profile, mean of ``--updates`` calls. The target: ≤ 5 s for 1,000 nodes on 2 cores.

    python benchmarks/capacity.py                       # 100 and 1,000 nodes
    python benchmarks/capacity.py --nodes 50 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

from dra_driver.devices import fake, setcapacity  # noqa: E402
from dra_driver.testing import fakefleet  # noqa: E402
from dra_driver.testing.fakeapi import fakeserver, memory  # noqa: E402

PROFILES = ("dgx-h100", "dgx-1-v100")
AGENT_PROFILES = ("dgx-h100", "dgx-1-v100", "hgx-16-mesh")
TARGET_S = 5.0


def run_capacity(*args: str) -> tuple[float, dict[str, object]]:
    """Seconds the command took, and its JSON answer."""
    began = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "dra_driver", "capacity", *args, "-o", "json"],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
        timeout=300,
    )
    took = time.perf_counter() - began
    if proc.returncode != 0:
        raise SystemExit(f"capacity failed: {proc.stderr.strip()}")
    answer: dict[str, object] = json.loads(proc.stdout)
    return took, answer


def median_of(repeats: int, *args: str) -> tuple[float, dict[str, object]]:
    runs = [run_capacity(*args) for _ in range(repeats)]
    return statistics.median(t for t, _ in runs), runs[-1][1]


def fleet_rows(nodes: int, repeats: int, seed: int, tmp: Path) -> list[list[str]]:
    fleet = fakefleet.make(nodes, profiles=PROFILES, seed=seed)
    js, jc = tmp / f"slices-{nodes}.json", tmp / f"claims-{nodes}.json"
    js.write_text(json.dumps({"kind": "List", "items": fleet.slices}))
    jc.write_text(json.dumps({"kind": "List", "items": fleet.claims}))
    ys, yc = tmp / f"slices-{nodes}.yaml", tmp / f"claims-{nodes}.yaml"
    ys.write_text(yaml.safe_dump_all(fleet.slices))
    yc.write_text(yaml.safe_dump_all(fleet.claims))
    rows = []
    answers = []
    for source, files in (("JSON files", (js, jc)), ("YAML files", (ys, yc))):
        took, answer = median_of(repeats, "--slices", str(files[0]), "--allocated", str(files[1]))
        size = sum(p.stat().st_size for p in files) / 2**20
        rows.append([f"{nodes:,}", source, f"{size:.1f} MiB", f"{took:.2f} s"])
        answers.append(answer)
    server = fakeserver.FakeApiServer(memory.InMemoryApi(use_default_cel=False)).start()
    try:
        for obj in fleet.slices:
            server.api.put_resource_slice(obj)
        for obj in fleet.claims:
            server.api.put_resource_claim(obj)
        kubeconfig = server.write_kubeconfig(tmp / "kubeconfig")
        took, answer = median_of(repeats, "--kubeconfig", str(kubeconfig))
        serving = statistics.median(lists_served_in(server.url) for _ in range(repeats))
    finally:
        server.stop()
    rows.append(
        [
            f"{nodes:,}",
            "fake API over HTTP",
            f"{len(fleet.claims):,} claims",
            f"{took:.2f} s (fake server {serving:.2f} s)",
        ]
    )
    answers.append(answer)
    if any(a != answers[0] for a in answers):
        raise SystemExit("the sources gave different answers")
    sizes = answers[0]["sizes"]
    assert isinstance(sizes, dict)
    rows[-1].append(", ".join(f"{s}: {v['fit']}/{v['optimal']}" for s, v in sizes.items()))
    for row in rows[:-1]:
        row.append("same")
    for row in rows:
        row.append("yes" if float(row[3].split()[0]) <= TARGET_S or nodes < 1000 else "NO")
    return rows


def lists_served_in(url: str) -> float:
    """Seconds the fake API server takes to answer the command's two LISTs (read, not
    decoded): its share of the HTTP row (it copies and encodes every object in Python)."""
    began = time.perf_counter()
    for path in ("resourceslices", "resourceclaims"):
        with urllib.request.urlopen(f"{url}/apis/resource.k8s.io/v1/{path}", timeout=120) as r:
            r.read()
    return time.perf_counter() - began


def agent_rows(updates: int, seed: int) -> list[list[str]]:
    rng = random.Random(seed)
    rows = []
    for profile in AGENT_PROFILES:
        devices = fake.FakeBackend.from_name(profile).discover()
        names = [g.name for g in devices.gpus]
        empty = setcapacity.of(devices)
        held = [set(rng.sample(names, rng.randint(0, len(names)))) for _ in range(updates)]
        began = time.perf_counter()
        for h in held:
            setcapacity.of(devices, held=h, empty=empty)
        per = (time.perf_counter() - began) / updates
        rows.append([profile, str(len(names)), f"{per * 1000:.2f} ms"])
    return rows


def table(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + " |"
    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows
    ]
    return "\n".join([line, rule, *body])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, action="append", help="fleet sizes (100, 1000)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per source (median)")
    parser.add_argument("--updates", type=int, default=200, help="agent gauge updates timed")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rows: list[list[str]] = []
    with tempfile.TemporaryDirectory(prefix="capacity-bench-") as tmp:
        for nodes in args.nodes or [100, 1000]:
            rows += fleet_rows(nodes, args.repeats, args.seed, Path(tmp))
    head = ["nodes (8 GPUs)", "source", "input", "capacity answers in", "fit/optimal", "≤ 5 s"]
    print(table(head, rows))
    print()
    print(table(["agent profile", "GPUs", "gauge update"], agent_rows(args.updates, args.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
