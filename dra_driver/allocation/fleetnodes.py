"""The GPUs of every node of a cluster, free or not, and what the slices tell of their topology.

Why it exists: ``dra-driver capacity`` (:mod:`.setfit`) answers "how many N-GPU claims fit" for
a whole fleet from what any operator can export: the ResourceSlices and the allocated
ResourceClaims. This module turns those into one :class:`NodeGpus` per node: its full GPUs in
the order the scheduler tries them, which are free, and the pairwise placement score the sets
are judged by.

* A node is a pool of the driver's slices with a ``nodeName``, gathered as the scheduler gathers
  it (:func:`dra_driver.allocation.pools.gather`: newest generation only; an incomplete or
  invalid pool has no usable GPUs and is reported).
* A full GPU is a device with ``type: gpu`` (or, in slices without ``type``, a device with a
  ``uuid`` and no parent): MIG devices and GPUs in MIG mode are not full GPUs.
* A GPU is *held* when an allocated result names a device using it: the GPU itself, a share of
  it (``shareID``), a MIG device of it (``parentUUID``), or a GPU-set device of earlier versions
  holding it (``uuid0``, ``uuid1``, ...). ``adminAccess`` results hold nothing, as in the
  scheduler. A GPU tainted ``NoSchedule`` or ``NoExecute`` (unhealthy) is *unhealthy*. The
  others are *free*.
* The score of a pair of GPUs is (NVLink links, same NUMA node, same PCIe root), as the set ranks
  compare sets (:mod:`dra_driver.devices.gpusets`). The slices do not publish pairwise link
  counts: GPUs on one ``nvlinkIsland`` count one link per pair (exact up to scale on NVSwitch
  systems and NVLink bridges, coarse on NVLink meshes such as the DGX-1), unless the slices
  still carry the 2-GPU set devices of earlier versions, whose ``nvlinkLinks`` are the pair's
  real count. What a node's slices lack is named in :attr:`NodeGpus.unknown`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from dra_driver import records
from dra_driver.allocation import physical, pools
from dra_driver.devices import gpusets

Score = tuple[int, int, int]
STOP_EFFECTS = ("NoSchedule", "NoExecute")
ISLAND_LINKS = "nvlink-links"  # unknown: pairwise link counts (judged by island)
NUMA = "numa"  # unknown: NUMA node of some GPUs
PCIE_ROOT = "pcie-root"  # unknown: PCIe root of some GPUs
UNUSABLE = "unusable-pool"  # the pool is incomplete or invalid


class InputError(Exception):
    """A ResourceSlice or allocated claim that cannot be read; names the object and field."""


@records.record
class NodeGpus:
    """One node's full GPUs (scheduler order), the bit mask of the free ones, the pair scores."""

    node: str
    product: str  # the GPUs' product names, joined by " + " when mixed
    names: tuple[str, ...]
    free: int  # bit i: names[i] is free
    held: int
    unhealthy: int
    pairs: tuple[tuple[Score, ...], ...]
    unknown: frozenset[str] = frozenset()
    problem: str = ""  # why the pool has no usable GPUs


def read(
    slices: Sequence[Any],
    allocated: Iterable[Any],
    *,
    driver_name: str,
    progress: Callable[[int, int], None] | None = None,
) -> list[NodeGpus]:
    """Every node of ``driver_name``'s pools, sorted by node name; ``progress(done, total)``
    is called per node read."""
    by_pool: dict[str, list[Mapping[str, Any]]] = {}
    node_of: dict[str, str] = {}
    for i, obj in enumerate(slices):
        spec = obj.get("spec") if isinstance(obj, Mapping) else None
        if not isinstance(spec, Mapping):
            raise InputError(f"ResourceSlice {_name(obj, i)}: spec is required")
        if spec.get("driver") != driver_name:
            continue
        pool = spec.get("pool")
        if not isinstance(pool, Mapping) or not isinstance(pool.get("name"), str):
            raise InputError(f"ResourceSlice {_name(obj, i)}: spec.pool.name is required")
        by_pool.setdefault(pool["name"], []).append(obj)
        if isinstance(spec.get("nodeName"), str) and spec["nodeName"]:
            node_of.setdefault(pool["name"], spec["nodeName"])
    held = _held_devices(allocated, driver_name)
    out = []
    for done, (pool_name, members) in enumerate(by_pool.items(), 1):
        node = node_of.get(pool_name)
        if node is not None:
            out.append(_node(node, members, held.get(pool_name, set())))
        if progress is not None:
            progress(done, len(by_pool))
    return sorted(out, key=lambda n: n.node)


