"""Which device-plugin resources a node offers, and which devices each one lists.

The device plugin API knows only opaque device IDs per extended resource. This module is the
one place that turns the device model into those IDs: whole GPUs or MIG devices (by MIG
strategy), each optionally shared as ``--replicas N`` time-slicing replicas. Everything later
(preferred allocation, Allocate, health) looks devices up here, so an unknown ID is reported the
same way everywhere. Pure data, no gRPC.

The device nodes a unit needs (for a MIG device also its GPU/compute instance capability nodes
under ``/dev/nvidia-caps``) come from the DRA path's :mod:`dra_driver.driver.inventory`, so both
modes agree on them; a MIG device whose capability minors are missing keeps a ``problem``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping

from dra_driver import records
from dra_driver.apimachinery import names
from dra_driver.devices import model
from dra_driver.driver import inventory as preparable

REPLICA_SEPARATOR = "::"
MAX_DEVICE_ID = 63  # the device plugin API's limit on Device.ID
MAX_REPLICAS = 1000


class MigStrategy(enum.StrEnum):
    """How GPUs in MIG mode are offered (the same three strategies as NVIDIA's plugin)."""

    NONE = "none"  # whole GPUs only, MIG mode ignored
    SINGLE = "single"  # every GPU in MIG mode with one profile; MIG devices under resource_name
    MIXED = "mixed"  # whole GPUs under resource_name, MIG devices as <vendor>/mig-<profile>


class InventoryError(Exception):
    """The node's devices cannot be offered as configured (bad resource name, MIG layout...)."""


SHOWN_IDS = 8  # unknown IDs named in one error
SHOWN_ID_CHARS = 80  # characters of each


def _shown(device_id: str) -> str:
    """``device_id`` quoted for an error message, cut short when it is long."""
    if len(device_id) <= SHOWN_ID_CHARS:
        return repr(device_id)
    return f"{device_id[:SHOWN_ID_CHARS]!r}...({len(device_id)} characters)"


class RequestError(ValueError):
    """A kubelet request names devices or sizes this resource cannot satisfy."""


@records.record
class Unit:
    """Something a container can be given: a whole GPU or one MIG device."""

    uuid: str  # GPU or MIG UUID: the CDI device name and the NVIDIA_VISIBLE_DEVICES entry
    gpu_index: int  # the physical GPU (the parent for a MIG device)
    minor: int  # the physical GPU's /dev/nvidia<minor>
    numa_node: int | None
    # Container paths of the unit's own nodes: /dev/nvidia<minor> (+ MIG capability nodes).
    device_nodes: tuple[str, ...]
    mig: model.MigDevice | None = None
    # Health keys whose failure makes this unit unhealthy: its own UUID, plus the parent's.
    health_keys: tuple[str, ...] = ()
    problem: str = ""  # non-empty: the unit cannot be given to a container (why)
    memory_bytes: int = 0  # for MPS replicas' memory limits


@records.record
class PluginDevice:
    """One device as the kubelet sees it."""

    id: str
    unit: Unit
    replica: int | None = None  # None when replicas are off


@records.record
class Resource:
    """One extended resource: one socket, one registration, one ListAndWatch list."""

    name: str
    devices: tuple[PluginDevice, ...]

    def device(self, device_id: str) -> PluginDevice:
        for dev in self.devices:
            if dev.id == device_id:
                return dev
        raise RequestError(f"unknown device ID {_shown(device_id)} for resource {self.name}")

    def lookup(self, ids: Iterable[str], *, field: str) -> list[PluginDevice]:
        """Devices for ``ids`` (duplicates dropped, order kept); unknown IDs are all named."""
        known = {dev.id: dev for dev in self.devices}
        unique = list(dict.fromkeys(ids))
        unknown = [i for i in unique if i not in known]
        if unknown:
            # Named, but bounded: the message travels back in gRPC metadata (a few KiB at most).
            shown = ", ".join(_shown(i) for i in unknown[:SHOWN_IDS])
            if len(unknown) > SHOWN_IDS:
                shown += f" and {len(unknown) - SHOWN_IDS} more"
            raise RequestError(
                f"{field}: unknown device ID{'s' if len(unknown) > 1 else ''} {shown} "
                f"for resource {self.name} (this node lists {len(known)} devices)"
            )
        return [known[i] for i in unique]


def build(
    devices: model.NodeDevices,
    *,
    resource_name: str,
    mig_strategy: MigStrategy,
    mig_minors: Mapping[str, int] | None,
    replicas: int = 1,
) -> tuple[Resource, ...]:
    """All resources this node offers; the first is always ``resource_name`` (maybe empty).

    ``mig_minors``: the host's :func:`dra_driver.driver.inventory.read_mig_minors` table, or
    ``None`` with a fake backend (made-up stable capability minors).
    """
    if not names.is_extended_resource_name(resource_name):
        raise InventoryError(
            f"resource name {resource_name!r} is not a valid extended resource name "
            "(want <domain>/<name> outside kubernetes.io, e.g. nvidia.com/gpu)"
        )
    if not 1 <= replicas <= MAX_REPLICAS:
        raise InventoryError(f"--replicas must be between 1 and {MAX_REPLICAS}, got {replicas}")
    nodes = preparable.build(devices, mig_minors=mig_minors)
    grouped: dict[str, list[Unit]] = {resource_name: []}
    mig_gpus = [g for g in devices.gpus if g.mig_enabled]
    if mig_strategy is MigStrategy.NONE or (mig_strategy is MigStrategy.SINGLE and not mig_gpus):
        grouped[resource_name] = [_whole(g, nodes) for g in devices.gpus]
    elif mig_strategy is MigStrategy.SINGLE:
        _check_single(devices.gpus)
        grouped[resource_name] = [_mig(g, m, nodes) for g in mig_gpus for m in _ordered(g)]
    else:
        vendor = resource_name.split("/", 1)[0]
        grouped[resource_name] = [_whole(g, nodes) for g in devices.gpus if not g.mig_enabled]
        for gpu in mig_gpus:
            for mig in _ordered(gpu):
                grouped.setdefault(mig_resource_name(vendor, mig.profile), []).append(
                    _mig(gpu, mig, nodes)
                )
    return tuple(
        Resource(name=name, devices=tuple(_replicate(units, replicas)))
        for name, units in grouped.items()
    )


def mig_resource_name(vendor: str, profile: str) -> str:
    """``nvidia.com`` + ``1g.10gb+me`` → ``nvidia.com/mig-1g.10gb-me`` ('+' is not allowed)."""
    return f"{vendor}/mig-{profile.replace('+', '-')}"


def _check_single(gpus: Iterable[model.Gpu]) -> None:
    plain = [g.index for g in gpus if not g.mig_enabled]
    profiles = {m.profile: g.index for g in gpus if g.mig_enabled for m in g.mig_devices}
    problems = []
    if plain:
        problems.append(f"GPUs {plain} are not in MIG mode")
    if len(profiles) > 1:
        problems.append(f"MIG devices use several profiles ({', '.join(sorted(profiles))})")
    if problems:
        raise InventoryError(
            "--mig-strategy single needs every GPU in MIG mode with one MIG profile: "
            + "; ".join(problems)
            + " (use --mig-strategy mixed for this layout)"
        )


def _ordered(gpu: model.Gpu) -> list[model.MigDevice]:
    return sorted(gpu.mig_devices, key=lambda m: m.placement_start)


def _whole(gpu: model.Gpu, nodes: preparable.Inventory) -> Unit:
    prepared = nodes.devices[gpu.name]
    return Unit(
        uuid=gpu.uuid,
        gpu_index=gpu.index,
        minor=gpu.minor,
        numa_node=gpu.numa_node,
        device_nodes=prepared.device_nodes,
        health_keys=(gpu.uuid,),
        problem=prepared.problem,
        memory_bytes=gpu.memory_bytes,
    )


def _mig(gpu: model.Gpu, mig: model.MigDevice, nodes: preparable.Inventory) -> Unit:
    prepared = nodes.devices[model.mig_device_name(gpu, mig)]
    return Unit(
        uuid=mig.uuid,
        gpu_index=gpu.index,
        minor=gpu.minor,
        numa_node=gpu.numa_node,
        device_nodes=prepared.device_nodes,
        mig=mig,
        health_keys=(mig.uuid, gpu.uuid),
        problem=prepared.problem and f"MIG device {mig.uuid}: {prepared.problem}",
        memory_bytes=mig.memory_bytes,
    )


def _replicate(units: Iterable[Unit], replicas: int) -> Iterable[PluginDevice]:
    for unit in units:
        if replicas == 1:
            yield _checked(PluginDevice(id=unit.uuid, unit=unit))
            continue
        for n in range(replicas):
            yield _checked(
                PluginDevice(id=f"{unit.uuid}{REPLICA_SEPARATOR}{n}", unit=unit, replica=n)
            )


def _checked(dev: PluginDevice) -> PluginDevice:
    if len(dev.id) > MAX_DEVICE_ID:
        raise InventoryError(
            f"device ID {dev.id!r} is {len(dev.id)} characters; the device plugin API allows "
            f"at most {MAX_DEVICE_ID}"
        )
    return dev
