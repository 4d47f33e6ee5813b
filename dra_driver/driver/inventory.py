"""The devices this node can prepare, by the names our ResourceSlices publish.

Built once at start-up from the discovered device model: each full GPU (``gpu-<minor>``) and each
MIG device (:func:`~dra_driver.devices.model.mig_device_name`) with the character device nodes a
container needs to use it. MIG devices need the capability nodes under ``/dev/nvidia-caps`` whose
minor numbers the kernel driver lists in ``/proc/driver/nvidia-caps/mig-minors``; in fake mode we
make up stable ones, since those nodes are mapped to a harmless host node anyway.

A GPU-set device (``gpus-0-1-4-5``, docs/topology.md) stands for the full GPUs its name lists:
it is prepared as exactly those GPUs (their device nodes, their UUIDs in
``NVIDIA_VISIBLE_DEVICES``). :func:`overlaps` finds a claim's devices that share a GPU.

GPUs handed to dynamic MIG (:mod:`dra_driver.devices.migprofiles`) list one device per profile
placement instead of their existing MIG devices: such a device has no UUID or capability nodes
until prepare creates its instance (``placement`` says what to create; :meth:`Inventory.created`
gives the device then), and its full GPU is marked ``dynamic`` (prepare turns MIG mode off for
it, alone or in a set).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from dra_driver import records
from dra_driver.devices import gpusets, migcontrol, migprofiles, model, passthrough

MIG_MINORS_FILE = Path("/proc/driver/nvidia-caps/mig-minors")
_MIG_MINOR_LINE = re.compile(r"^(\S+)\s+(\d+)$")


@records.record
class PreparableDevice:
    """A published device and what a container needs to use it."""

    name: str
    kind: str  # "gpu", "mig" or "gpu-set"
    uuid: str  # a set: its members' UUIDs joined by "," in minor order
    parent_minor: int  # a set: its first member's minor
    device_nodes: tuple[str, ...]  # container paths, e.g. /dev/nvidia0, /dev/nvidia-caps/...
    problem: str = ""  # non-empty: the device is known but cannot be prepared (why)
    placement: migcontrol.Placement | None = None  # dynamic MIG: the instance prepare creates
    dynamic: bool = False  # a full GPU whose MIG mode dynamic MIG manages
    members: tuple[PreparableDevice, ...] = ()  # a set: its full GPUs

    @property
    def gpu_minors(self) -> tuple[int, ...]:
        """The physical GPUs this device uses (a MIG device: part of its parent)."""
        if self.members:
            return tuple(m.parent_minor for m in self.members)
        return (self.parent_minor,)

    @property
    def gpu_names(self) -> tuple[str, ...]:
        """The full GPUs (published names, ``gpu-<minor>``) a claim of this device holds: a
        GPU itself, a set's members, a MIG device's parent."""
        return tuple(f"gpu-{minor}" for minor in self.gpu_minors)


@records.record
class Inventory:
    devices: Mapping[str, PreparableDevice]
    settable: frozenset[str] = frozenset()  # full GPUs (not in MIG mode, or dynamic): set members
    mig_minors: Mapping[str, int] | None = None  # None: fake mode
    # The discovered model it was built from (PCI, NUMA, NVLink, MIG profiles: claim metadata).
    node: model.NodeDevices | None = None

    def get(self, name: str) -> PreparableDevice | None:
        """The device published as ``name``; a set name maps to its member GPUs."""
        found = self.devices.get(name)
        if found is not None:
            return found
        minors = gpusets.parse_name(name)
        if minors is None:
            return None
        members = [self.devices.get(f"gpu-{m}") for m in minors]
        if any(m is None or m.name not in self.settable for m in members):
            return None
        full = tuple(m for m in members if m is not None)
        return PreparableDevice(
            name=name,
            kind="gpu-set",
            uuid=",".join(m.uuid for m in full),
            parent_minor=full[0].parent_minor,
            device_nodes=tuple(n for m in full for n in m.device_nodes),
            problem="; ".join(m.problem for m in full if m.problem),
            members=full,
        )

    def created(self, planned: PreparableDevice, instance: migcontrol.Instance) -> PreparableDevice:
        """The dynamic MIG device ``planned`` once its instance exists (UUID, capability nodes)."""
        nodes, problem = mig_nodes(
            planned.parent_minor,
            instance.gpu_instance_id,
            instance.compute_instance_id or 0,
            self.mig_minors,
        )
        return dataclasses.replace(
            planned,
            uuid=instance.uuid or "",
            device_nodes=(f"/dev/nvidia{planned.parent_minor}", *nodes),
            problem=problem,
        )


def overlaps(
    devices: Sequence[tuple[str, PreparableDevice]], *, shares: Sequence[bool] = ()
) -> list[str]:
    """Pairs of a claim's devices that use one physical GPU (``(result label, device)``).

    A whole GPU (alone or in a set) may not appear twice, nor next to a MIG device of itself;
    MIG devices of one GPU may. Shares of one device (``shares[i]``: result ``i`` has a
    shareID) count once: the scheduler gives two requests of a claim shares of one
    multi-allocatable device. Returns one message per clash, naming both devices and the GPU.
    """
    clashes: list[str] = []
    seen: dict[int, list[tuple[str, bool]]] = {}
    shared: set[str] = set()
    for i, (label, dev) in enumerate(devices):
        if i < len(shares) and shares[i]:
            if dev.name in shared:
                continue
            shared.add(dev.name)
        whole = dev.kind != "mig"
        for minor in dev.gpu_minors:
            for other, other_whole in seen.get(minor, []):
                if whole or other_whole:
                    clashes.append(f"{other} and {label} both use GPU gpu-{minor}")
            seen.setdefault(minor, []).append((label, whole))
    return list(dict.fromkeys(clashes))


def build(
    node: model.NodeDevices,
    *,
    mig_minors: Mapping[str, int] | None,
    dynamic: migprofiles.DynamicMig = migprofiles.STATIC,
) -> Inventory:
    """Index ``node``'s devices by published name.

    ``mig_minors`` maps ``gpu<minor>/gi<id>/access`` and ``gpu<minor>/gi<id>/ci<id>/access`` to
    capability minors; ``None`` means fake mode (made-up but stable minors).
    """
    devices: dict[str, PreparableDevice] = {}
    for gpu in node.gpus:
        is_dynamic = dynamic.selects(gpu)
        devices[gpu.name] = PreparableDevice(
            name=gpu.name,
            kind="gpu",
            uuid=gpu.uuid,
            parent_minor=gpu.minor,
            device_nodes=(f"/dev/nvidia{gpu.minor}",),
            dynamic=is_dynamic,
        )
        if is_dynamic:
            for place in migprofiles.placements(gpu):
                devices[place.name] = PreparableDevice(
                    name=place.name,
                    kind="mig",
                    uuid="",
                    parent_minor=gpu.minor,
                    device_nodes=(f"/dev/nvidia{gpu.minor}",),
                    placement=migcontrol.Placement(
                        parent_uuid=gpu.uuid,
                        profile=place.profile.name,
                        profile_id=place.profile.id,
                        profile_slot=place.profile.slot,
                        start=place.start,
                        size=place.size,
                    ),
                )
            continue
        for mig in gpu.mig_devices:
            name = model.mig_device_name(gpu, mig)
            nodes, problem = mig_nodes(
                gpu.minor, mig.gpu_instance_id, mig.compute_instance_id, mig_minors
            )
            devices[name] = PreparableDevice(
                name=name,
                kind="mig",
                uuid=mig.uuid,
                parent_minor=gpu.minor,
                device_nodes=(f"/dev/nvidia{gpu.minor}", *nodes),
                problem=problem,
            )
    devices.update(passthrough_devices(node))  # GPUs offered to VMs too (docs/passthrough.md)
    settable = frozenset(g.name for g in node.gpus if not g.mig_enabled or dynamic.selects(g))
    return Inventory(devices=devices, settable=settable, mig_minors=mig_minors, node=node)


def passthrough_devices(node: model.NodeDevices) -> dict[str, PreparableDevice]:
    """``gpu-vfio-<minor>`` of each GPU offered for passthrough (kind ``vfio``): its nodes are
    the ``/dev/vfio`` ones prepare finds once the GPU is on vfio-pci (:mod:`.vfio`)."""
    return {
        passthrough.device_name(g): PreparableDevice(
            name=passthrough.device_name(g),
            kind=passthrough.DEVICE_TYPE,
            uuid=g.uuid,
            parent_minor=g.minor,
            device_nodes=(),
        )
        for g in passthrough.marked(node)
    }


def mig_nodes(
    minor: int, gi: int, ci: int, minors: Mapping[str, int] | None
) -> tuple[tuple[str, ...], str]:
    """Capability nodes of GPU instance ``gi`` / compute instance ``ci`` on GPU ``minor``."""
    gi_key = f"gpu{minor}/gi{gi}/access"
    ci_key = f"gpu{minor}/gi{gi}/ci{ci}/access"
    if minors is None:
        # Fake mode: unique, stable numbers; the nodes map to a harmless host node.
        base = 3 + minor * 200 + gi * 10
        found = {gi_key: base, ci_key: base + 1 + ci}
    else:
        found = {k: minors[k] for k in (gi_key, ci_key) if k in minors}
    missing = [k for k in (gi_key, ci_key) if k not in found]
    if missing:
        return (), (
            f"no capability minor for {', '.join(missing)} in {MIG_MINORS_FILE} "
            "(is the MIG device still there?)"
        )
    return tuple(f"/dev/nvidia-caps/nvidia-cap{found[k]}" for k in (gi_key, ci_key)), ""


def parse_mig_minors(text: str) -> dict[str, int]:
    """Parse the kernel driver's ``mig-minors`` table (``gpu0/gi1/access 12`` per line)."""
    table: dict[str, int] = {}
    for line in text.splitlines():
        match = _MIG_MINOR_LINE.match(line.strip())
        if match:
            table[match.group(1)] = int(match.group(2))
    return table


def read_mig_minors(path: Path = MIG_MINORS_FILE) -> dict[str, int]:
    """The host's table; empty when the file is missing (no MIG support loaded)."""
    try:
        return parse_mig_minors(path.read_text())
    except FileNotFoundError:
        return {}