def _name(obj: Any, index: int) -> str:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return str(name) if name else f"#{index + 1}"


def _held_devices(allocated: Iterable[Any], driver_name: str) -> dict[str, set[str]]:
    """Pool -> names of its devices allocated results use (shares included)."""
    out: dict[str, set[str]] = {}
    for i, obj in enumerate(allocated):
        if not isinstance(obj, Mapping):
            raise InputError(f"allocated entry #{i + 1}: must be an object")
        results = _results(obj)
        if results is None:
            raise InputError(
                f"ResourceClaim {_claim_name(obj, i)}: status.allocation.devices.results "
                "must be a list"
            )
        for j, res in enumerate(results):
            ids = [res.get(k) if isinstance(res, Mapping) else None for k in _IDS]
            if not all(isinstance(x, str) and x for x in ids):
                raise InputError(
                    f"ResourceClaim {_claim_name(obj, i)}: result #{j + 1} needs driver, pool "
                    "and device strings"
                )
            if ids[0] == driver_name and not res.get("adminAccess"):
                out.setdefault(str(ids[1]), set()).add(str(ids[2]))
    return out


_IDS = ("driver", "pool", "device")


def _results(obj: Mapping[str, Any]) -> list[Any] | None:
    """A claim's allocation results (none while unallocated), or bare results as ``simulate
    --allocated`` takes them (``{"results": [...]}`` or one result); None: malformed."""
    if obj.get("kind") == "ResourceClaim" or "status" in obj:
        status = obj.get("status") or {}
        alloc = status.get("allocation") if isinstance(status, Mapping) else None
        if not alloc:
            return []  # a claim not allocated (yet) holds nothing
        devices = alloc.get("devices") if isinstance(alloc, Mapping) else None
        results = devices.get("results") if isinstance(devices, Mapping) else None
        return results if isinstance(results, list) else None
    if "results" in obj:
        results = obj.get("results")
        return results if isinstance(results, list) else None
    return [obj]


def _claim_name(obj: Mapping[str, Any], index: int) -> str:
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not name:
        return f"#{index + 1}"
    namespace = meta.get("namespace") if isinstance(meta, Mapping) else None
    return f"{namespace}/{name}" if namespace else str(name)


def _node(node: str, members: Sequence[Mapping[str, Any]], held_names: set[str]) -> NodeGpus:
    try:
        gathered = pools.gather(members, node_name=node)
    except pools.SliceError as err:
        raise InputError(str(err)) from err
    devices = [d for p in gathered for d in p.devices]
    broken = [p for p in gathered if p.incomplete or p.invalid]
    if broken:
        why = broken[0].invalid or "incomplete (not all its slices are there)"
        return NodeGpus(node, "", (), 0, 0, 0, (), frozenset({UNUSABLE}), f"pool {why}")
    gpus = [d for d in devices if _is_gpu(d)]
    keys = [_key(d) for d in gpus]
    every = devices + [d for p in gathered for d in p.elsewhere]
    held_keys = {u for d in every if d.name in held_names for u in physical.members(d)}
    gone = held_names - {d.name for d in every}
    if gone:
        held_keys |= {k for k, d in zip(keys, gpus, strict=True) if _named_in(d.name, gone)}
    free = held = sick = 0
    for i, dev in enumerate(gpus):
        if keys[i] in held_keys:
            held += 1
        elif any(t.get("effect") in STOP_EFFECTS for t in dev.data.get("taints") or ()):
            sick += 1
        else:
            free |= 1 << i
    pairs, unknown = _pairs(gpus, keys, devices)
    products = sorted({str(_attr(d, "productName") or "unknown GPU") for d in gpus})
    return NodeGpus(
        node=node,
        product=" + ".join(products),
        names=tuple(d.name for d in gpus),
        free=free,
        held=held,
        unhealthy=sick,
        pairs=pairs,
        unknown=unknown,
    )


