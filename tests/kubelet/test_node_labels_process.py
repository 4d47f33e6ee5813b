"""The node agent as it runs on a node (a subprocess, the API over loopback HTTP) keeps its Node's
GPU labels: one PATCH, then only GETs; labels restored after someone deletes them; foreign labels
untouched; ``--node-labels=false`` leaves the Node alone."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

from dra_driver.nodelabels import reconcile
from dra_driver.testing.fakeapi import fakeserver
from dra_driver.testing.kubeletsim import PluginProcess

FOREIGN = {"kubernetes.io/hostname": "n1", "nvidia.com/gpu.deploy.driver": "true", "team": "ml"}


def wait_for(condition: Callable[[], bool], proc: PluginProcess, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert proc.proc is not None and proc.proc.poll() is None, proc.log()
        assert time.monotonic() < deadline, f"timed out; plugin log:\n{proc.log()}"
        time.sleep(0.05)


def labels(server: fakeserver.FakeApiServer) -> dict[str, str]:
    with server.api._lock:  # read without recording a call
        return dict(server.api._nodes["n1"]["metadata"].get("labels") or {})


def count(server: fakeserver.FakeApiServer, method: str) -> int:
    with server.api._lock:
        return sum(1 for c in server.api.calls if c.method == method)


def test_agent_keeps_its_nodes_labels(short_dir: Path, apiserver: fakeserver.FakeApiServer) -> None:
    apiserver.api.put_node("n1", labels=dict(FOREIGN))
    plugin = PluginProcess(
        base=short_dir,
        kubeconfig=apiserver.write_kubeconfig(short_dir / "kubeconfig"),
        fake="dgx-1-v100",
        extra=["--node-labels-resync", "0.2"],
    ).start()
    try:
        wait_for(lambda: "nvidia.com/gpu.product" in labels(apiserver), plugin)
        got = labels(apiserver)
        assert got["nvidia.com/gpu.product"] == "Tesla-V100-SXM2-32GB"
        assert got["nvidia.com/gpu.count"] == "8"
        assert {k: got[k] for k in FOREIGN} == FOREIGN
        assert count(apiserver, "patch_node") == 1
        # steady state: resyncs are GETs only
        gets = count(apiserver, "get_node")
        wait_for(lambda: count(apiserver, "get_node") >= gets + 5, plugin)
        assert count(apiserver, "patch_node") == 1
        # someone deletes two of our labels and one of theirs: ours come back, theirs stays gone
        apiserver.api.label_node(
            "n1", {"nvidia.com/gpu.product": None, "nvidia.com/gpu.count": None, "team": None}
        )
        wait_for(lambda: "nvidia.com/gpu.product" in labels(apiserver), plugin)
        wait_for(lambda: count(apiserver, "patch_node") == 2, plugin)
        after = labels(apiserver)
        assert after["nvidia.com/gpu.count"] == "8" and "team" not in after
        assert after["nvidia.com/gpu.deploy.driver"] == "true"
        with apiserver.api._lock:
            owned = apiserver.api._nodes["n1"]["metadata"]["annotations"][
                reconcile.OWNED_ANNOTATION
            ]
        assert set(owned.split(",")) == {k for k in after if k not in FOREIGN}
        plugin.signal(signal.SIGTERM)
        assert plugin.wait() == 0
    finally:
        plugin.kill()


def test_node_labels_false_leaves_the_node_alone(
    short_dir: Path, apiserver: fakeserver.FakeApiServer
) -> None:
    apiserver.api.put_node("n1", labels=dict(FOREIGN))
    plugin = PluginProcess(
        base=short_dir,
        kubeconfig=apiserver.write_kubeconfig(short_dir / "kubeconfig"),
        extra=["--node-labels=false", "--node-labels-resync", "0.05"],
    ).start()
    try:
        plugin.wait_ready()
        wait_for(lambda: '"not labelling the Node (disabled)"' in plugin.log(), plugin)
        assert count(apiserver, "get_node") == count(apiserver, "patch_node") == 0
        assert labels(apiserver) == FOREIGN
    finally:
        plugin.kill()
