"""Per-claim GPU metrics: what one sampling pass costs, and how fast ``/metrics`` answers.

Measures, in process on the fake dgx-h100 profile (8 GPUs, fake NVML through the real sampler):

* one sampling pass over the 8 GPUs (utilization, memory, power, temperature): p50/p99 ms
  (target < 5 ms);
* ``GET /metrics`` on the real health server with 100 prepared claims and a sampler running:
  idle, and while 100 claims are prepared at once (the driver core's worker pool, fake API):
  p50/p99/max ms (target < 200 ms).

    python benchmarks/gpu_metrics.py [--passes 500] [--scrapes 50]
"""

from __future__ import annotations

import argparse
import http.client
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from benchkit import pct

from dra_driver import app, gpumetrics, health_server, logs, metrics
from dra_driver.devices import fake
from dra_driver.driver import claims as claims_mod
from dra_driver.testing.fakeapi import memory

NODE, DRIVER, PROFILE = "n1", "gpu.nvidia.com", "dgx-h100"


def claim(i: int, prefix: str) -> dict[str, Any]:
    """Admin access, so 100 claims may share 8 GPUs."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"{prefix}-{i}", "namespace": "default", "uid": str(uuid.uuid4())},
        "spec": {"devices": {"requests": []}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": DRIVER,
                            "pool": NODE,
                            "device": f"gpu-{i % 8}",
                            "adminAccess": True,
                        }
                    ],
                    "config": [],
                }
            },
            "reservedFor": [{"resource": "pods", "name": f"pod-{i}", "uid": str(uuid.uuid4())}],
        },
    }


def refs(api: memory.InMemoryApi, prefix: str, n: int) -> list[claims_mod.ClaimRef]:
    out = []
    for i in range(n):
        obj = claim(i, prefix)
        api.put_resource_claim(obj)
        meta = obj["metadata"]
        out.append(claims_mod.ClaimRef(uid=meta["uid"], namespace="default", name=meta["name"]))
    return out


def scrape_ms(address: tuple[str, int]) -> float:
    conn = http.client.HTTPConnection(*address, timeout=10)
    start = time.perf_counter()
    conn.request("GET", "/metrics")
    resp = conn.getresponse()
    resp.read()
    took = (time.perf_counter() - start) * 1000
    conn.close()
    if resp.status != 200:
        raise SystemExit(f"/metrics answered {resp.status}")
    return took


def row(name: str, values: list[float], target: str) -> str:
    return (
        f"| {name} | {len(values)} | {pct(values, 50):.3f} | {pct(values, 99):.3f} "
        f"| {max(values):.3f} | {target} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=500, help="sampling passes to time")
    parser.add_argument("--scrapes", type=int, default=50, help="idle scrapes to time")
    args = parser.parse_args()
    logs.configure(level="warning")
    backend = fake.FakeBackend.from_name(PROFILE)
    devices = backend.discover()
    sampler = backend.sampler()
    uuids = [g.uuid for g in devices.gpus]
    passes = []
    for _ in range(args.passes):
        start = time.perf_counter()
        sampler.sample(uuids)
        passes.append((time.perf_counter() - start) * 1000)

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        (base / "boot_id").write_text("boot-1\n")
        settings = app.PluginSettings(
            node_name=NODE,
            driver_name=DRIVER,
            registry_dir=base / "registry",
            plugins_dir=base / "plugins",
            cdi_root=base / "cdi",
            driver_root=base / "driver-root",
            fake=True,
            boot_id_file=base / "boot_id",
            publish=False,
        )
        api = memory.InMemoryApi(use_default_cel=False)
        registry = metrics.new()
        driver = app.build_driver(
            settings, devices=devices, api=api, log=logs.get("bench"), metrics=registry
        )
        gm = gpumetrics.start(
            registry=registry.registry,
            backend_=backend,
            devices=devices,
            claims=driver.state.prepared,
            interval_s=0.5,
            node_name=NODE,
        )
        server = health_server.HealthServer(
            registry=registry.registry, readiness=health_server.Readiness(), port=0
        )
        server.start()
        try:
            driver.prepare(refs(api, "warm", 100))  # 100 claims' series in every scrape
            idle = [scrape_ms(server.address) for _ in range(args.scrapes)]
            batch = refs(api, "busy", 100)
            done = threading.Event()
            prepared_ms: list[float] = []

            def run() -> None:
                start = time.perf_counter()
                results = driver.prepare(batch)
                prepared_ms.append((time.perf_counter() - start) * 1000)
                done.set()
                bad = [r.error for r in results.values() if r.error]
                if bad:
                    raise SystemExit(f"prepare failed: {bad[0]}")

            worker = threading.Thread(target=run)
            worker.start()
            busy: list[float] = []
            while not done.is_set() or not busy:
                busy.append(scrape_ms(server.address))
            worker.join()
        finally:
            server.stop()
            gm.stop()
            driver.close()

    print(f"fake profile {PROFILE}: {len(uuids)} GPUs; 100 claims prepared before the scrapes")
    print("| measurement | n | p50 ms | p99 ms | max ms | target |")
    print("|---|---|---|---|---|---|")
    print(row(f"sampling pass, {len(uuids)} GPUs (fake NVML)", passes, "< 5 ms"))
    print(row("GET /metrics, idle", idle, "< 200 ms"))
    print(row("GET /metrics, during 100 concurrent prepares", busy, "< 200 ms"))
    print(f"(the 100 prepares took {prepared_ms[0]:.1f} ms in all)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
