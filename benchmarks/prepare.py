"""Prepare latency and throughput of the kubelet plugin, over its real socket.

What it measures, end to end as the kubelet sees it: the plugin runs as a subprocess (fake 32-GPU
node, real CDI and checkpoint files with fsync), the Kubernetes API is an in-memory API behind a
real HTTP server on loopback (another subprocess), and the plugin reads claims through the real
client adapter. As on a node, the CDI specs go to a tmpfs (``/dev/shm`` here, ``/var/run/cdi``
there; ``--cdi-on-disk`` puts them next to the checkpoint instead). Printed as a table:

* single-claim NodePrepareResources / NodeUnprepareResources latency (p50, p90, p99, max);
* one call with 32 distinct claims, the plugin preparing them in parallel vs. forced serial
  (``--serial``), median of several rounds, and the speed-up;
* the two ingredients of one prepare measured alone (an API GET, one durable file write).

Run: ``python benchmarks/prepare.py [--rounds N] [--singles N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

GPUS = 32
DRIVER = "gpu.nvidia.com"
NODE = "bench-node"


def profile_yaml() -> str:
    gpus = "\n".join(
        f'  - {{pciBusId: "0000:{0x10 + i:02x}:00.0", pcieRoot: pci0000:{i // 8:02x}, '
        f"numaNode: {i // 16}}}"
        for i in range(GPUS)
    )
    return (
        "name: bench-32\ndescription: 32 PCIe GPUs for the prepare benchmark\n"
        'driverVersion: "580.95.05"\ncudaDriverVersion: "13.0"\n'
        "defaults:\n  productName: NVIDIA L4\n  brand: Nvidia\n  architecture: Ada Lovelace\n"
        '  cudaComputeCapability: "8.9"\n  memory: 23034Mi\n'
        f"gpus:\n{gpus}\n"
    )


def claim(name: str, device: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "bench", "uid": str(uuid.uuid4())},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}
                    ],
                    "config": [
                        {
                            "source": "FromClass",
                            "opaque": {
                                "driver": DRIVER,
                                "parameters": {
                                    "apiVersion": "gpu.nvidia.com/v1",
                                    "kind": "GpuConfig",
                                },
                            },
                        }
                    ],
                }
            }
        },
    }


def serve_api(claims_file: Path, kubeconfig: Path, delay_ms: float) -> int:
    """Subprocess mode: the in-memory API with our claims behind a loopback HTTP server; every
    claim GET answers ``delay_ms`` late, like a real API server across a network."""
    from dra_driver.fakeapi import fakeserver, memory
    from dra_driver.kube import api

    server = fakeserver.FakeApiServer(memory.InMemoryApi(use_default_cel=False))
    for obj in json.loads(claims_file.read_text()):
        server.api.put_resource_claim(obj)
    if delay_ms > 0:
        real_get = server.api.get_resource_claim

        def slow_get(namespace: str, name: str) -> api.Obj:
            time.sleep(delay_ms / 1000)
            return real_get(namespace, name)

        server.api.get_resource_claim = slow_get  # type: ignore[method-assign]
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    server.start()
    tmp = kubeconfig.with_suffix(".tmp")
    server.write_kubeconfig(tmp)
    tmp.replace(kubeconfig)
    done.wait()
    server.stop()
    return 0


def start_api(
    base: Path, claims_file: Path, delay_ms: float
) -> tuple[subprocess.Popen[bytes], Path]:
    kubeconfig = base / f"kubeconfig-{delay_ms:g}ms"
    proc = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--serve-api",
            str(claims_file),
            str(kubeconfig),
            "--api-delay-ms",
            str(delay_ms),
        ],
        cwd=REPO,
    )
    deadline = time.monotonic() + 30
    while not kubeconfig.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("API server did not start")
        time.sleep(0.02)
    return proc, kubeconfig


def cdi_root(base: Path, on_disk: bool = False) -> Path:
    """Where the plugin writes CDI specs: a tmpfs like a node's /var/run/cdi, if there is one."""
    shm = Path("/dev/shm")
    if on_disk or not shm.is_dir() or not os.access(shm, os.W_OK):
        return base / "cdi"
    return shm / f"{base.name}-cdi"


