"""Driver upgrades: time from the driver going away until the node's GPUs are unschedulable in
the API server, and from its return (with a new version) until the slices are current, with
the ResourceSlice writes each costs, for a fake 8-GPU and 16-GPU node.

Why it exists: docs/lifecycle.md states a bound (5 s each way) and "one write per changed slice";
this measures both on the real agent. It runs the agent as a subprocess (fake DGX H100, fake
HGX 16-GPU mesh) against the in-memory API server on loopback HTTP and sends the lifecycle
requests straight to the agent's health socket (what ``dra-driver fake-event --driver-unload``
/ ``--driver-load --driver-version V`` send, without the CLI's start-up time). Each profile
``--repeats`` times (each round a new version, the driver away ``--away-s``); the lines give
the median, the p99 and the worst in ms, and the writes per round.

Run: ``python benchmarks/lifecycle.py [--repeats N] [--away-s S] [--profiles P,...]``.
Figures depend on machine load.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dra_driver import healthcontrol  # noqa: E402
from dra_driver.testing import kubeletsim as sim  # noqa: E402
from dra_driver.testing.fakeapi import fakeserver, memory  # noqa: E402

TAINT = "gpu.nvidia.com/driver-unavailable"


def wait(probe: Callable[[], bool], timeout_s: float = 30.0) -> float:
    began = time.monotonic()
    while not probe():
        if time.monotonic() - began > timeout_s:
            raise TimeoutError(f"not within {timeout_s}s")
        time.sleep(0.002)
    return time.monotonic() - began


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


class Node:
    def __init__(self, base: Path, profile: str) -> None:
        self.server = fakeserver.FakeApiServer(memory.InMemoryApi(use_default_cel=False)).start()
        self.server.api.put_node("n1", uid=str(uuid.uuid4()))
        self.proc = sim.PluginProcess(
            base=base,
            kubeconfig=self.server.write_kubeconfig(base / "kubeconfig"),
            publish=True,
            fake=profile,
            extra=("--health-min-hold", "0"),
        )
        self.proc.start()
        self.proc.wait_ready(timeout_s=60)
        wait(self.whole_pool)

    def slices(self) -> list[dict[str, Any]]:
        found, _ = self.server.api.list_resource_slices(driver="gpu.nvidia.com", node_name="n1")
        return found

    def whole_pool(self) -> bool:
        found = self.slices()
        pools = {
            (s["spec"]["pool"]["resourceSliceCount"], s["spec"]["pool"]["generation"])
            for s in found
        }
        return len(pools) == 1 and next(iter(pools))[0] == len(found)

    def gpus(self) -> list[dict[str, Any]]:
        return [
            d
            for s in self.slices()
            for d in s["spec"].get("devices", [])
            if d["name"].startswith("gpu-") and d["name"][4:].isdigit()
        ]

    def unschedulable(self) -> bool:
        return self.whole_pool() and all(
            any(t["key"] == TAINT for t in d.get("taints", [])) for d in self.gpus()
        )

    def current(self, version: str) -> bool:
        return self.whole_pool() and all(
            not d.get("taints") and d["attributes"]["driverVersion"]["version"] == version
            for d in self.gpus()
        )

    def send(self, **req: Any) -> None:
        healthcontrol.request(self.proc.settings.health_socket, {"op": "lifecycle", **req})

    def stop(self) -> None:
        self.proc.kill()
        self.server.stop()


def run(profile: str, repeats: int, away_s: float) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix="dra-lc-", dir="/tmp"))
    node = Node(base, profile)
    away: list[float] = []
    back: list[float] = []
    writes: list[int] = []
    try:
        gpus, slices = len(node.gpus()), len(node.slices())
        for round_ in range(repeats):
            time.sleep(random.uniform(0.0, 0.5))  # at any point of the agent's 0.5 s poll
            node.send(action="driver-unload", mode="not-loaded")
            began = time.monotonic()
            wait(node.unschedulable)
            away.append(time.monotonic() - began)
            time.sleep(away_s)  # an upgrade takes a while: the agent's retries back off
            before = node.server.api.writes
            node.send(action="driver-load", driverVersion=f"590.{round_ + 1}.0")
            began = time.monotonic()
            wait(lambda r=round_: node.current(f"590.{r + 1}.0"))
            back.append(time.monotonic() - began)
            time.sleep(0.5)  # late writes would come now
            writes.append(node.server.api.writes - before)
    finally:
        node.stop()
        shutil.rmtree(base, ignore_errors=True)
    return {"gpus": gpus, "slices": slices, "away": away, "back": back, "writes": writes}


def ms(values: list[float]) -> str:
    return (
        f"median {statistics.median(values) * 1000:.0f} ms, p99 {p99(values) * 1000:.0f} ms, "
        f"worst {max(values) * 1000:.0f} ms"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--profiles", default="dgx-h100,hgx-16-mesh")
    parser.add_argument(
        "--away-s",
        type=float,
        default=3.0,
        help="how long the driver stays away each round (the agent's retry backoff grows to 2 s)",
    )
    args = parser.parse_args()
    for profile in args.profiles.split(","):
        got = run(profile, args.repeats, args.away_s)
        print(
            f"{profile} ({got['gpus']} GPUs, {got['slices']} slices), {args.repeats} rounds: "
            f"driver away -> unschedulable: {ms(got['away'])}"
        )
        print(
            f"{profile}: driver back (new version) -> slices current: {ms(got['back'])}; "
            f"slice writes per return: {sorted(set(got['writes']))} "
            f"(slices: {got['slices']})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
