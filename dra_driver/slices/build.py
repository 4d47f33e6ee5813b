"""Turn a node's device model into the ResourceSlices the driver publishes (a pure function).

Why it exists: this is the one place that decides what the scheduler sees of a node — device
names, the attribute schema (docs/attributes.md), the NVLink/NUMA topology attributes that make
topology-aware claims possible, and how a pool is split over slices within the API limits.
Same hardware in, byte-identical slices out (devices sorted, maps built in a fixed order), so a
restart changes nothing and the publisher writes nothing. A device that would break an API rule
is left out and reported, so one bad device never hides the others.

Layout of the pool: the devices in order, one per full GPU or MIG device (by minor); 128 per
slice, 64 once a device has taints or consumes counters. Every full GPU carries its set ranks
(``setRanks``, :mod:`.gpusets`), computed for the GPUs the agent sees free (``taken``: held by
claims it prepared; tainted GPUs are never free). GPUs handed to dynamic MIG are published as their
full GPU plus one device per MIG profile placement, with a counter set each, in slices of their
own (:mod:`dra_driver.slices.migslices`); nothing else uses shared counters.
"""

from __future__ import annotations

import collections
import hashlib
import json
import threading
from collections.abc import Callable, Collection
from typing import Any

from dra_driver import records
from dra_driver.apimachinery import semver
from dra_driver.devices import migprofiles, model, topology
from dra_driver.slices import gpusets, migslices, shares, validate, vfioslices

DEFAULT_DRIVER_NAME = "gpu.nvidia.com"
STANDARD_DOMAIN = "resource.kubernetes.io"
PCI_BUS_ID = f"{STANDARD_DOMAIN}/pciBusID"
PCIE_ROOT = f"{STANDARD_DOMAIN}/pcieRoot"
NUMA_NODE = f"{STANDARD_DOMAIN}/numaNode"
_BINARY = ((60, "Ei"), (50, "Pi"), (40, "Ti"), (30, "Gi"), (20, "Mi"), (10, "Ki"))
_DECIMAL = ((18, "E"), (15, "P"), (12, "T"), (9, "G"), (6, "M"), (3, "k"))

Obj = dict[str, Any]


class BuildError(ValueError):
    """The node or driver name cannot make a valid ResourceSlice at all."""


@records.record
class Build:
    """The desired slices of one node, and what had to be left out (one line per problem)."""

    slices: list[Obj]
    problems: list[str]


def build(
    devices: model.NodeDevices,
    *,
    node_name: str,
    driver_name: str = DEFAULT_DRIVER_NAME,
    node_uid: str | None = None,
    generation: int = 1,
    gpu_sets: bool = True,
    decorate: Callable[[list[Obj]], None] | None = None,
    dynamic_mig: migprofiles.DynamicMig = migprofiles.STATIC,
    shareable: shares.Shareable = shares.NONE,
    taken: Collection[str] = (),
) -> Build:
    """The complete desired set of ResourceSlices for ``node_name``: one pool named after it.

    ``gpu_sets=False`` leaves out the set ranks (the ``setRanks`` attribute): plain devices.
    ``taken``: names of full GPUs held by claims (the ranks are of the other GPUs).
    ``decorate`` is a pass over all device entries before they are checked and split into
    slices (e.g. :func:`dra_driver.slices.taints.decorator` adds the taints of unhealthy GPUs;
    tainted devices lower the per-slice limit, which the split honours, and are not ranked).
    ``dynamic_mig`` says which MIG-capable GPUs are published for dynamic MIG (that needs
    partitionable devices).
    GPUs ``shareable`` selects (not those published for dynamic MIG) are published with
    consumable capacity (:mod:`.shares`). Raises :class:`BuildError` when the
    node or driver name itself breaks an API rule.
    """
    empty = validate.validate(_slice(node_name, driver_name, [], 0, 1, generation, node_uid))
    if empty:
        raise BuildError(
            f"cannot publish ResourceSlices for node {node_name!r} with driver "
            f"{driver_name!r}: " + "; ".join(str(e) for e in empty)
        )
    problems: list[str] = []
    entries = device_entries(devices, problems, dynamic_mig=dynamic_mig, shareable=shareable)
    kept = _valid(entries, node_name, driver_name, generation, problems)
    checked = len(kept)
    counter_sets = migslices.attach(devices, dynamic_mig, kept, quantity=_quantity)
    if any(g.passthrough for g in devices.gpus):  # GPUs offered to VMs too (docs/passthrough.md)
        counter_sets += vfioslices.attach(
            devices,
            dynamic_mig,
            kept,
            quantity=_quantity,
            common=lambda g: _shared(g, problems),
            memory=bytes_quantity,
            problems=problems,
        )
        checked = 0  # their GPUs' devices now consume a counter
    if decorate is not None:
        decorate(kept)
        checked = 0  # a pass may change any device
    if gpu_sets:
        gpusets.add_ranks(migslices.as_whole(devices, dynamic_mig), kept, taken=taken)
        checked = 0
    kept[checked:] = _valid(kept[checked:], node_name, driver_name, generation, problems)
    if gpu_sets:  # the ranked GPUs first, together: a re-rank rewrites one slice
        kept.sort(key=lambda d: not _ranked(d))
    chunks: list[tuple[list[Obj], list[Obj]]] = [
        ([], counter_sets[i : i + validate.MAX_COUNTER_SETS])
        for i in range(0, len(counter_sets), validate.MAX_COUNTER_SETS)
    ]
    chunks += [(chunk, []) for chunk in split(kept)]
    slices = [
        _slice(node_name, driver_name, chunk, i, len(chunks), generation, node_uid, shared)
        for i, (chunk, shared) in enumerate(chunks)
    ]
    return Build(slices=slices, problems=problems)


