"""The devices this node can prepare, by the names our ResourceSlices publish.

Built once at start-up from the discovered device model: each full GPU (``gpu-<minor>``) and each
MIG device (:func:`~dra_driver.devices.model.mig_device_name`) with the character device nodes a
container needs to use it. MIG devices need the capability nodes under ``/dev/nvidia-caps`` whose
minor numbers the kernel driver lists in ``/proc/driver/nvidia-caps/mig-minors``; in fake mode we
make up stable ones, since those nodes are mapped to a harmless host node anyway.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path

from dra_driver.devices import model

MIG_MINORS_FILE = Path("/proc/driver/nvidia-caps/mig-minors")
_MIG_MINOR_LINE = re.compile(r"^(\S+)\s+(\d+)$")


@dataclasses.dataclass(frozen=True, slots=True)
class PreparableDevice:
    """A published device and what a container needs to use it."""

    name: str
    kind: str  # "gpu" or "mig"
    uuid: str
    device_nodes: tuple[str, ...]  # container paths, e.g. /dev/nvidia0, /dev/nvidia-caps/...
    problem: str = ""  # non-empty: the device is known but cannot be prepared (why)


@dataclasses.dataclass(frozen=True, slots=True)
class Inventory:
    devices: Mapping[str, PreparableDevice]

    def get(self, name: str) -> PreparableDevice | None:
        return self.devices.get(name)


def build(node: model.NodeDevices, *, mig_minors: Mapping[str, int] | None) -> Inventory:
    """Index ``node``'s devices by published name.

    ``mig_minors`` maps ``gpu<minor>/gi<id>/access`` and ``gpu<minor>/gi<id>/ci<id>/access`` to
    capability minors; ``None`` means fake mode (made-up but stable minors).
    """
    devices: dict[str, PreparableDevice] = {}
    for gpu in node.gpus:
        devices[gpu.name] = PreparableDevice(
            name=gpu.name,
            kind="gpu",
            uuid=gpu.uuid,
            device_nodes=(f"/dev/nvidia{gpu.minor}",),
        )
        for mig in gpu.mig_devices:
            name = model.mig_device_name(gpu, mig)
            nodes, problem = _mig_nodes(gpu, mig, mig_minors)
            devices[name] = PreparableDevice(
                name=name,
                kind="mig",
                uuid=mig.uuid,
                device_nodes=(f"/dev/nvidia{gpu.minor}", *nodes),
                problem=problem,
            )
    return Inventory(devices=devices)


def _mig_nodes(
    gpu: model.Gpu, mig: model.MigDevice, minors: Mapping[str, int] | None
) -> tuple[tuple[str, ...], str]:
    gi_key = f"gpu{gpu.minor}/gi{mig.gpu_instance_id}/access"
    ci_key = f"gpu{gpu.minor}/gi{mig.gpu_instance_id}/ci{mig.compute_instance_id}/access"
    if minors is None:
        # Fake mode: unique, stable numbers; the nodes map to a harmless host node.
        base = 3 + gpu.minor * 200 + mig.gpu_instance_id * 10
        found = {gi_key: base, ci_key: base + 1 + mig.compute_instance_id}
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