def _key(device: pools.Device) -> str:
    """The GPU's UUID (its name where it publishes none)."""
    uuid = _attr(device, "uuid")
    return uuid if isinstance(uuid, str) else f"name:{device.name}"


def _named_in(gpu: str, names: set[str]) -> bool:
    """Whether allocated devices no longer published use GPU ``gpu``: a GPU-set device of
    earlier versions (``gpus-0-1``) or a MIG device (``gpu-0-mig-...``) gone since."""
    for name in names:
        minors = gpusets.parse_name(name)
        if minors is not None and gpu in {f"gpu-{m}" for m in minors}:
            return True
        if name.startswith(f"{gpu}-"):
            return True
    return False


def _is_gpu(device: pools.Device) -> bool:
    kind = _attr(device, "type")
    if kind is not None:
        return bool(kind == "gpu")
    return _attr(device, "uuid") is not None and _attr(device, "parentUUID") is None


def _attr(device: pools.Device, name: str) -> Any:
    """An attribute's value (bare names: the driver's domain, as published or qualified)."""
    attrs = device.data.get("attributes") or {}
    found = attrs.get(name)
    if found is None:
        qualified = name if "/" in name else f"{device.driver}/{name}"
        found = pools.lookup_attribute(device, qualified)
    if not isinstance(found, dict):  # decoded JSON: a dict (and a cheaper test than Mapping)
        return None
    for kind in ("string", "int", "bool", "version"):
        if kind in found:
            return found[kind]
    return None


def _pairs(
    gpus: Sequence[pools.Device], keys: Sequence[str], devices: Sequence[pools.Device]
) -> tuple[tuple[tuple[Score, ...], ...], frozenset[str]]:
    index = {u: i for i, u in enumerate(keys)}
    exact: dict[tuple[int, int], int] = {}
    for dev in devices:  # 2-GPU set devices of earlier versions: the pair's real link count
        if _attr(dev, "uuid1") is None:
            continue
        members = physical.members(dev)
        links = _attr(dev, "nvlinkLinks")
        if len(members) == 2 and all(m in index for m in members) and isinstance(links, int):
            a, b = sorted(index[m] for m in members)
            exact[(a, b)] = links
    islands = [_attr(d, "nvlinkIsland") for d in gpus]
    numa = [_attr(d, physical.NUMA_ATTRIBUTE) for d in gpus]
    roots = [_attr(d, physical.PCIE_ROOT_ATTRIBUTE) for d in gpus]
    unknown = set()
    sizes: dict[Any, int] = {}
    for island in islands:
        if island is not None:
            sizes[island] = sizes.get(island, 0) + 1
    if not exact and any(n > 2 for n in sizes.values()):
        unknown.add(ISLAND_LINKS)
    if any(v is None for v in numa):
        unknown.add(NUMA)
    if any(v is None for v in roots):
        unknown.add(PCIE_ROOT)
    matrix = _matrix(tuple(islands), tuple(numa), tuple(roots), tuple(sorted(exact.items())))
    return matrix, frozenset(unknown)


@functools.lru_cache(maxsize=256)
def _matrix(
    islands: tuple[Any, ...],
    numa: tuple[Any, ...],
    roots: tuple[Any, ...],
    exact: tuple[tuple[tuple[int, int], int], ...],
) -> tuple[tuple[Score, ...], ...]:
    """The pair scores of GPUs with these attributes (nodes of one kind share them)."""
    links_of = dict(exact)
    n = len(islands)
    rows = []
    for a in range(n):
        row = []
        for b in range(n):
            if a == b:
                row.append((0, 0, 0))
                continue
            if links_of:
                links = links_of.get((a, b) if a < b else (b, a), 0)
            else:
                links = int(islands[a] is not None and islands[a] == islands[b])
            row.append(
                (
                    links,
                    int(numa[a] is not None and numa[a] == numa[b]),
                    int(roots[a] is not None and roots[a] == roots[b]),
                )
            )
        rows.append(tuple(row))
    return tuple(rows)
