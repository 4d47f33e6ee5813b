"""The devices this node can prepare, by the names our ResourceSlices publish.

Built once at start-up from the discovered device model: each full GPU (``gpu-<minor>``) and each
MIG device (:func:`~dra_driver.devices.model.mig_device_name`) with the character device nodes a
container needs to use it. MIG devices need the capability nodes under ``/dev/nvidia-caps`` whose
minor numbers the kernel driver lists in ``/proc/driver/nvidia-caps/mig-minors``; in fake mode we
make up stable ones, since those nodes are mapped to a harmless host node anyway.

GPUs handed to dynamic MIG (:mod:`dra_driver.devices.migprofiles`) list one device per profile
placement instead of their existing MIG devices: such a device has no UUID or capability nodes
until prepare creates its instance (``placement`` says what to create; :func:`created` gives the
device then), and its full GPU is marked ``dynamic`` (prepare turns MIG mode off for it).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path

from dra_driver.devices import migcontrol, migprofiles, model

MIG_MINORS_FILE = Path("/proc/driver/nvidia-caps/mig-minors")
_MIG_MINOR_LINE = re.compile(r"^(\S+)\s+(\d+)$")


@dataclasses.dataclass(frozen=True, slots=True)
class PreparableDevice:
    """A published device and what a container needs to use it."""

    name: str
    kind: str  # "gpu" or "mig"
    uuid: str
    parent_minor: int
    device_nodes: tuple[str, ...]  # container paths, e.g. /dev/nvidia0, /dev/nvidia-caps/...
    problem: str = ""  # non-empty: the device is known but cannot be prepared (why)
    placement: migcontrol.Placement | None = None  # dynamic MIG: the instance prepare creates
    dynamic: bool = False  # a full GPU whose MIG mode dynamic MIG manages


@dataclasses.dataclass(frozen=True, slots=True)
class Inventory:
    devices: Mapping[str, PreparableDevice]
    mig_minors: Mapping[str, int] | None = None  # None: fake mode

    def get(self, name: str) -> PreparableDevice | None:
        return self.devices.get(name)

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
    return Inventory(devices=devices, mig_minors=mig_minors)


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
