"""The dynamic MIG demo scene: one H100 handed out as 1g.10gb, 2g.20gb and 3g.40gb claims.

Steps: the agent starts with ``--dynamic-mig all`` on the ``h100-mig`` profile and publishes one
device per MIG profile placement plus the full GPUs, with a counter set per GPU → three claims
arrive one after the other, each allocated by the structured-parameters allocator (counters
decide where an instance may go) and prepared through the kubelet's real socket: the NVML
stand-in shows the GPU instance made at the allocated placement, the CDI spec carries the new
MIG device → a fourth claim pinned to the same GPU cannot fit, with the counters' reason, and
the full GPU cannot be had while its MIG devices are out → the pods finish: unprepare destroys
the instances → the full GPU is allocatable again and its prepare turns MIG mode off.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path
from typing import Any

from dra_driver.allocation import allocator, pools, simulator
from dra_driver.demo import report as reporting
from dra_driver.demo import rig as rigging
from dra_driver.devices import fake, migprofiles, nvml
from dra_driver.devices.fake import migstate
from dra_driver.driver import claims
from dra_driver.testing import kubeletsim as sim

PROFILE = "h100-mig"
NAMESPACE = rigging.NAMESPACE
STEPS = (("small", "1g.10gb"), ("medium", "2g.20gb"), ("large", "3g.40gb"))
Report = reporting.Report


@dataclasses.dataclass
class _Scene:
    report: Report
    rig: rigging.Rig
    kubelet: sim.KubeletSim
    gpu: Any  # model.Gpu of the GPU the story happens on
    used: set[pools.DeviceId] = dataclasses.field(default_factory=set)

    @property
    def state_file(self) -> Path:
        return self.rig.plugin.plugins_dir / self.rig.driver_name / "fake-mig-state.json"

    def instances(self) -> list[tuple[str, int, int]]:
        found = migstate.MigState({}, state_file=self.state_file).read()[self.gpu.uuid]
        return sorted((i.name, i.start, i.size) for i in found.instances)

    def mig_mode(self) -> str:
        found = migstate.MigState({}, state_file=self.state_file).read()[self.gpu.uuid]
        return "on" if found.mode == nvml.NVML_DEVICE_MIG_ENABLE else "off"


def scene(
    report: Report, *, base: Path, backend: fake.FakeBackend, node_name: str, driver_name: str
) -> None:
    """Run the dynamic MIG story on its own node (``h100-mig``, whatever ``--fake`` says)."""
    del backend  # this story needs MIG-capable GPUs
    mig_backend = fake.FakeBackend.from_name(PROFILE)
    devices = mig_backend.discover()
    gpu = devices.gpus[0]
    report.section(f"Dynamic MIG on {PROFILE}: MIG-capable GPUs, profiles read from NVML")
    for g in devices.gpus:
        report.say(
            f"  {g.name} {g.product_name}: MIG mode {'on' if g.mig_enabled else 'off'}, "
            f"{len(migprofiles.placements(g))} placements of {len(g.mig_profiles)} profiles"
        )
    for profile in gpu.mig_profiles:
        starts = ",".join(str(s) for s, _ in profile.placements)
        size = profile.placements[0][1] if profile.placements else 0
        report.say(f"    {profile.name:<11} id {profile.id:>2}  placements {{{starts}}}:{size}")
    with rigging.node(
        report,
        base=base,
        backend=mig_backend,
        node_name=node_name,
        driver_name=driver_name,
        extra=("--dynamic-mig", "all"),
    ) as rig:
        kubelet = sim.KubeletSim(rig.plugin.registry_dir)
        try:
            kubelet.register(driver_name)
            _story(_Scene(report=report, rig=rig, kubelet=kubelet, gpu=gpu))
        finally:
            kubelet.close()


def _story(s: _Scene) -> None:
    report, rig = s.report, s.rig
    slices = rig.slices()
    devices = [d for sl in slices for d in sl["spec"].get("devices", [])]
    sets = [c for sl in slices for c in sl["spec"].get("sharedCounters", [])]
    report.section("The agent publishes partitionable devices (--dynamic-mig all)")
    report.check(
        len(devices) == 2 * (1 + len(migprofiles.placements(s.gpu))) and len(sets) >= 2,
        f"{len(slices)} ResourceSlice(s): {len(devices)} devices (per GPU the full GPU and one "
        f"per placement), counter sets {', '.join(c['name'] for c in sets)}",
    )
    mine = next(c for c in sets if c["name"] == f"gpu-{s.gpu.minor}-mig")
    counters = ", ".join(f"{k}={v['value']}" for k, v in mine["counters"].items())
    report.say(f"  counter set {mine['name']}: {counters}")
    for name in (f"gpu-{s.gpu.minor}", f"gpu-{s.gpu.minor}-mig-3g-40gb-4"):
        shown = next(d for d in devices if d["name"] == name)
        report.say(f"  {name} consumes:")
        for use in shown["consumesCounters"]:
            amounts = ", ".join(f"{k}={v['value']}" for k, v in use["counters"].items())
            report.say(f"    {use['counterSet']}: {amounts}")

    report.section("Three claims arrive one after the other; each gets its instance")
    prepared: list[claims.ClaimRef] = []
    for name, profile in STEPS:
        ref = _claim_and_prepare(s, slices, name, profile)
        if ref is not None:
            prepared.append(ref)
    layout = s.instances()
    report.check(
        layout == [("1g.10gb", 0, 1), ("2g.20gb", 2, 2), ("3g.40gb", 4, 4)],
        f"GPU {s.gpu.name} now holds {layout} (memory slice 1 and one compute slice stay free)",
    )

    report.section("What no longer fits on that GPU, and why")
    for name, selector in (
        ("too-big", f'device.attributes["{rig.driver_name}"].profile == "4g.40gb"'),
        ("whole-gpu", f'device.attributes["{rig.driver_name}"].type == "gpu"'),
    ):
        klass = "gpu" if name == "whole-gpu" else "mig"
        outcome = _allocate(s, slices, name, selector, klass=klass)
        report.check(
            outcome.allocation is None, f"claim {name} on {s.gpu.name} cannot be allocated"
        )
        why = [line.strip() for line in outcome.explanation if "compute slices" in line]
        report.check(bool(why), "the simulator says why, in MIG terms:")
        report.block("\n".join(why), indent="      ")

    report.section("The pods finish: unprepare destroys the instances")
    answer = s.kubelet.unprepare(prepared)
    report.check(
        all(not answer.claims[r.uid].error for r in prepared) and s.instances() == [],
        f"all three unprepared; instances left on {s.gpu.name}: {s.instances()}",
    )
    for ref in prepared:
        rig.api.delete_resource_claim(NAMESPACE, ref.name)
    s.used.clear()

    report.section("The full GPU is free again: preparing it turns MIG mode off")
    outcome = _allocate(
        s, slices, "whole", f'device.attributes["{rig.driver_name}"].type == "gpu"', klass="gpu"
    )
    ok = outcome.allocation is not None
    report.check(ok, f"claim whole allocated: {_devices(outcome)}")
    if ok:
        ref = _put_allocated(s, "whole", outcome)
        error = s.kubelet.prepare([ref]).claims[ref.uid].error
        report.check(
            not error, f"whole prepared{f': {error}' if error else ''}; MIG mode {s.mig_mode()}"
        )
        report.check(s.mig_mode() == "off", f"{s.gpu.name}: MIG mode switched off for the full GPU")
        report.check(not s.kubelet.unprepare([ref]).claims[ref.uid].error, "whole unprepared")


def _claim_and_prepare(
    s: _Scene, slices: list[dict[str, Any]], name: str, profile: str
) -> claims.ClaimRef | None:
    selector = f'device.attributes["{s.rig.driver_name}"].profile == "{profile}"'
    outcome = _allocate(s, slices, name, selector, klass="mig")
    if not s.report.check(
        outcome.allocation is not None, f"{name} ({profile}): allocated {_devices(outcome)}"
    ):
        s.report.block(simulator.render(outcome, node_name=s.rig.node_name), indent="    ")
        return None
    ref = _put_allocated(s, name, outcome)
    answer = s.kubelet.prepare([ref]).claims[ref.uid]
    if not s.report.check(
        not answer.error, f"{name}: prepared{f' — {answer.error}' if answer.error else ''}"
    ):
        return None
    spec_path = s.rig.spec_file(ref.uid)
    env = json.loads(spec_path.read_text())["containerEdits"]["env"] if spec_path else []
    visible = next((e for e in env if e.startswith("NVIDIA_VISIBLE_DEVICES=")), "")
    s.report.say(f"      GPU instances now: {s.instances()}; CDI spec: {visible}")
    s.report.check(
        visible.startswith("NVIDIA_VISIBLE_DEVICES=MIG-"),
        f"{name}: the container gets the new MIG device",
    )
    return ref


def _allocate(
    s: _Scene, slices: list[dict[str, Any]], name: str, selector: str, *, klass: str
) -> allocator.Outcome:
    pinned = f'device.attributes["{s.rig.driver_name}"].'
    pinned += "uuid" if klass == "gpu" else "parentUUID"
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "dev",
                        "exactly": {
                            "deviceClassName": f"{klass}.nvidia.com",
                            "selectors": [
                                {"cel": {"expression": selector}},
                                {"cel": {"expression": f'{pinned} == "{s.gpu.uuid}"'}},
                            ],
                        },
                    }
                ]
            }
        },
    }
    created = s.rig.api.create_resource_claim(claim)
    return allocator.allocate(
        created,
        slices=slices,
        classes=simulator.builtin_classes(driver_name=s.rig.driver_name),
        node_name=s.rig.node_name,
        allocated=s.used,
    )


def _put_allocated(s: _Scene, name: str, outcome: allocator.Outcome) -> claims.ClaimRef:
    if outcome.allocation is None:
        raise ValueError(f"claim {name} was not allocated")
    s.used |= pools.allocated_ids([outcome.allocation["devices"]])
    obj = s.rig.api.get_resource_claim(NAMESPACE, name)
    status = {
        "allocation": outcome.allocation,
        "reservedFor": [{"resource": "pods", "name": name, "uid": str(uuid.uuid4())}],
    }
    put = s.rig.api.put_resource_claim({**obj, "status": status})
    meta = put["metadata"]
    return claims.ClaimRef(uid=meta["uid"], namespace=meta["namespace"], name=meta["name"])


def _devices(outcome: allocator.Outcome) -> str:
    if outcome.allocation is None:
        return "nothing"
    return ", ".join(r["device"] for r in outcome.allocation["devices"]["results"])