def _valid(
    entries: list[Obj], node_name: str, driver_name: str, generation: int, problems: list[str]
) -> list[Obj]:
    """The devices the API server would accept (each alone in a slice); the rest reported."""
    kept: list[Obj] = []
    for device in entries:
        errors = _device_errors(device, node_name, driver_name, generation)
        if errors:
            problems.append(
                f"device {device['name']!r} left out of the ResourceSlice: " + "; ".join(errors)
            )
        else:
            kept.append(device)
    return kept


_VERDICTS: collections.OrderedDict[tuple[str, str, str], tuple[str, ...]] = (
    collections.OrderedDict()
)
_VERDICTS_LOCK = threading.Lock()
VERDICTS_KEPT = 4096  # devices: a few nodes' worth (a dgx-h100 with dynamic MIG has 208)


def _device_errors(device: Obj, node_name: str, driver_name: str, generation: int) -> list[str]:
    """The API errors of ``device`` alone in a slice, remembered by content: a re-rank rebuilds
    every device, and all but the ranked GPUs come out as they were (validating the 208 devices
    of a dgx-h100 with dynamic MIG twice took ~0.3 s of each re-rank)."""
    key = (node_name, driver_name, json.dumps(_shape(device), sort_keys=True))
    with _VERDICTS_LOCK:
        found = _VERDICTS.get(key)
        if found is not None:
            _VERDICTS.move_to_end(key)
            return list(found)
    errors = validate.validate(_slice(node_name, driver_name, [device], 0, 1, generation, None))
    verdict = tuple(str(e) for e in errors)
    with _VERDICTS_LOCK:
        _VERDICTS[key] = verdict
        while len(_VERDICTS) > VERDICTS_KEPT:
            _VERDICTS.popitem(last=False)
    return list(verdict)


def _shape(device: Obj) -> Obj:
    """``device`` as far as its validity goes: a rank's value (any int) never makes a device
    valid or invalid, so re-ranked GPUs find their verdict too."""
    attrs = device.get("attributes") or {}
    if gpusets.PACKED_ATTRIBUTE not in attrs:
        return device
    return {**device, "attributes": {**attrs, gpusets.PACKED_ATTRIBUTE: {"int": 0}}}


def _ranked(device: Obj) -> bool:
    return gpusets.PACKED_ATTRIBUTE in (device.get("attributes") or {})


def split(devices: list[Obj]) -> list[list[Obj]]:
    """Consecutive chunks within the per-slice device limit; an empty pool is one empty slice."""
    chunks: list[list[Obj]] = []
    current: list[Obj] = []
    special = False  # whether ``current`` holds a device that lowers the limit to 64
    for device in devices:
        lowers = validate.uses_special_limit(device)
        limit = validate.MAX_DEVICES_SPECIAL if (special or lowers) else validate.MAX_DEVICES
        if len(current) + 1 > limit:
            chunks.append(current)
            current, special = [], False
        current.append(device)
        special = special or lowers
    if current or not chunks:
        chunks.append(current)
    return chunks


