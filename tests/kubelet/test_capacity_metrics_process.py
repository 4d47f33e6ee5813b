"""The node agent as a process: its set-capacity metrics on /metrics (real HTTP) follow the
claims the kubelet prepares and unprepares within a second — placeable N-GPU sets, the NVLink
links of the best free set against the empty node's, GPUs by state."""

from __future__ import annotations

import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from dra_driver.testing import polling
from dra_driver.testing.fakeapi import fakeserver
from dra_driver.testing.kubeletsim import KubeletSim, PluginProcess

from .claimkit import put_claim

Sample = tuple[str, tuple[tuple[str, str], ...]]
WANTED = {"dra_driver_gpus", "dra_driver_placeable_sets", "dra_driver_best_set_links",
          "dra_driver_best_set_links_max"}  # fmt: skip


def capacity(proc: PluginProcess) -> dict[Sample, float]:
    status, body = proc.http_get("/metrics")
    assert status == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
        if s.name in WANTED
    }


def key(name: str, **labels: str) -> Sample:
    return (f"dra_driver_{name}", tuple(sorted(labels.items())))


EMPTY = {
    key("gpus", state="free"): 8.0,
    key("gpus", state="held"): 0.0,
    key("placeable_sets", size="4"): 2.0,
    key("placeable_sets", size="8"): 1.0,
    key("best_set_links", size="4"): 9.0,  # a DGX-1's fully linked quad
    key("best_set_links", size="8"): 24.0,
    key("best_set_links_max", size="4"): 9.0,
}
# gpu-0 and gpu-4 held: one quad's worth of GPUs fits 4, none as well linked (7 of 9 links).
SPLIT = {
    key("gpus", state="free"): 6.0,
    key("gpus", state="held"): 2.0,
    key("placeable_sets", size="4"): 1.0,
    key("placeable_sets", size="8"): 0.0,
    key("best_set_links", size="4"): 7.0,
    key("best_set_links_max", size="4"): 9.0,
}


def shows(proc: PluginProcess, expected: dict[Sample, float], gone: Sample | None = None) -> bool:
    now = capacity(proc)
    return all(now.get(k) == v for k, v in expected.items()) and (gone is None or gone not in now)


def test_the_capacity_metrics_follow_prepare_and_unprepare_within_a_second(
    short_dir: Path, apiserver: fakeserver.FakeApiServer
) -> None:
    apiserver.api.put_node("n1", uid="uid-n1")
    proc = PluginProcess(
        base=short_dir,
        kubeconfig=apiserver.write_kubeconfig(short_dir / "kubeconfig"),
        publish=True,
        fake="dgx-1-v100",
    )
    proc.start()
    try:
        proc.wait_ready()
        assert polling.poll(lambda: shows(proc, EMPTY), timeout_s=20.0)
        kubelet = KubeletSim(proc.registry_dir)
        kubelet.register("gpu.nvidia.com")
        split = put_claim(apiserver, "split", ["gpu-0", "gpu-4"])
        latencies = []
        for expected, gone, call in (
            (SPLIT, key("best_set_links", size="8"), kubelet.prepare),
            (EMPTY, None, kubelet.unprepare),
        ):
            assert call([split]).claims[split.uid].error == ""
            began = time.monotonic()
            assert polling.poll(lambda e=expected, g=gone: shows(proc, e, g), timeout_s=10.0)
            latencies.append(time.monotonic() - began)
        assert max(latencies) < 1.0, f"metrics followed after {latencies} s"
        kubelet.close()
    finally:
        proc.kill()
