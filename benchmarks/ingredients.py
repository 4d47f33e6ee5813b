"""Where the plugin's CPU goes for one claim: each ingredient of a prepare/unprepare, timed alone.

Why it exists: ``benchmarks/prepare.py`` measures the whole (latency, parallel vs. serial, CPU per
claim of the plugin process); this splits that CPU into its parts so a change can be aimed at the
biggest one and its effect checked. Every ingredient runs the real code in this process against
real files in a temporary directory and a real HTTP API server on loopback (a subprocess, so its
CPU is not counted): CPU is this thread's CPU time (user + kernel, e.g. the filesystem work of a
rename), wall is elapsed time; both are means per call, in microseconds.

Run: ``python benchmarks/ingredients.py [--calls N]``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import benchkit as bench  # noqa: E402  (the benchmark's node, claims, API server and plugin)


def timed(fn: Callable[[int], object], calls: int) -> tuple[float, float]:
    """Mean (CPU µs, wall µs) of ``fn(i)`` for i in range(calls), after one warm-up call."""
    fn(calls)
    cpu = time.thread_time()
    wall = time.perf_counter()
    for i in range(calls):
        fn(i)
    return (
        (time.thread_time() - cpu) / calls * 1e6,
        (time.perf_counter() - wall) / calls * 1e6,
    )


def measure(base: Path, kubeconfig: Path, profile: Path, objs: list[Any], calls: int) -> Any:
    from dra_driver import app, logs
    from dra_driver.devices import fake
    from dra_driver.driver import claimplan, claims, results
    from dra_driver.kube import client
    from dra_driver.kubelet import dra_service
    from dra_driver.pb.dra.v1 import dra_pb2

    logs.configure(level="info", fmt="json")
    api = client.KubeClient.connect(kubeconfig)
    settings = app.PluginSettings(
        node_name=bench.NODE,
        driver_name=bench.DRIVER,
        registry_dir=base / "registry",
        plugins_dir=base / "plugins",
        cdi_root=bench.cdi_root(base),
        driver_root=base / "driver-root",
        fake=True,
        serial=True,
        cleanup_interval_s=0,
        publish=False,
    )
    devices = fake.FakeBackend.from_file(profile).discover()
    log = logs.get("bench")
    driver = app.build_driver(settings, devices=devices, api=api, log=log)
    st = driver.state
    obj = objs[0]
    ref = claims.ClaimRef(
        uid=obj["metadata"]["uid"], namespace="bench", name=obj["metadata"]["name"]
    )
    claim = api.get_resource_claim("bench", ref.name)
    body = json.dumps(claim).encode()
    alloc = claims.allocated_devices(claim, ref=ref, driver=bench.DRIVER, pool=bench.NODE)

    def plan(i: int) -> Any:
        return claimplan.plan(ref, alloc, devices=st.devices, device_taints=st.device_taints)

    planned = st.metadata.plan(ref, claim, plan(0))
    spec = st.specs.build(ref, planned, mounts=st.metadata.mounts(ref))
    record = st._record(ref, alloc, planned, spec, {}, [])
    uids = [str(uuid.uuid4()) for _ in range(calls + 1)]
    started = [dataclasses.replace(record, uid=u, state="PrepareStarted") for u in uids]
    completed = [dataclasses.replace(record, uid=u) for u in uids]

    def unprepare_files(i: int) -> None:
        st.store.delete(uids[i])
        st.specs.remove(uids[i])

    def unprepare_metadata(i: int) -> None:
        st.metadata.remove(
            claims.ClaimRef(uid=uids[i], namespace="bench", name=ref.name), completed[i]
        )

    # The file steps of one claim's life, in order, one claim after the other (as on a node:
    # the directories stay small), each step timed on its own.
    steps: list[tuple[str, Callable[[int], object]]] = [
        ("checkpoint PrepareStarted write", lambda i: st.store.put(started[i])),
        ("claim metadata files write (new)", lambda i: st.metadata.write(completed[i])),
        ("CDI spec file write", lambda i: st.specs.write(uids[i], spec)),
        ("checkpoint PrepareCompleted (commit)", lambda i: st.store.put(completed[i])),
        ("unprepare: remove record + spec", unprepare_files),
        ("unprepare: remove metadata files", unprepare_metadata),
    ]
    spent = {label: [0.0, 0.0] for label, _ in steps}
    for i in range(calls + 1):
        for label, step in steps:
            cpu, wall = time.thread_time(), time.perf_counter()
            step(i)
            if i:  # the first round is a warm-up
                spent[label][0] += time.thread_time() - cpu
                spent[label][1] += time.perf_counter() - wall
    file_rows = [(label, (c / calls * 1e6, w / calls * 1e6)) for label, (c, w) in spent.items()]

    rows: list[tuple[str, tuple[float, float]]] = [
        (
            "API GET (client adapter, loopback)",
            timed(lambda i: api.get_resource_claim("bench", ref.name), calls),
        ),
        ("  of which: JSON decode of the body", timed(lambda i: json.loads(body), calls)),
        (
            "claim decode (our results, configs)",
            timed(
                lambda i: claims.allocated_devices(
                    claim, ref=ref, driver=bench.DRIVER, pool=bench.NODE
                ),
                calls,
            ),
        ),
        ("opaque config decode + device plan", timed(plan, calls)),
        ("CDI spec build + checks", timed(lambda i: st.specs.build(ref, planned), calls)),
        (
            "checkpoint record build",
            timed(lambda i: st._record(ref, alloc, planned, spec, {}, []), calls),
        ),
        *file_rows,
        (
            "log line (claim logger, JSON)",
            timed(
                lambda i: logs.claim_logger(
                    log, uid=ref.uid, namespace=ref.namespace, name=ref.name
                ).info("prepared claim", devices=["gpu-0"], cdi_spec="x"),
                calls,
            ),
        ),
    ]
    answer = {ref.uid: results.PrepareResult(devices=record.prepared())}

    class Fixed:
        def prepare(self, refs: Any) -> Any:
            return answer

        def unprepare(self, refs: Any) -> Any:
            return {ref.uid: ""}

    service = dra_service.DraService(plugin=Fixed(), pb=dra_pb2, share_ids=True, log=log)
    request = dra_pb2.NodePrepareResourcesRequest(
        claims=[dra_pb2.Claim(uid=ref.uid, namespace="bench", name=ref.name)]
    ).SerializeToString()
    rows.append(
        (
            "protobuf decode + servicer + encode",
            timed(
                lambda i: service.NodePrepareResources(
                    dra_pb2.NodePrepareResourcesRequest.FromString(request), None
                ).SerializeToString(),
                calls,
            ),
        )
    )

    def cycle(i: int) -> None:
        st.prepare(ref)
        st.unprepare(ref)

    rows.append(("whole prepare + unprepare (ClaimState)", timed(cycle, calls)))

    def driver_cycle(i: int) -> None:
        driver.prepare([ref])
        driver.unprepare([ref])

    rows.append(("  the same through Driver (+ metrics)", timed(driver_cycle, calls)))
    driver.close()
    api.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000, help="calls per ingredient")
    args = parser.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="dra-ingredients-", dir="/tmp"))
    profile = base / "profile.yaml"
    profile.write_text(bench.profile_yaml())
    lib = base / "driver-root/usr/lib/x86_64-linux-gnu"
    lib.mkdir(parents=True)
    (lib / "libcuda.so.580.95.05").write_text("x")
    (lib / "libcuda.so.1").symlink_to("libcuda.so.580.95.05")
    objs = [bench.claim(f"c-{i}", f"gpu-{i}") for i in range(4)]
    claims_file = base / "claims.json"
    claims_file.write_text(json.dumps(objs))
    api_proc, kubeconfig = bench.start_api(base, claims_file, 0.0)
    out = sys.stdout
    try:
        # Log lines are rendered, then dropped; an error's traceback still reaches stderr.
        with open(os.devnull, "w") as devnull, contextlib.redirect_stderr(devnull):
            rows = measure(base, kubeconfig, profile, objs, args.calls)
    finally:
        api_proc.send_signal(signal.SIGTERM)
        api_proc.wait(timeout=20)
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(bench.cdi_root(base), ignore_errors=True)
    print(f"prepare ingredients, mean of {args.calls} calls ({os.cpu_count()} CPUs)", file=out)
    print(f"{'ingredient':40} {'CPU µs':>8} {'wall µs':>8}", file=out)
    for label, (cpu, wall) in rows:
        print(f"{label:40} {cpu:8.0f} {wall:8.0f}", file=out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
