"""Passthrough devices in ResourceSlices: each GPU offered to VMs, sharing a counter with itself.

Why it exists: a GPU ``--passthrough`` selects (:mod:`dra_driver.devices.passthrough`) is
published twice — its usual device(s) for containers, and ``gpu-vfio-<minor>`` for VMs — and
the scheduler must never give both to claims at once: bound to ``vfio-pci`` the GPU is gone for
containers, and a container's GPU cannot be unbound. Partitionable devices (KEP-4815) make that
the scheduler's own bookkeeping, as dynamic MIG does:

* a plain GPU gets a counter set ``gpu-<minor>-vfio`` with one counter ``gpu`` = 1; its GPU
  device and its passthrough device consume it (a shareable GPU too: a multi-allocatable device
  books its counters once, with its first share, so shares and passthrough exclude each other);
* a GPU in MIG mode (static MIG devices) gets ``gpu`` = the number of its MIG devices; each MIG
  device consumes 1, the passthrough device all of them;
* a dynamic MIG GPU needs no new set: its passthrough device consumes everything of the GPU's
  MIG set, as the full GPU does (:func:`dra_driver.slices.migslices.full_gpu_consumes`), so it
  excludes every placement and the full GPU.

The passthrough device carries what the VM side reads: ``resource.kubernetes.io/pciBusID``
(KubeVirt builds its ``<hostdev>`` from it), ``pcieRoot``, ``numaNode``, ``iommuGroup``,
``productName``, ``uuid`` and the ``memory`` capacity. On a server that drops shared counters it
must not be published at all (:mod:`.serverfeatures` withdraws every device that consumes
counters; :func:`refusal` / :func:`resolve` decide at start, as for dynamic MIG).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

from dra_driver.devices import migprofiles, model, passthrough
from dra_driver.slices import migslices

Obj = dict[str, Any]
COUNTER = "gpu"


def counter_set_name(gpu: model.Gpu) -> str:
    return f"gpu-{gpu.minor}-vfio"


def _consumes(gpu: model.Gpu, amount: int, quantity: Any) -> Obj:
    return {
        "counterSet": counter_set_name(gpu),
        "counters": {COUNTER: {"value": quantity(COUNTER, amount)}},
    }


def passthrough_device(gpu: model.Gpu, shared: Obj, consumes: list[Obj], memory: str) -> Obj:
    """The ``gpu-vfio-<minor>`` entry; ``shared`` are the GPU's common attributes."""
    attributes = dict(shared)
    attributes.update(
        {
            "type": {"string": passthrough.DEVICE_TYPE},
            "uuid": {"string": gpu.uuid},
            "iommuGroup": {"int": gpu.iommu_group if gpu.iommu_group is not None else -1},
        }
    )
    return {
        "name": passthrough.device_name(gpu),
        "attributes": dict(sorted(attributes.items())),
        "capacity": {"memory": {"value": memory}},
        "consumesCounters": consumes,
    }


def attach(
    devices: model.NodeDevices,
    dynamic: migprofiles.DynamicMig,
    entries: list[Obj],
    *,
    quantity: Any,
    common: Callable[[model.Gpu], Obj],
    memory: Callable[[int], str],
    problems: list[str],
) -> list[Obj]:
    """Add the passthrough devices of the marked GPUs to ``entries`` (changed in place) and wire
    the counters; returns the new counter sets, to publish. A GPU whose own device was left out
    of the slices (an API rule) gets no passthrough device either."""
    by_name = {e["name"]: e for e in entries}
    sets: list[Obj] = []
    for gpu in sorted(passthrough.marked(devices), key=lambda g: (g.minor, g.index)):
        if dynamic.selects(gpu):
            if gpu.name not in by_name:
                continue
            uses = migslices.full_gpu_consumes(gpu, quantity)
        else:
            mine = _own_devices(gpu, by_name)
            if mine is None:
                problems.append(
                    f"GPU {gpu.name}: its devices are not all published; no passthrough device"
                )
                continue
            total = max(len(mine), 1)
            sets.append(
                {
                    "name": counter_set_name(gpu),
                    "counters": {COUNTER: {"value": quantity(COUNTER, total)}},
                }
            )
            for entry in mine:
                entry["consumesCounters"] = [
                    *entry.get("consumesCounters", []),
                    _consumes(gpu, 1, quantity),
                ]
            uses = [_consumes(gpu, total, quantity)]
        entries.append(passthrough_device(gpu, common(gpu), uses, memory(gpu.memory_bytes)))
    return sets


def _own_devices(gpu: model.Gpu, by_name: dict[str, Obj]) -> list[Obj] | None:
    """The container-side devices of a non-dynamic GPU (the GPU, or its MIG devices)."""
    if gpu.mig_enabled:
        names = [model.mig_device_name(gpu, m) for m in gpu.mig_devices]
    else:
        names = [gpu.name]
    if any(n not in by_name for n in names):
        return None
    return [by_name[n] for n in names]


def published_names(devices: model.NodeDevices) -> Collection[str]:
    """Names of the passthrough devices the node publishes (before the API rules)."""
    return [passthrough.device_name(g) for g in passthrough.marked(devices)]


def refusal(
    kept_counters: bool,
    devices: model.NodeDevices,
    selection: passthrough.Passthrough,
    *,
    server: str = "",
) -> str:
    """Why the agent must not start ("" = it may): an explicit ``--passthrough`` selecting GPUs
    on a server that drops shared counters (the two devices of a GPU would both be allocated)."""
    if kept_counters or selection.auto or not selection.gpus(devices):
        return ""
    where = f"the API server {server}" if server else "the API server"
    spec = selection.selection.spec
    return (
        f"--passthrough {spec} needs shared counters, but {where} drops them (feature gate "
        "DRAPartitionableDevices is off): turn the gate on, run with --passthrough none, or "
        f"with --passthrough auto:{spec} (off where the server drops them)"
    )


def resolve(kept_counters: bool, selection: passthrough.Passthrough) -> passthrough.Passthrough:
    """The selection to run with: an ``auto:`` one is off where the server drops counters."""
    if selection.auto and not kept_counters:
        return passthrough.NONE
    return selection


def names_in(slices: Sequence[Obj]) -> list[str]:
    """The passthrough devices in built slices (tests, ``slices`` summary)."""
    return [
        d["name"]
        for s in slices
        for d in (s.get("spec") or {}).get("devices") or ()
        if (d.get("attributes") or {}).get("type", {}).get("string") == passthrough.DEVICE_TYPE
    ]
