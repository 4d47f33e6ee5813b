"""The core demo scene: one node through the whole pipeline, with the shipped example claims.

Steps: discover → the agent publishes ResourceSlices → the example claims are allocated (the
structured-parameters allocator playing kube-scheduler) in two waves of pods → the kubelet
registers the plugin, prepares every allocated claim (CDI specs appear), unprepares them (specs
go) → SIGTERM.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

from dra_driver import examples
from dra_driver.allocation import allocator, pools, simulator
from dra_driver.demo import report as reporting
from dra_driver.demo import rig as rigging
from dra_driver.devices import fake, model, render, topology
from dra_driver.driver import claims
from dra_driver.testing import kubeletsim as sim
from dra_driver.testing.fakeapi import memory

# The shipped examples in two waves of pods: the first wave's pods finish (their claims are
# unprepared and deleted) before the second wave arrives, as on a busy node.
WAVES = (
    ("one-gpu", "two-gpus-nvlink", "gpus-one-numa-node"),
    ("h100-40gi", "shared-by-two-containers", "h100-or-any-gpu", "mig-1g", "cannot-fit"),
)
NAMESPACE = rigging.NAMESPACE
# The MIG example asks for an A100 40GB profile: static MIG devices of a node in MIG mode. The
# default dgx-h100's GPUs are MIG-capable with MIG off (no MIG devices): there it cannot fit.
MIG_EXAMPLE, MIG_EXAMPLE_PROFILE = "mig-1g", "1g.5gb"
Report = reporting.Report


@dataclasses.dataclass
class Claim:
    """One example claim as the demo handles it."""

    example: str
    obj: dict[str, Any]
    outcome: allocator.Outcome | None = None

    @property
    def ref(self) -> claims.ClaimRef:
        meta = self.obj["metadata"]
        return claims.ClaimRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


def scene(
    report: Report, *, base: Path, backend: fake.FakeBackend, node_name: str, driver_name: str
) -> None:
    """Discover, publish, allocate the examples in two waves, prepare and unprepare them."""
    devices = backend.discover()
    report.section("Discover the node's GPUs (fake NVML, same code path as real GPUs)")
    report.block(render.render_table(devices, topology.build(devices)))
    with rigging.node(
        report, base=base, backend=backend, node_name=node_name, driver_name=driver_name
    ) as rig:
        _pipeline(report, rig, node_devices=devices)


def _pipeline(report: Report, rig: rigging.Rig, *, node_devices: model.NodeDevices) -> None:
    api, plugin = rig.api, rig.plugin
    node_name, driver_name = rig.node_name, rig.driver_name
    report.section("Start the node agent (kubelet plugin + ResourceSlice publisher)")
    report.say(
        f"  dra-driver kubelet-plugin running as pid {plugin.proc.pid if plugin.proc else '?'}"
        f"; log: {plugin.log_path}"
    )
    slices = rig.slices()
    published = sum(len(s["spec"].get("devices", [])) for s in slices)
    report.check(
        bool(slices),
        f"published {len(slices)} ResourceSlice(s) with {published} "
        f"device(s) for pool {node_name!r}",
    )
    writes = api.writes
    time.sleep(0.3)
    report.check(api.writes == writes, "no further API writes while nothing changes")
    report.section("The ResourceSlices as the API server stores them")
    for obj in slices:
        report.block(yaml.safe_dump(rigging.trim(obj), sort_keys=False))

    kubelet = sim.KubeletSim(plugin.registry_dir)
    try:
        report.section("Kubelet: register the plugin (plugin registration over the real socket)")
        info = kubelet.register(driver_name)
        report.say(f"  GetInfo: type={info.type} name={info.name} endpoint={info.endpoint}")
        report.say(f"           supported_versions={list(info.supported_versions)}")
        report.check(kubelet.version == "v1.DRAPlugin", f"kubelet picked {kubelet.version}")
        for wave, names in enumerate(WAVES, start=1):
            report.section(
                f"Wave {wave} of pods: allocate their claims (the structured-"
                "parameters allocator playing kube-scheduler)"
            )
            demo_claims = _allocate(
                report,
                api,
                slices,
                names,
                node_name=node_name,
                driver_name=driver_name,
                node_devices=node_devices,
            )
            allocated = [c for c in demo_claims if c.outcome and c.outcome.allocation]
            _prepare_all(report, kubelet, plugin, allocated, wave=wave)
            _unprepare_all(report, kubelet, plugin, allocated, wave=wave)
            for claim in demo_claims:
                api.delete_resource_claim(NAMESPACE, claim.obj["metadata"]["name"])
    finally:
        kubelet.close()


def _allocate(
    report: Report,
    api: memory.InMemoryApi,
    slices: list[dict[str, Any]],
    names: tuple[str, ...],
    *,
    node_name: str,
    driver_name: str,
    node_devices: Any,
) -> list[Claim]:
    classes = simulator.builtin_classes(driver_name=driver_name)
    used: set[pools.DeviceId] = set()
    out: list[Claim] = []
    for name in names:
        docs = examples.load(name)
        created = api.create_resource_claim(rigging.claim_from(docs, name=name))
        claim = Claim(example=name, obj=created)
        outcome = allocator.allocate(
            created,
            slices=slices,
            classes=classes,
            node_name=node_name,
            allocated=used,
            node_devices=node_devices,
        )
        claim.outcome = outcome
        out.append(claim)
        report.say(
            f"\n  -- example {name} (ResourceClaim {NAMESPACE}/{created['metadata']['name']})"
        )
        report.block(_request_summary(created), indent="     ")
        report.say(f"     used by {_pod_summary(docs)}")
        if outcome.allocation is None:
            report.block(simulator.render(outcome, node_name=node_name), indent="     ")
            report.check(bool(outcome.explanation), "unsatisfiable, with an explanation")
            if name == MIG_EXAMPLE:
                report.check(
                    not _mig_profiles(node_devices) & {MIG_EXAMPLE_PROFILE},
                    f"this node has no {MIG_EXAMPLE_PROFILE} MIG device "
                    f"(MIG devices here: {sorted(_mig_profiles(node_devices)) or 'none'}; "
                    "`--fake a100-mig` has them, the mig scene creates instances at prepare)",
                )
            continue
        results = outcome.allocation["devices"]["results"]
        report.say(
            "     allocated: "
            + ", ".join(f"{r['device']} (request {r['request']})" for r in results)
        )
        if outcome.score is not None and len(results) > 1:
            links, numa, root = outcome.score
            report.say(
                f"     placement: {links} NVLink links inside the set, {numa} pair(s) on "
                f"one NUMA node, {root} pair(s) under one PCIe root"
            )
        used |= pools.allocated_ids([outcome.allocation["devices"]])
        status = {
            "allocation": outcome.allocation,
            "reservedFor": [{"resource": "pods", "name": name, "uid": str(uuid.uuid4())}],
        }
        claim.obj = api.put_resource_claim({**created, "status": status})
    return out


def _mig_profiles(node_devices: model.NodeDevices) -> set[str]:
    return {m.profile for gpu in node_devices.gpus for m in gpu.mig_devices}


def _prepare_all(
    report: Report,
    kubelet: sim.KubeletSim,
    plugin: sim.PluginProcess,
    allocated: list[Claim],
    *,
    wave: int,
) -> None:
    report.section(
        f"Wave {wave}: kubelet calls NodePrepareResources for each pod's claim "
        "(DRA v1 over dra.sock)"
    )
    for claim in allocated:
        ref = claim.ref
        started = time.perf_counter()
        answer = kubelet.prepare([ref]).claims[ref.uid]
        ms = (time.perf_counter() - started) * 1000
        if not report.check(
            not answer.error,
            f"{claim.example}: prepared in {ms:.1f} ms"
            + (f" — error: {answer.error}" if answer.error else ""),
        ):
            continue
        for dev in answer.devices:
            report.say(
                f"      {dev.device_name}: requests {list(dev.request_names) or ['(all)']}"
                f", CDI {list(dev.cdi_device_ids)}"
            )
        spec = rigging.spec_file(plugin, ref.uid)
        report.check(spec is not None, f"{claim.example}: CDI spec written")
    if allocated and wave == 1:
        first = allocated[0].ref
        again = kubelet.prepare([first]).claims[first.uid]
        report.check(not again.error, "preparing the first claim again is idempotent")
        shown = next((c for c in allocated if c.example == "two-gpus-nvlink"), allocated[0])
        spec = rigging.spec_file(plugin, shown.ref.uid)
        if spec is not None:
            report.say(f"\n  CDI spec of {shown.example}: {spec}")
            report.block(json.dumps(json.loads(spec.read_text()), indent=2), indent="    ")


def _unprepare_all(
    report: Report,
    kubelet: sim.KubeletSim,
    plugin: sim.PluginProcess,
    allocated: list[Claim],
    *,
    wave: int,
) -> None:
    report.section(f"Wave {wave}: the pods finish; kubelet calls NodeUnprepareResources")
    refs = [c.ref for c in allocated]
    answer = kubelet.unprepare(refs) if refs else None
    for claim in allocated:
        error = answer.claims[claim.ref.uid].error if answer else ""
        report.check(
            not error and rigging.spec_file(plugin, claim.ref.uid) is None,
            f"{claim.example}: unprepared, CDI spec removed"
            + (f" — error: {error}" if error else ""),
        )
    if refs:
        again = kubelet.unprepare(refs[:1]).claims[refs[0].uid]
        report.check(not again.error, "unpreparing again is a no-op success")


def _request_summary(obj: dict[str, Any]) -> str:
    devices = obj["spec"]["devices"]
    return yaml.safe_dump(
        {k: devices[k] for k in ("requests", "constraints") if k in devices}, sort_keys=False
    )


def _pod_summary(docs: list[dict[str, Any]]) -> str:
    """Which containers of the example's Pod use which claim (and request)."""
    pod = next((d for d in docs if d.get("kind") == "Pod"), None)
    if pod is None:
        return "no pod"
    uses = []
    for container in pod["spec"].get("containers", []):
        for ref in (container.get("resources") or {}).get("claims", []):
            request = f"/{ref['request']}" if ref.get("request") else ""
            uses.append(f"container {container['name']} → claim {ref['name']}{request}")
    return f"pod {pod['metadata']['name']}: " + ("; ".join(uses) or "no container uses it")
