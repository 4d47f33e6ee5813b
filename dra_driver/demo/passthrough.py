"""The passthrough demo scene: a GPU goes to a VM claim and comes back, the scheduler refusing a
container claim for it in between.

Steps: a fake kernel (real sysfs-like files and symlinks, a thread that moves driver links:
:mod:`dra_driver.testing.fakesysfs`) stands in for the host's ``/sys`` and ``/dev/vfio``; the
agent starts with ``--passthrough all --vfio-root`` on ``pcie-l4`` and publishes every GPU twice,
``gpu-<minor>`` and ``gpu-vfio-<minor>``, sharing a counter → a VM claim (``vfio.gpu.nvidia.com``)
for gpu-0 is allocated by the structured-parameters allocator and prepared through the kubelet's
socket: the GPU's driver link is vfio-pci, the CDI spec holds its /dev/vfio nodes only → a
container claim for the same GPU cannot be allocated (the counter is taken) → the VM goes:
unprepare binds the GPU back to nvidia, and the container claim gets it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dra_driver.allocation import allocator, pools, simulator
from dra_driver.demo import report as reporting
from dra_driver.demo import rig as rigging
from dra_driver.devices import fake, passthrough
from dra_driver.driver import claims
from dra_driver.testing import fakesysfs
from dra_driver.testing import kubeletsim as sim

PROFILE = "pcie-l4"
NAMESPACE = rigging.NAMESPACE
Report = reporting.Report


def scene(
    report: Report, *, base: Path, backend: fake.FakeBackend, node_name: str, driver_name: str
) -> None:
    """Run the passthrough story on its own node (``pcie-l4``, whatever ``--fake`` says)."""
    del backend
    own = fake.FakeBackend.from_name(PROFILE)
    devices = own.discover()
    gpu = devices.gpus[0]
    report.section(f"VFIO passthrough on {PROFILE}: every GPU offered to VMs too")
    for g in devices.gpus:
        report.say(f"  {g.name} {g.pci_bus_id}: IOMMU group {g.iommu_group}")
    with fakesysfs.running(base / "host", fakesysfs.groups_of(devices)) as kernel:
        extra = ("--passthrough", "all", "--vfio-root", str(kernel.root))
        with rigging.node(
            report, base=base, backend=own, node_name=node_name, driver_name=driver_name,
            extra=extra,
        ) as rig:  # fmt: skip
            kubelet = sim.KubeletSim(rig.plugin.registry_dir)
            try:
                kubelet.register(driver_name)
                _story(report, rig, kubelet, kernel, gpu)
            finally:
                kubelet.close()


def _story(
    report: Report, rig: rigging.Rig, kubelet: sim.KubeletSim, kernel: fakesysfs.FakeKernel,
    gpu: Any,
) -> None:  # fmt: skip
    slices = rig.slices()
    devices = [d for sl in slices for d in sl["spec"].get("devices", [])]
    vfio = [d["name"] for d in devices if d["attributes"]["type"]["string"] == "vfio"]
    sets = [c["name"] for sl in slices for c in sl["spec"].get("sharedCounters", [])]
    report.section("The agent publishes each GPU twice (--passthrough all)")
    report.check(
        len(vfio) == 4 and len(sets) == 4,
        f"{len(devices)} devices: passthrough devices {', '.join(vfio)}; counter sets "
        f"{', '.join(sets)} (each GPU's two devices consume its counter)",
    )
    used: set[pools.DeviceId] = set()

    report.section(f"A VM claim for {gpu.name}: bound to vfio-pci at prepare")
    vm = _allocate(rig, slices, used, "vm", passthrough.DEVICE_CLASS, gpu.uuid)
    report.check(vm.allocation is not None, f"vm allocated: {_devices(vm)}")
    ref = _put(rig, used, "vm", vm)
    error = kubelet.prepare([ref]).claims[ref.uid].error
    report.check(not error, f"vm prepared{f': {error}' if error else ''}")
    report.check(
        kernel.driver_of(gpu.pci_bus_id) == "vfio-pci",
        f"{gpu.pci_bus_id}: driver link is now {kernel.driver_of(gpu.pci_bus_id)}",
    )
    spec = rig.spec_file(ref.uid)
    nodes = (
        [n["path"] for d in json.loads(spec.read_text())["devices"]
         for n in d["containerEdits"]["deviceNodes"]]
        if spec else []
    )  # fmt: skip
    report.check(
        nodes == [f"/dev/vfio/{gpu.iommu_group}", "/dev/vfio/vfio"],
        f"the CDI spec gives the VM's pod exactly {', '.join(nodes)}",
    )

    report.section(f"Meanwhile a container claim for {gpu.name} cannot be allocated")
    pod = _allocate(rig, slices, used, "pod", "gpu.nvidia.com", gpu.uuid)
    report.check(pod.allocation is None, "pod: not allocatable while the VM holds the GPU")
    why = [line.strip() for line in pod.explanation if line.strip()][:3]
    report.block("\n".join(why), indent="      ")
    rig.api.delete_resource_claim(NAMESPACE, "pod")

    report.section("The VM goes: the GPU is bound back to nvidia, containers can have it")
    answer = kubelet.unprepare([ref]).claims[ref.uid].error
    report.check(not answer, f"vm unprepared{f': {answer}' if answer else ''}")
    report.check(
        kernel.driver_of(gpu.pci_bus_id) == "nvidia",
        f"{gpu.pci_bus_id}: driver link is {kernel.driver_of(gpu.pci_bus_id)} again",
    )
    rig.api.delete_resource_claim(NAMESPACE, "vm")
    used.clear()
    again = _allocate(rig, slices, used, "pod", "gpu.nvidia.com", gpu.uuid)
    report.check(again.allocation is not None, f"pod allocated now: {_devices(again)}")


def _allocate(
    rig: rigging.Rig, slices: list[dict[str, Any]], used: set[pools.DeviceId], name: str,
    klass: str, uuid: str,
) -> allocator.Outcome:  # fmt: skip
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": klass,
            "selectors": [{"cel": {"expression":
                f'device.attributes["{rig.driver_name}"].uuid == "{uuid}"'}}],
        }}]}},
    }  # fmt: skip
    created = rig.api.create_resource_claim(claim)
    return allocator.allocate(
        created,
        slices=slices,
        classes=simulator.builtin_classes(driver_name=rig.driver_name),
        node_name=rig.node_name,
        allocated=used,
    )


def _put(
    rig: rigging.Rig, used: set[pools.DeviceId], name: str, outcome: allocator.Outcome
) -> claims.ClaimRef:
    if outcome.allocation is None:
        raise ValueError(f"claim {name} was not allocated")
    used |= pools.allocated_ids([outcome.allocation["devices"]])
    obj = rig.api.get_resource_claim(NAMESPACE, name)
    put = rig.api.put_resource_claim({**obj, "status": {"allocation": outcome.allocation}})
    meta = put["metadata"]
    return claims.ClaimRef(uid=meta["uid"], namespace=meta["namespace"], name=meta["name"])


def _devices(outcome: allocator.Outcome) -> str:
    if outcome.allocation is None:
        return "nothing"
    return ", ".join(r["device"] for r in outcome.allocation["devices"]["results"])
