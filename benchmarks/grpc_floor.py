"""What gRPC alone costs a prepare: the DRA service's round trip with a handler that does nothing.

Why it exists (issue 46): ``prepare.py`` compares the plugin with a floor that GETs the claim and
writes files; neither says how much of a 32-claim burst is the transport itself — Python's gRPC
server (its polling thread, the hand-off to a worker thread, the response's completion) and the
kubelet's side. This serves ``NodePrepareResources`` of our v1 DRA service on a unix socket with
a handler that only builds the answer (one device per claim, as a prepare returns it), and calls
it as ``benchkit.Plugin`` does: one claim per call, ``--size`` calls at once, and one call at a
time. Client and server share this process and its cores, as the kubelet and the plugin share a
node's; the server's thread pool has ``--workers`` threads, the plugin's default (16).

Printed as a table: the median wall time of a burst, the p50/p99 of single calls, and the CPU of
both sides per call. Whatever of a burst is this figure is not the plugin's to cut.

Run: ``python benchmarks/grpc_floor.py [--size 32] [--bursts 100] [--singles 1000]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent import futures
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import grpc
from benchkit import pct

from dra_driver.pb.dra.v1 import dra_pb2, dra_pb2_grpc


class _Answer(dra_pb2_grpc.DRAPluginServicer):
    """Answers every claim with one device, as a prepare does; nothing else."""

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        response = dra_pb2.NodePrepareResourcesResponse()
        for c in request.claims:
            response.claims[c.uid].devices.add(
                request_names=["gpu"],
                pool_name="bench-node",
                device_name="gpu-0",
                cdi_device_ids=[f"k8s.gpu.nvidia.com/claim={c.uid}"],
            )
        return response

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        response = dra_pb2.NodeUnprepareResourcesResponse()
        for c in request.claims:
            response.claims[c.uid].error = ""
        return response


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=32, help="calls at once in a burst")
    parser.add_argument("--bursts", type=int, default=100)
    parser.add_argument("--singles", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=16, help="the server's threads")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dra-grpc-floor-") as base:
        address = f"unix://{base}/dra.sock"
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=args.workers))
        dra_pb2_grpc.add_DRAPluginServicer_to_server(_Answer(), server)
        server.add_insecure_port(address)
        server.start()
        channel = grpc.insecure_channel(address)
        stub = dra_pb2_grpc.DRAPluginStub(channel)
        requests = [
            dra_pb2.NodePrepareResourcesRequest(
                claims=[dra_pb2.Claim(namespace="bench", uid=f"uid-{i}", name=f"claim-{i}")]
            )
            for i in range(args.size)
        ]

        def burst() -> float:
            start = time.perf_counter()
            calls = [stub.NodePrepareResources.future(r, timeout=60) for r in requests]
            for call in calls:
                call.result()
            return time.perf_counter() - start

        for _ in range(20):  # warm-up: the server's threads, the channel
            burst()
        cpu = time.process_time()
        walls = [burst() for _ in range(args.bursts)]
        burst_cpu = (time.process_time() - cpu) / (args.bursts * args.size)
        singles = []
        cpu = time.process_time()
        for i in range(args.singles):
            start = time.perf_counter()
            stub.NodePrepareResources(requests[i % len(requests)], timeout=60)
            singles.append(time.perf_counter() - start)
        single_cpu = (time.process_time() - cpu) / max(1, args.singles)
        channel.close()
        server.stop(None)
    print(f"gRPC alone (a handler that does nothing), unix socket, {args.workers} server threads")
    print(f"{'':34} {'wall ms':>9} {'p99 ms':>8} {'CPU/call ms':>12}")
    print(
        f"{f'  {args.size} calls at once (median)':34} {statistics.median(walls) * 1000:9.2f} "
        f"{pct(walls, 99) * 1000:8.2f} {burst_cpu * 1000:12.3f}"
    )
    print(
        f"{'  one call at a time (p50)':34} {pct(singles, 50) * 1000:9.3f} "
        f"{pct(singles, 99) * 1000:8.3f} {single_cpu * 1000:12.3f}"
    )
    print("  CPU: both sides (this process is the kubelet and the server)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