def slice_name(node_name: str, driver_name: str, index: int, count: int = 1) -> str:
    """``<node>-<driver>-<index>``, shortened with a hash when it would exceed 253 characters.

    The index is zero-padded to the width of the largest one, so that the scheduler, which
    tries a pool's slices in name order, tries them in index order.
    """
    number = str(index).zfill(len(str(max(count - 1, 0))))
    name = f"{node_name}-{driver_name.lower()}-{number}"
    if len(name) <= 253:
        return name
    digest = hashlib.sha256(f"{node_name}/{driver_name}".encode()).hexdigest()[:10]
    return f"{node_name[:200].rstrip('-.')}-{digest}-{number}"


def device_entries(
    devices: model.NodeDevices,
    problems: list[str] | None = None,
    *,
    dynamic_mig: migprofiles.DynamicMig = migprofiles.STATIC,
    shareable: shares.Shareable = shares.NONE,
) -> list[Obj]:
    """The ``spec.devices`` entries of the pool, sorted by GPU minor, MIG placement. A dynamic
    MIG GPU gives its full GPU, then every placement in NVML's profile order (their counters
    are wired in once the pool's counter sets exist: :func:`migslices.attach`); it is never
    shareable. Other full GPUs ``shareable`` selects get consumable capacity."""
    problems = problems if problems is not None else []
    topo = topology.build(devices)
    out: list[Obj] = []
    for gpu in sorted(devices.gpus, key=lambda g: (g.minor, g.index)):
        if dynamic_mig.selects(gpu):
            out.append(_gpu_device(gpu, topo, problems))
            shared: Obj = {}
            _common(gpu, shared, [], gpu.name)
            out += [
                migslices.placement_device(place, shared, _quantity)
                for place in migprofiles.placements(gpu)
            ]
            if shareable.matches(gpu):
                problems.append(
                    f"GPU {gpu.name} ({gpu.product_name}) is published for dynamic MIG; "
                    "--shareable does not apply to it (its full GPU is exclusive)"
                )
            continue
        if dynamic_mig.wants(gpu) and dynamic_mig.spec != migprofiles.ALL:
            problems.append(
                f"GPU {gpu.name} ({gpu.product_name}) matches --dynamic-mig {dynamic_mig.spec!r} "
                "but NVML lists no MIG profile placements for it; published as it is"
            )
        if gpu.mig_enabled:
            for mig in sorted(gpu.mig_devices, key=lambda m: (m.placement_start, m.uuid)):
                out.append(_mig_device(gpu, mig, problems))
        else:
            out.append(_gpu_device(gpu, topo, problems))
            if shareable.matches(gpu):
                _make_shareable(out[-1], gpu, problems)
    return out


def _make_shareable(entry: Obj, gpu: model.Gpu, problems: list[str]) -> None:
    """Publish ``gpu`` as a device many claims can share (consumable capacity)."""
    capacity = shares.capacity(gpu.memory_bytes, memory_text=bytes_quantity(gpu.memory_bytes))
    if capacity is None:
        problems.append(f"device {gpu.name!r} has too little memory to share; published exclusive")
        return
    entry["allowMultipleAllocations"] = True
    entry["capacity"] = capacity


def _quantity(counter: str, value: int) -> str:
    return bytes_quantity(value) if counter == migslices.MEMORY else count_quantity(value)


def normalize_version(text: str) -> str:
    """A version as valid semver: "580.95.05" → "580.95.5", "9.0" → "9.0.0"."""
    return semver.parse_semver(text, normalize=True).canonical()


def bytes_quantity(value: int) -> str:
    """Bytes in the API server's canonical form ("80Gi", "4864Mi", "1000")."""
    for shift, suffix in _BINARY:
        if value and value % (1 << shift) == 0:
            return f"{value >> shift}{suffix}"
    return str(value)


def count_quantity(value: int) -> str:
    """A count in the API server's canonical form ("7", "2k")."""
    for exponent, suffix in _DECIMAL:
        if value and value % 10**exponent == 0:
            return f"{value // 10**exponent}{suffix}"
    return str(value)