class Plugin:
    def __init__(
        self, base: Path, kubeconfig: Path, profile: Path, serial: bool, cdi: Path | None = None
    ) -> None:
        self.base = base
        self.cdi = cdi or base / "cdi"
        for sub in (base / "registry", base / "plugins", self.cdi):
            shutil.rmtree(sub, ignore_errors=True)
        argv = [
            sys.executable,
            "-m",
            "dra_driver",
            "--log-level",
            "warning",
            "kubelet-plugin",
            "--node-name",
            NODE,
            "--driver-name",
            DRIVER,
            "--kubelet-registry-dir",
            str(base / "registry"),
            "--kubelet-plugins-dir",
            str(base / "plugins"),
            "--cdi-root",
            str(self.cdi),
            "--kubeconfig",
            str(kubeconfig),
            "--fake-file",
            str(profile),
            "--driver-root",
            str(base / "driver-root"),
            "--no-publish",
            "--cleanup-interval",
            "0",
            *(["--serial"] if serial else []),
        ]
        self.log = (base / f"plugin-{'serial' if serial else 'parallel'}.log").open("wb")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=self.log, cwd=REPO)
        import grpc

        from dra_driver.pb.dra.v1 import dra_pb2, dra_pb2_grpc

        self.pb = dra_pb2
        sock = base / "plugins" / DRIVER / "dra.sock"
        reg = base / "registry" / f"{DRIVER}-reg.sock"
        deadline = time.monotonic() + 30
        while not (sock.exists() and reg.exists()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"plugin did not start; see {self.log.name}")
            time.sleep(0.02)
        self.channel = grpc.insecure_channel(f"unix://{sock}")
        grpc.channel_ready_future(self.channel).result(timeout=10)
        self.stub = dra_pb2_grpc.DRAPluginStub(self.channel)

    def _claims(self, objs: list[dict[str, Any]]) -> list[Any]:
        return [
            self.pb.Claim(namespace="bench", uid=o["metadata"]["uid"], name=o["metadata"]["name"])
            for o in objs
        ]

    def prepare(self, objs: list[dict[str, Any]]) -> float:
        start = time.perf_counter()
        response = self.stub.NodePrepareResources(
            self.pb.NodePrepareResourcesRequest(claims=self._claims(objs)), timeout=45
        )
        elapsed = time.perf_counter() - start
        errors = [c.error for c in response.claims.values() if c.error]
        if errors or len(response.claims) != len(objs):
            raise RuntimeError(f"prepare failed: {errors[:3]}")
        return elapsed

    def unprepare(self, objs: list[dict[str, Any]]) -> float:
        start = time.perf_counter()
        response = self.stub.NodeUnprepareResources(
            self.pb.NodeUnprepareResourcesRequest(claims=self._claims(objs)), timeout=45
        )
        elapsed = time.perf_counter() - start
        if any(c.error for c in response.claims.values()):
            raise RuntimeError("unprepare failed")
        return elapsed

    def cpu_s(self) -> float:
        """CPU time (user + system) the plugin process has used so far."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.channel.close()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=20)
        self.log.close()
        shutil.rmtree(self.cdi, ignore_errors=True)


def fs_type(path: Path) -> str:
    """The filesystem type ``path`` is on (from /proc/mounts, longest mount point wins)."""
    best, kind = "", "?"
    target = str(path.resolve() if path.exists() else path.parent.resolve())
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        mount = fields[1]
        if (target == mount or target.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(
            best
        ):
            best, kind = mount, fields[2]
    return kind


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:8.2f}"


def components(base: Path, kubeconfig: Path, name: str) -> tuple[float, float]:
    """Median of one API GET through the real client adapter, and of one durable write."""
    from dra_driver.driver import atomicfile
    from dra_driver.kube import client

    api = client.KubeClient.connect(kubeconfig)
    gets = []
    for _ in range(200):
        start = time.perf_counter()
        api.get_resource_claim("bench", name)
        gets.append(time.perf_counter() - start)
    api.close()
    writes = []
    target = base / "plugins" / "write-probe.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    for i in range(200):
        start = time.perf_counter()
        atomicfile.write_json(target, {"i": i, "pad": "x" * 2000})
        writes.append(time.perf_counter() - start)
    return statistics.median(gets), statistics.median(writes)


def batch_round(plugin: Plugin, batch: list[dict[str, Any]], rounds: int) -> tuple[float, float]:
    """Median wall time of preparing ``batch`` in one call, and plugin CPU per claim."""
    plugin.prepare(batch[:4])  # warm-up: connections
    plugin.unprepare(batch[:4])
    walls, cpu = [], 0.0
    for _ in range(rounds):
        before = plugin.cpu_s()
        walls.append(plugin.prepare(batch))
        cpu += plugin.cpu_s() - before
        plugin.unprepare(batch)
    return statistics.median(walls), cpu / (rounds * len(batch))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--singles", type=int, default=300, help="single-claim calls to time")
    parser.add_argument("--rounds", type=int, default=7, help="32-claim rounds per mode")
    parser.add_argument(
        "--network-ms",
        type=float,
        default=3.0,
        help="extra API latency for the second 32-claim comparison (a real API server is a "
        "network hop away; default 3 ms)",
    )
    parser.add_argument(
        "--serve-api", nargs=2, metavar=("CLAIMS", "KUBECONFIG"), help=argparse.SUPPRESS
    )
    parser.add_argument("--api-delay-ms", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument(
        "--cdi-on-disk", action="store_true", help="CDI specs on the temp dir's disk, not tmpfs"
    )
    args = parser.parse_args(argv)
    if args.serve_api:
        return serve_api(Path(args.serve_api[0]), Path(args.serve_api[1]), args.api_delay_ms)

    base = Path(tempfile.mkdtemp(prefix="dra-bench-", dir="/tmp"))
    profile = base / "profile.yaml"
    profile.write_text(profile_yaml())
    lib = base / "driver-root/usr/lib/x86_64-linux-gnu"
    lib.mkdir(parents=True)
    (lib / "libcuda.so.580.95.05").write_text("x")
    (lib / "libcuda.so.1").symlink_to("libcuda.so.580.95.05")
    singles = [claim(f"single-{i}", f"gpu-{i % GPUS}") for i in range(args.singles)]
    batch = [claim(f"batch-{i}", f"gpu-{i}") for i in range(GPUS)]
    claims_file = base / "claims.json"
    claims_file.write_text(json.dumps(singles + batch))
    apis: list[subprocess.Popen[bytes]] = []
    batches: dict[tuple[float, bool], tuple[float, float]] = {}
    try:
        api, kubeconfig = start_api(base, claims_file, 0.0)
        apis.append(api)
        cdi = cdi_root(base, args.cdi_on_disk)
        plugin = Plugin(base, kubeconfig, profile, serial=False, cdi=cdi)
        try:
            for obj in singles[:20]:  # warm-up: connections, caches
                plugin.prepare([obj])
                plugin.unprepare([obj])
            prep, unprep = [], []
            for obj in singles:
                prep.append(plugin.prepare([obj]))
                unprep.append(plugin.unprepare([obj]))
        finally:
            plugin.stop()
        slow_api, slow_kubeconfig = start_api(base, claims_file, args.network_ms)
        apis.append(slow_api)
        for delay, config in ((0.0, kubeconfig), (args.network_ms, slow_kubeconfig)):
            for serial in (False, True):
                plugin = Plugin(base, config, profile, serial=serial, cdi=cdi)
                try:
                    batches[(delay, serial)] = batch_round(plugin, batch, args.rounds)
                finally:
                    plugin.stop()
        get_s, write_s = components(base, kubeconfig, batch[0]["metadata"]["name"])
    finally:
        for api in apis:
            api.send_signal(signal.SIGTERM)
            api.wait(timeout=20)
        shutil.rmtree(base, ignore_errors=True)

    print(
        f"kubelet plugin prepare benchmark ({len(prep)} single calls, {args.rounds} rounds of "
        f"{GPUS} claims; {os.cpu_count()} CPUs; CDI specs on {fs_type(cdi)})"
    )
    print(f"{'':36} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for label, values in (("prepare, 1 claim", prep), ("unprepare, 1 claim", unprep)):
        print(f"{label:36} " + " ".join(ms(pct(values, p)) for p in (50, 90, 99, 100)))
    print()
    print(f"{'32 claims in one call':36} {'median ms':>9} {'per claim':>9} {'CPU/claim':>9}")
    for delay in (0.0, args.network_ms):
        (par, par_cpu), (ser, ser_cpu) = batches[(delay, False)], batches[(delay, True)]
        where = "loopback API" if delay == 0 else f"API +{delay:g} ms network"
        print(f"  {where}")
        print(
            f"{'    parallel (thread pool)':36} {ms(par):>9} {ms(par / GPUS):>9} {ms(par_cpu):>9}"
        )
        print(f"{'    serial (--serial)':36} {ms(ser):>9} {ms(ser / GPUS):>9} {ms(ser_cpu):>9}")
        print(f"{'    speed-up':36} {ser / par:8.1f}x")
        # Under the GIL the claims' Python runs on one core, so parallel wall time is about
        # claims x CPU per claim (less the kernel time that overlaps on another core): the
        # ceiling is near serial wall per claim / CPU per claim.
        print(
            f"{'    ceiling estimate (GIL)':36} {ser / GPUS / ser_cpu:8.1f}x   at serial "
            f"CPU/claim; {ser / GPUS / par_cpu:.1f}x at parallel CPU/claim"
        )
    print()
    print(f"{'ingredients (median)':36} {'ms':>9}")
    print(f"{'  API GET via client adapter':36} {ms(get_s):>9}")
    print(f"{'  durable file write (2 fsyncs)':36} {ms(write_s):>9}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
