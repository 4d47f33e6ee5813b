"""The topology demo scene: on a fragmented DGX-1 a plain claim gets a poor GPU set, the claim
``dra-driver claim`` writes gets the best one, through the agent's own published slices.

Steps: the agent publishes its slices (8 GPUs, each with its set ranks) → the kubelet prepares a
claim holding gpu-0 and the agent re-ranks the GPUs left free → what kube-scheduler (replayed
step for step) gives a plain ``count: 4`` claim and the generated claim, with NVLink link counts
against the best the node has → the generated claim is allocated and the kubelet prepares it:
the container gets exactly those four GPUs → a claim whose devices overlap in GPUs is refused →
gpu-0's claim goes and the ranks come back → clean-up.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from dra_driver.allocation import allocator, claimgen, simulator
from dra_driver.demo import report as reporting
from dra_driver.demo import rig as rigging
from dra_driver.devices import fake, model
from dra_driver.driver import claims
from dra_driver.slices import gpusets
from dra_driver.testing import kubeletsim as sim

PROFILE = "dgx-1-v100"
SIZE = 4
RANK = f"setRanks digit {SIZE}"
NAMESPACE = rigging.NAMESPACE
Report = reporting.Report
Slices = list[dict[str, Any]]


def scene(
    report: Report, *, base: Path, backend: fake.FakeBackend, node_name: str, driver_name: str
) -> None:
    """Fragment a DGX-1, compare the two claims, prepare the good one, refuse an overlap."""
    del backend  # this story needs the DGX-1's uneven cube mesh, whatever --fake says
    node = fake.FakeBackend.from_name(PROFILE)
    devices = node.discover()
    report.section(f"A {PROFILE} node: hybrid cube-mesh NVLink, links per GPU pair")
    report.block(_links_table(devices))
    with rigging.node(
        report, base=base, backend=node, node_name=node_name, driver_name=driver_name
    ) as rig:
        slices = rig.slices()
        gpus = [d["name"] for s in slices for d in s["spec"].get("devices", [])]
        counters = [c["name"] for s in slices for c in s["spec"].get("sharedCounters", [])]
        report.check(
            len(slices) == 1 and len(gpus) == 8 and not counters,
            f"the agent published {len(slices)} ResourceSlice: {len(gpus)} GPUs, no counters",
        )
        report.say(f"     {RANK} (rank among the best free sets of {SIZE} GPUs): {_ranks(slices)}")
        kubelet = sim.KubeletSim(rig.plugin.registry_dir)
        try:
            kubelet.register(rig.driver_name)
            _story(report, rig, kubelet, devices)
        finally:
            kubelet.close()


def _story(
    report: Report, rig: rigging.Rig, kubelet: sim.KubeletSim, devices: model.NodeDevices
) -> None:
    node_name = rig.node_name
    classes = simulator.builtin_classes(driver_name=rig.driver_name)
    names = {g.uuid: g.name for g in devices.gpus}
    busy = (rig.driver_name, node_name, "gpu-0")
    report.section("A pod holds gpu-0: the kubelet prepares its claim, the agent re-ranks")
    before = rig.slices()
    held = _put(rig, _plain_claim("holds-gpu-0", 1), _results(rig, "gpu-0"))
    answer = kubelet.prepare([held]).claims[held.uid]
    report.check(not answer.error, "prepared the claim holding gpu-0")
    slices = _wait(rig, lambda s: _ranks(s) != _ranks(before))
    report.say(f"     {RANK} now: {_ranks(slices)}")
    report.check(
        [g for g, r in _ranks(slices).items() if r == 1] == ["gpu-4", "gpu-5", "gpu-6", "gpu-7"],
        "rank 1 for 4 GPUs moved to gpu-4..gpu-7, the best quad left free",
    )

    def allocate(obj: dict[str, Any]) -> allocator.Outcome:
        ctx = allocator.prepare(
            obj,
            slices=slices,
            classes=classes,
            node_name=node_name,
            allocated={busy},
            node_devices=devices,
        )
        outcome = allocator.schedule(ctx)
        best = allocator.best_gpus(ctx, SIZE)
        if outcome.allocation is not None and outcome.score is not None and best is not None:
            results = outcome.allocation["devices"]["results"]
            picked = ", ".join(r["device"] for r in results)
            request = results[0]["request"]
            report.say(f"     kube-scheduler allocates: {picked} (request {request})")
            report.say(
                f"     {outcome.score[0]} NVLink links between them; the best {SIZE} free GPUs "
                f"({', '.join(names[u] for u in best[0])}) have {best[1][0]}"
            )
        return outcome

    plain_claim = claimgen.claim(SIZE, nvlink="any", name="plain-4")
    report.say(f"\n  -- a plain claim for {SIZE} GPUs (dra-driver claim --gpus 4 --nvlink any)")
    report.block(yaml.safe_dump(plain_claim["spec"], sort_keys=False, width=120), indent="     ")
    plain = allocate(plain_claim)
    best_claim = claimgen.claim(SIZE, name="best-4")
    report.say(f"\n  -- the claim dra-driver claim --gpus {SIZE} writes")
    report.block(yaml.safe_dump(best_claim["spec"], sort_keys=False, width=120), indent="     ")
    best = allocate(best_claim)
    report.check(
        plain.score is not None and plain.score[0] == 5,
        "the plain claim gets 4 GPUs with 5 NVLink links (first fit: gpu-1 to gpu-4)",
    )
    report.check(
        best.score is not None and best.score[0] == 9 and len(best.gpus) == SIZE,
        "the generated claim gets the fully connected quad gpu-4 to gpu-7: 9 links, the best",
    )
    if best.allocation is not None:
        _prepare(report, rig, kubelet, best_claim, best.allocation, devices)
        _overlap(report, rig, kubelet)
    report.section("gpu-0's pod ends: its claim is unprepared, the ranks come back")
    gone = kubelet.unprepare([held]).claims[held.uid]
    back = _wait(rig, lambda s: _ranks(s) == _ranks(before))
    report.check(not gone.error and _ranks(back) == _ranks(before), f"{RANK} again: {_ranks(back)}")


def _ranks(slices: Slices) -> dict[str, int]:
    return {
        d["name"]: gpusets.rank_of(d["attributes"], SIZE)
        for s in slices
        for d in s["spec"].get("devices", [])
    }


def _wait(rig: rigging.Rig, ready: Callable[[Slices], bool], timeout_s: float = 10.0) -> Slices:
    """The published slices once ``ready`` holds for them (or the last ones seen)."""
    deadline = time.monotonic() + timeout_s
    slices = rig.slices()
    while not ready(slices) and time.monotonic() < deadline:
        time.sleep(0.05)
        slices = rig.slices()
    return slices


def _plain_claim(name: str, count: int) -> dict[str, Any]:
    return claimgen.claim(count, nvlink="any", name=name)


def _results(rig: rigging.Rig, *devices: str) -> dict[str, Any]:
    base = {"request": "gpus", "driver": rig.driver_name, "pool": rig.node_name}
    return {"devices": {"results": [{**base, "device": d} for d in devices]}}


def _put(rig: rigging.Rig, obj: dict[str, Any], allocation: Mapping[str, Any]) -> claims.ClaimRef:
    created = rig.api.create_resource_claim(rigging.claim_from([obj], name=obj["metadata"]["name"]))
    status = {
        "allocation": dict(allocation),
        "reservedFor": [{"resource": "pods", "name": "trainer", "uid": str(uuid.uuid4())}],
    }
    stored = rig.api.put_resource_claim({**created, "status": status})
    meta = stored["metadata"]
    return claims.ClaimRef(uid=meta["uid"], namespace=NAMESPACE, name=meta["name"])


def _prepare(
    report: Report,
    rig: rigging.Rig,
    kubelet: sim.KubeletSim,
    obj: dict[str, Any],
    allocation: Mapping[str, Any],
    devices: model.NodeDevices,
) -> None:
    report.section("Kubelet prepares the generated claim: the container gets exactly the four")
    ref = _put(rig, obj, allocation)
    answer = kubelet.prepare([ref]).claims[ref.uid]
    report.check(not answer.error, f"prepared {[d.device_name for d in answer.devices]}")
    spec_path = rig.spec_file(ref.uid)
    spec = json.loads(spec_path.read_text()) if spec_path else {}
    nodes = [n["path"] for d in spec.get("devices", []) for n in d["containerEdits"]["deviceNodes"]]
    want = [f"/dev/nvidia{g.minor}" for g in devices.gpus if g.minor in (4, 5, 6, 7)]
    report.check(nodes == want, f"CDI device nodes: {', '.join(nodes)}")
    visible = ",".join(g.uuid for g in devices.gpus if g.minor in (4, 5, 6, 7))
    env = spec.get("containerEdits", {}).get("env", [])
    report.check(
        f"NVIDIA_VISIBLE_DEVICES={visible}" in env,
        "NVIDIA_VISIBLE_DEVICES lists the UUIDs of gpu-4 to gpu-7",
    )
    unprepared = kubelet.unprepare([ref]).claims[ref.uid]
    report.check(not unprepared.error and rig.spec_file(ref.uid) is None, "unprepared again")


def _overlap(report: Report, rig: rigging.Rig, kubelet: sim.KubeletSim) -> None:
    report.section("A claim whose devices overlap in physical GPUs is refused")
    report.say("     (a GPU-set device of an earlier version next to one of its GPUs)")
    result = {"request": "gpus", "driver": rig.driver_name, "pool": rig.node_name}
    allocation = {
        "devices": {"results": [{**result, "device": "gpus-4-5"}, {**result, "device": "gpu-5"}]}
    }
    obj = {"metadata": {"name": "overlap"}, "spec": claimgen.spec(2)}
    ref = _put(rig, obj, allocation)
    answer = kubelet.prepare([ref]).claims[ref.uid]
    report.say(f"     error: {answer.error}")
    report.check(
        "gpus-4-5 and gpu-5 both use GPU gpu-5" in answer.error and rig.spec_file(ref.uid) is None,
        "refused with an error naming both devices; no CDI spec written",
    )


def _links_table(devices: model.NodeDevices) -> str:
    gpus = sorted(devices.gpus, key=lambda g: g.minor)
    head = "       " + " ".join(f"gpu-{g.minor}" for g in gpus)
    rows = [head]
    for a in gpus:
        cells = ["  -  " if a is b else f"  {a.nvlinks.get(b.index, 0)}  " for b in gpus]
        rows.append(f"gpu-{a.minor}  " + " ".join(cells))
    return "\n".join(rows)
