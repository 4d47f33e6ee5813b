"""ResourceSlice publishing: API writes per re-publish, and reconcile time.

Why it exists: the node agent re-publishes its slices whenever the hardware may have changed
(start-up, health changes, periodic resync); a publisher that rewrites unchanged slices costs the
API server a write per slice per node every time. This measures, over the in-memory API (which
counts every create/update/delete call), for a few node shapes:

* the first publish (all creates);
* ``--repeats`` re-publishes with unchanged hardware, each from a fresh discovery and build:
  API writes (expected: 0) and the reconcile time of such a no-op pass;
* a hardware change (the last GPU gone): writes against the writes needed — when anything in a
  pool changes, every slice of the pool must carry the new pool generation, so the need is one
  write per desired slice plus one delete per slice no longer wanted — and the pass after it
  (expected: 0 again);
* a slice deleted behind the publisher's back: the writes that put it back.

Run: ``python benchmarks/publish.py [--repeats N]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dra_driver import logs  # noqa: E402
from dra_driver.devices import fake, model  # noqa: E402
from dra_driver.devices.fake import profiles  # noqa: E402
from dra_driver.slices import build, publisher  # noqa: E402
from dra_driver.testing.fakeapi import memory  # noqa: E402

DRIVER = "gpu.nvidia.com"
NODE = "bench-node"


def l4_node(gpus: int) -> profiles.Profile:
    """A synthetic node of ``gpus`` PCIe L4 cards (more devices than fit one slice)."""
    return profiles.parse(
        'name: l4-many\ndriverVersion: "580.95.05"\ncudaDriverVersion: "13.0"\n'
        "defaults: {productName: NVIDIA L4, brand: Nvidia, architecture: Ada Lovelace, "
        'cudaComputeCapability: "8.9", memory: 23034Mi}\ngpus:\n'
        + "".join(
            f'  - {{pciBusId: "0000:{i // 32 + 1:02x}:{i % 32:02x}.0", '
            f"pcieRoot: pci0000:{i // 16:02x}, numaNode: {i // 64}}}\n"
            for i in range(gpus)
        ),
        source="benchmark",
    )


def without_last_gpu(profile: profiles.Profile) -> profiles.Profile:
    return dataclasses.replace(profile, gpus=profile.gpus[:-1], nvlink=None)


def slices_for(profile: profiles.Profile) -> list[dict[str, Any]]:
    """Discover (fresh fake NVML every time, as after a restart) and build the desired set."""
    devices: model.NodeDevices = fake.FakeBackend(profile).discover()
    return build.build(devices, node_name=NODE, driver_name=DRIVER).slices


def timed_pass(
    pub: publisher.Publisher, api: memory.InMemoryApi, desired: list[dict[str, Any]]
) -> tuple[int, float, publisher.Outcome]:
    """Hand over ``desired``, reconcile once: (API writes, seconds, outcome)."""
    before = api.writes
    pub.set_desired(desired)
    start = time.perf_counter()
    outcome = pub.reconcile_once()
    return api.writes - before, time.perf_counter() - start, outcome


def scenario(name: str, profile: profiles.Profile, repeats: int) -> list[str]:
    api = memory.InMemoryApi(use_default_cel=False)
    api.put_node(NODE, uid="node-uid-1")
    pub = publisher.Publisher(kube=api, driver_name=DRIVER, node_name=NODE)
    first = slices_for(profile)
    devices = sum(len(s["spec"].get("devices") or []) for s in first)
    created, first_s, _ = timed_pass(pub, api, first)
    noop_writes, noop_times = 0, []
    for _ in range(repeats):
        writes, seconds, _ = timed_pass(pub, api, slices_for(profile))
        noop_writes += writes
        noop_times.append(seconds)
    changed = slices_for(without_last_gpu(profile))
    server = {s["metadata"]["name"] for s in api.all_resource_slices()}
    wanted = {s["metadata"]["name"] for s in changed}
    needed = len(wanted) + len(server - wanted)
    change_writes, change_s, outcome = timed_pass(pub, api, changed)
    after_writes, _, _ = timed_pass(pub, api, slices_for(without_last_gpu(profile)))
    victim = sorted(wanted)[0]
    api.remove_resource_slice(victim)
    restore_writes, _, restored = timed_pass(pub, api, changed)
    ok = (
        noop_writes == 0
        and change_writes == needed
        and after_writes == 0
        and restored.created == [victim]
    )
    return [
        f"{name:24} {devices:>7} {len(first):>6} {created:>6} {ms(first_s):>8} "
        f"{noop_writes:>9} {ms(statistics.median(noop_times)):>8} "
        f"{change_writes:>4}/{needed:<4} {ms(change_s):>8} {after_writes:>5} "
        f"{restore_writes:>7}  {'ok' if ok else 'UNEXPECTED'}",
        f"{'':24} change: {len(outcome.created)} created, {len(outcome.updated)} updated, "
        f"{len(outcome.deleted)} deleted; restore after a deletion: "
        f"{len(restored.created)} created, {len(restored.updated)} updated",
    ]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50, help="unchanged re-publishes")
    args = parser.parse_args(argv)
    logs.configure(level="warning", fmt="json")
    cases: list[tuple[str, Callable[[], profiles.Profile]]] = [
        ("dgx-h100 (8 GPUs)", lambda: profiles.load_builtin("dgx-h100")),
        ("a100-mig (2 GPUs, MIG)", lambda: profiles.load_builtin("a100-mig")),
        ("gb200-nvl", lambda: profiles.load_builtin("gb200-nvl")),
        ("256 x L4 (synthetic)", lambda: l4_node(256)),
    ]
    print(
        f"ResourceSlice publish benchmark: in-memory API, {args.repeats} unchanged "
        f"re-publishes per node shape ({os.cpu_count()} CPUs); times are one reconcile pass"
    )
    print(
        f"{'node':24} {'devices':>7} {'slices':>6} {'first':>6} {'first ms':>8} "
        f"{'no-op wr':>9} {'no-op ms':>8} {'change':>9} {'chg ms':>8} {'after':>5} "
        f"{'restore':>7}"
    )
    status = 0
    for name, make in cases:
        rows = scenario(name, make(), args.repeats)
        status |= "UNEXPECTED" in rows[0]
        print("\n".join(rows))
    print(
        "columns: first = writes of the first publish; no-op wr = writes over all unchanged "
        "re-publishes (want 0); change = writes/needed after the last GPU is removed; after = "
        "writes of the next unchanged pass (want 0); restore = writes after one slice was "
        "deleted by someone else"
    )
    return int(status)


if __name__ == "__main__":
    raise SystemExit(main())
