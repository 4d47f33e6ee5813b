"""Dynamic MIG under SIGKILL: the real plugin process, killed at random points of prepare and
unprepare of claims on MIG placements, leaves no orphan MIG instance after a restart.

The GPUs are the NVML stand-in's, whose MIG state (mode, instances) lives in a file next to the
checkpoint, as a card's outlives the plugin; a restarted plugin sees the instances a killed one
created. At the end: every instance on the GPUs belongs to a prepared claim and every prepared
claim's instance exists; then every claim unprepares (no instance left) and prepares again.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from dra_driver.devices.fake import migstate
from dra_driver.testing.fakeapi import fakeserver
from dra_driver.testing.kubeletsim import KubeletSim, PluginProcess

from .claimkit import put_claim
from .test_crash import MIN_CALLS, kill_under_load

# Placements the scheduler could hand out together (no two share a memory slice).
DEVICES = (
    "gpu-0-mig-1g-10gb-0",
    "gpu-0-mig-2g-20gb-2",
    "gpu-0-mig-3g-40gb-4",
    "gpu-1-mig-1g-10gb-0",
    "gpu-1-mig-1g-20gb-2",
    "gpu-1-mig-3g-40gb-4",
)


def _plugin(base: Path, kubeconfig: Path) -> PluginProcess:
    return PluginProcess(
        base=base, kubeconfig=kubeconfig, fake="h100-mig", extra=["--dynamic-mig", "all"]
    )


def _instances(plugin: PluginProcess) -> set[tuple[str, int, int]]:
    path = plugin.plugins_dir / "gpu.nvidia.com" / "fake-mig-state.json"
    found = migstate.MigState({}, state_file=path).read()
    return {(gpu, i.profileId, i.start) for gpu, g in found.items() for i in g.instances}


def _owned(plugin: PluginProcess) -> set[tuple[str, int, int]]:
    owned = set()
    for path in (plugin.plugins_dir / "gpu.nvidia.com" / "claims").glob("*.json"):
        record = json.loads(path.read_text())
        assert record["state"] == "PrepareCompleted"
        for dev in record["devices"]:
            mig = dev["mig"]
            owned.add((mig["parentUUID"], mig["profileId"], mig["placementStart"]))
    return owned


def test_sigkill_at_random_points_leaves_no_orphan_mig_instance(
    short_dir: Path, apiserver: fakeserver.FakeApiServer
) -> None:
    rng = random.Random(15)
    refs = [
        put_claim(apiserver, f"m{i}", [d], "mig", namespace="crash", device_class="mig.nvidia.com")
        for i, d in enumerate(DEVICES)
    ]
    kubeconfig = apiserver.write_kubeconfig(short_dir / "kubeconfig")
    outcome: dict[str, list[str]] = {"errors": [], "calls": [], "interrupted": []}
    kills = kill_under_load(lambda: _plugin(short_dir, kubeconfig), refs, rng, outcome, (0.05, 0.5))
    assert kills >= 3
    assert outcome["errors"] == []
    assert len(outcome["calls"]) >= MIN_CALLS

    plugin = _plugin(short_dir, kubeconfig).start()
    try:
        plugin.wait_ready()  # recovery ran before the sockets appeared
        assert _instances(plugin) == _owned(plugin)
        kubelet = KubeletSim(plugin.registry_dir)
        kubelet.register("gpu.nvidia.com")
        response = kubelet.unprepare(refs)
        assert {c.error for c in response.claims.values()} == {""}
        assert _instances(plugin) == set()
        response = kubelet.prepare(refs)
        assert {c.error for c in response.claims.values()} == {""}, response
        assert len(_instances(plugin)) == len(DEVICES) == len(_owned(plugin))
        kubelet.close()
    finally:
        plugin.kill()
