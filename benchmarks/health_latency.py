"""GPU health: time from a failure to the device's taint in the API server and to Unhealthy in
the kubelet's health stream, and from recovery back.

Why it exists: the node agent must isolate a failed GPU within 2 s (issue 13). This runs the real
agent as a subprocess on a fake DGX H100 against the in-memory API server on loopback HTTP, opens
the DRA health stream (v1alpha1) over the real DRA socket as the kubelet would, and injects each
kind of failure through the agent's health socket (what ``dra-driver fake-event`` sends, without
the CLI's start-up time): XID 79, XID 48, a double-bit ECC error, a lost GPU, a row-remapping
failure (found by the poll the injection triggers). Then ``recovered`` (hold time 0). Each kind
``--repeats`` times on a rotating GPU; the table gives the median and the worst in ms.

Run: ``python benchmarks/health_latency.py [--repeats N]``. Figures depend on machine load.
"""

from __future__ import annotations

import argparse
import queue
import shutil
import signal
import statistics
import sys
import tempfile
import threading
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

KINDS: dict[str, dict[str, Any]] = {
    "XID 79 (reboot)": {"event": "xid", "xid": 79},
    "XID 48": {"event": "xid", "xid": 48},
    "ECC double-bit": {"event": "ecc-dbe"},
    "GPU lost": {"event": "lost"},
    "row remap failure (poll)": {"event": "remap-failure"},
}


def wait(probe: Callable[[], bool], timeout_s: float = 30.0) -> float:
    began = time.monotonic()
    while not probe():
        if time.monotonic() - began > timeout_s:
            raise TimeoutError("no change within 30 s")
        time.sleep(0.002)
    return time.monotonic()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="dra-hb-", dir="/tmp"))
    server = fakeserver.FakeApiServer(memory.InMemoryApi(use_default_cel=False)).start()
    server.api.put_node("n1", uid=str(uuid.uuid4()))
    agent = sim.PluginProcess(
        base=base,
        kubeconfig=server.write_kubeconfig(base / "kubeconfig"),
        publish=True,
        extra=["--health-min-hold", "0"],
    )
    kubelet = sim.KubeletSim(agent.registry_dir)
    try:
        agent.start()
        agent.wait_ready()

        def tainted() -> set[str]:
            found, _ = server.api.list_resource_slices(driver="gpu.nvidia.com", node_name="n1")
            return {
                d["name"] for s in found for d in s["spec"].get("devices", []) if d.get("taints")
            }

        wait(
            lambda: bool(
                server.api.list_resource_slices(driver="gpu.nvidia.com", node_name="n1")[0]
            )
        )
        kubelet.register("gpu.nvidia.com")
        updates: queue.Queue[tuple[float, set[str]]] = queue.Queue()
        stream = kubelet.watch_health("v1alpha1.DRAResourceHealth", timeout_s=3600)

        def read() -> None:
            try:
                for response in stream:
                    sick = {d.device.device_name for d in response.devices if d.health == 2}
                    updates.put((time.monotonic(), sick))
            except Exception:
                return

        threading.Thread(target=read, daemon=True).start()
        updates.get(timeout=10)  # the full list at once

        def stream_until(want: Callable[[set[str]], bool]) -> float:
            while True:
                at, sick = updates.get(timeout=30)
                if want(sick):
                    return at

        results: dict[str, dict[str, list[float]]] = {}
        socket = agent.settings.health_socket
        for repeat in range(args.repeats):
            for n, (kind, event) in enumerate(KINDS.items()):
                gpu = (repeat * len(KINDS) + n) % 8
                name = f"gpu-{gpu}"
                began = time.monotonic()
                healthcontrol.request(socket, {"op": "inject", "gpu": gpu, **event})
                taint = wait(lambda name=name: name in tainted())  # type: ignore[misc]
                unhealthy = stream_until(lambda sick, name=name: name in sick)  # type: ignore[misc]
                back = time.monotonic()
                healthcontrol.request(socket, {"op": "inject", "gpu": gpu, "event": "recovered"})
                clear = wait(lambda: not tainted())
                healthy = stream_until(lambda sick: not sick)
                row = results.setdefault(kind, {"taint": [], "stream": [], "clear": [], "ok": []})
                row["taint"].append(taint - began)
                row["stream"].append(unhealthy - began)
                row["clear"].append(clear - back)
                row["ok"].append(healthy - back)
        stream.cancel()
    finally:
        kubelet.close()
        if agent.proc is not None and agent.proc.poll() is None:
            agent.signal(signal.SIGTERM)
            agent.wait(20)
        server.stop()
        shutil.rmtree(base, ignore_errors=True)

    def cell(values: list[float]) -> str:
        return f"{statistics.median(values) * 1000:7.1f} / {max(values) * 1000:7.1f}"

    print(f"GPU health latency, dgx-h100 fake node, {args.repeats} repeats (median / max, ms)")
    header = ("event", "to taint", "to Unhealthy", "recovered: untaint", "recovered: Healthy")
    print(f"{header[0]:<26} {header[1]:>17} {header[2]:>17} {header[3]:>19} {header[4]:>19}")
    for kind, row in results.items():
        print(
            f"{kind:<26} {cell(row['taint']):>17} {cell(row['stream']):>17} "
            f"{cell(row['clear']):>19} {cell(row['ok']):>19}"
        )
    worst = max(max(row["taint"] + row["stream"]) for row in results.values())
    print(f"worst failure-to-isolation: {worst * 1000:.1f} ms (target: 2000 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
