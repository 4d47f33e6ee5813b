"""The topology demo scene: on a fragmented DGX-1 a plain claim gets a poor GPU set, the claim
``dra-driver claim`` writes gets the best one, through the agent's own published slices.

Steps: the agent publishes its slices (per-GPU counters, GPUs, GPU sets best first) → a pod
already holds gpu-0 → what kube-scheduler (replayed step for step) gives a plain ``count: 4``
claim and the generated claim, with NVLink link counts against the best the node has → the
generated claim is allocated and the kubelet prepares it: the container gets exactly the four
GPUs of the set → a claim whose devices overlap in GPUs is refused → clean-up.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from dra_driver.allocation import allocator, claimgen, simulator
from dra_driver.demo import report as reporting
from dra_driver.demo import rig as rigging
from dra_driver.devices import fake, model
from dra_driver.driver import claims
from dra_driver.kubelet import sim

PROFILE = "dgx-1-v100"
SIZE = 4
NAMESPACE = rigging.NAMESPACE
Report = reporting.Report


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
        sets = [
            d["name"]
            for s in slices
            for d in s["spec"].get("devices", [])
            if d["name"].startswith("gpus-")
        ]
        counters = [c["name"] for s in slices for c in s["spec"].get("sharedCounters", [])]
        report.check(
            bool(sets) and counters == ["gpus"],
            f"the agent published {len(slices)} ResourceSlices: counter set {counters}, "
            f"8 GPUs and {len(sets)} GPU sets, best first (first four: {', '.join(sets[:4])})",
        )
        _story(report, rig, slices, devices)


def _story(
    report: Report, rig: rigging.Rig, slices: list[dict[str, Any]], devices: model.NodeDevices
) -> None:
    node_name = rig.node_name
    classes = simulator.builtin_classes(driver_name=rig.driver_name)
    names = {g.uuid: g.name for g in devices.gpus}
    busy = (rig.driver_name, node_name, "gpu-0")
    report.section("A pod already holds gpu-0: the node is fragmented")

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
            gpus = ", ".join(names[u] for u in outcome.gpus)
            results = ", ".join(r["device"] for r in outcome.allocation["devices"]["results"])
            same = results == gpus
            report.say(f"     kube-scheduler allocates: {results}" + ("" if same else f" = {gpus}"))
            report.say(
                f"     {outcome.score[0]} NVLink links between them; the best {SIZE} free GPUs "
                f"({', '.join(names[u] for u in best[0])}) have {best[1][0]}"
            )
        return outcome

    plain_claim = claimgen.claim(SIZE, nvlink="any", name="plain-4")
    report.say(f"\n  -- a plain claim for {SIZE} GPUs (dra-driver claim --gpus 4 --nvlink any)")
    report.block(yaml.safe_dump(plain_claim["spec"], sort_keys=False), indent="     ")
    plain = allocate(plain_claim)
    best_claim = claimgen.claim(SIZE, name="best-4")
    report.say(f"\n  -- the claim dra-driver claim --gpus {SIZE} writes")
    report.block(yaml.safe_dump(best_claim["spec"], sort_keys=False), indent="     ")
    best = allocate(best_claim)
    report.check(
        plain.score is not None and plain.score[0] == 5,
        "the plain claim gets 4 GPUs with 5 NVLink links (first fit: gpu-1 to gpu-4)",
    )
    report.check(
        best.score is not None and best.score[0] == 9 and len(best.gpus) == SIZE,
        "the generated claim gets the fully connected quad gpu-4 to gpu-7: 9 links, the best",
    )
    if best.allocation is None:
        return
    kubelet = sim.KubeletSim(rig.plugin.registry_dir)
    try:
        kubelet.register(rig.driver_name)
        _prepare(report, rig, kubelet, best_claim, best.allocation, devices)
        _overlap(report, rig, kubelet)
    finally:
        kubelet.close()


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
    report.section("Kubelet prepares the generated claim: the container gets exactly the set")
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