def _common(gpu: model.Gpu, attrs: Obj, problems: list[str], device: str) -> None:
    """Attributes a GPU and its MIG devices share: product, versions, PCI and NUMA place."""
    attrs["productName"] = {"string": gpu.product_name}
    attrs["brand"] = {"string": gpu.brand}
    attrs["architecture"] = {"string": gpu.architecture}
    for key, raw in (
        ("cudaComputeCapability", gpu.cuda_compute_capability),
        ("driverVersion", gpu.driver_version),
        ("cudaDriverVersion", gpu.cuda_driver_version),
    ):
        try:
            attrs[key] = {"version": normalize_version(raw)}
        except semver.SemverError as exc:
            problems.append(f"device {device!r}: attribute {key} omitted: {exc}")
    attrs[PCI_BUS_ID] = {"string": gpu.pci_bus_id}
    if gpu.pcie_root is not None:
        attrs[PCIE_ROOT] = {"string": gpu.pcie_root}
    if gpu.numa_node is not None:
        attrs[NUMA_NODE] = {"int": gpu.numa_node}


def _shared(gpu: model.Gpu, problems: list[str]) -> Obj:
    attrs: Obj = {}
    _common(gpu, attrs, problems, gpu.name)
    return attrs


def _gpu_device(gpu: model.Gpu, topo: topology.Topology, problems: list[str]) -> Obj:
    attrs: Obj = {"type": {"string": "gpu"}, "uuid": {"string": gpu.uuid}}
    _common(gpu, attrs, problems, gpu.name)
    island = topo.island_of.get(gpu.index)
    if island is not None:
        attrs["nvlinkIsland"] = {"string": island}
    attrs["nvlinkLinks"] = {"int": gpu.active_links}
    fabric = gpu.fabric
    if fabric is not None and fabric.state == "completed" and fabric.cluster_uuid:
        attrs["nvlinkClique"] = {"string": f"{fabric.cluster_uuid}.{fabric.clique_id}"}
    return {
        "name": gpu.name,
        "attributes": _sorted(attrs),
        "capacity": {"memory": {"value": bytes_quantity(gpu.memory_bytes)}},
    }


def _mig_device(gpu: model.Gpu, mig: model.MigDevice, problems: list[str]) -> Obj:
    name = model.mig_device_name(gpu, mig)
    attrs: Obj = {
        "type": {"string": "mig"},
        "uuid": {"string": mig.uuid},
        "parentUUID": {"string": gpu.uuid},
        "profile": {"string": mig.profile},
    }
    _common(gpu, attrs, problems, name)
    capacity = {
        "memory": bytes_quantity(mig.memory_bytes),
        "multiprocessors": count_quantity(mig.multiprocessors),
        "copyEngines": count_quantity(mig.copy_engines),
        "decoders": count_quantity(mig.decoders),
        "encoders": count_quantity(mig.encoders),
        "jpegEngines": count_quantity(mig.jpeg_engines),
        "ofaEngines": count_quantity(mig.ofa_engines),
    }
    return {
        "name": name,
        "attributes": _sorted(attrs),
        "capacity": {k: {"value": v} for k, v in sorted(capacity.items())},
    }


def _sorted(attrs: Obj) -> Obj:
    return dict(sorted(attrs.items()))


def _slice(
    node_name: str,
    driver_name: str,
    devices: list[Obj],
    index: int,
    count: int,
    generation: int,
    node_uid: str | None,
    shared_counters: list[Obj] | None = None,
) -> Obj:
    metadata: Obj = {"name": slice_name(node_name, driver_name, index, count)}
    if node_uid is not None:
        metadata["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": "Node",
                "name": node_name,
                "uid": node_uid,
                "controller": True,
            }
        ]
    spec: Obj = {
        "driver": driver_name,
        "nodeName": node_name,
        "pool": {"name": node_name, "generation": generation, "resourceSliceCount": count},
    }
    if shared_counters:
        spec["sharedCounters"] = shared_counters
    else:
        spec["devices"] = devices
    return {
        "apiVersion": validate.API_VERSION,
        "kind": validate.KIND,
        "metadata": metadata,
        "spec": spec,
    }
