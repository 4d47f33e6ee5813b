"""What kube-scheduler's ``GatherPools`` costs for one node, given the whole cluster's slices.

Why it exists: before its search, every ``Allocate(node, claims)`` call (one per pod and node
the scheduler filters) gathers the resource pools the node can use, and that cost depends on
what *every* node publishes, not only the node's own slices. Shared counters make it grow with
the cluster: a slice that carries ``sharedCounters`` is gathered for every node, its pool then
looks incomplete from every other node, and completing it scans all the cluster's slices and
converts the pool's other slices. :class:`Cluster` counts that work (:mod:`.schedwork`) exactly
as the upstream loops of Kubernetes 1.36 do (``staging/src/k8s.io/dynamic-resource-allocation/
structured/internal/incubating``):

* ``NewAllocator`` (allocator_incubating.go) indexes the cluster's slices: by ``nodeName``
  (``slicesOnNode``) and the rest, ``slicesShared``; in 1.36 (kubernetes#136588) every slice
  with ``sharedCounters`` is a shared one, whatever its ``nodeName``. ``Allocate(node)`` hands
  ``GatherPools`` the node's slices plus the shared ones, and all slices for the scan below.
* ``GatherPools`` (pools_incubating.go) walks those slices: a slice with ``sharedCounters`` is
  always added, one with ``nodeName``/``allNodes``/``nodeSelector`` when ``NodeMatches``, one
  with ``perDeviceNodeSelection`` when one of its devices matches. ``addSlice`` converts each
  added slice (``Convert_v1_ResourceSlice_To_api_ResourceSlice``; outdated ones too, before
  their generation is compared): ``slices_gathered`` += 1, ``devices_converted`` += its devices.
* Per pool: when the slices kept (newest generation) number ``resourceSliceCount`` it is built
  from them alone (``buildPool`` without further conversion). Otherwise
  ``checkSlicesInPool(allSlices, pool, generation)`` loops over the cluster's slices until it
  returns: ``slices_scanned`` += S (all slices), or i + 1 when slice i is the pool's first of a
  newer generation (the pool is then ignored). Counted per pool from the pool's own slices and
  their positions (:meth:`Cluster.check_slices_in_pool`) instead of looping S times; ``literal``
  runs the loop itself (the tests hold both equal). If the pool then has all its slices and the
  kept ones are valid (``buildPool``: unique device names, counter sets, consumed counters that
  exist), ``buildPool`` converts every slice of the pool not kept (``DeviceSlicesNotTargeting
  Node``): ``slices_gathered`` += 1 and ``devices_converted`` += its devices, each.

So with counters, for N nodes of k slices (one with counters) and D devices each, every
node's gathering converts N·k slices and N·D devices and scans (N - 1)·N·k slices; without
counters, k slices and D devices.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dra_driver import records
from dra_driver.allocation import pools, schedwork

PoolId = tuple[str, str]  # (driver, pool)


@records.record
class SliceInfo:
    """What ``GatherPools`` reads of one ResourceSlice."""

    index: int  # position among the cluster's slices (checkSlicesInPool's order)
    name: str
    driver: str
    pool: str
    generation: int
    count: int  # resourceSliceCount
    node_name: str
    all_nodes: bool
    node_selector: Mapping[str, Any] | None
    per_device: bool
    counters: bool  # has sharedCounters
    devices: int
    spec: Mapping[str, Any]
    entries: int = 0  # attributes and capacities of all its devices

    @property
    def pool_id(self) -> PoolId:
        return (self.driver, self.pool)


def slice_info(obj: Mapping[str, Any], index: int) -> SliceInfo:
    """The fields of a v1 ResourceSlice that pool gathering uses; raises
    :class:`pools.SliceError` for a slice without driver or pool."""
    name = str((obj.get("metadata") or {}).get("name") or f"#{index}")
    spec = obj.get("spec")
    pool = spec.get("pool") if isinstance(spec, Mapping) else None
    if not isinstance(spec, Mapping) or not isinstance(pool, Mapping):
        raise pools.SliceError(f"ResourceSlice {name}: spec.pool is required")
    selector = spec.get("nodeSelector")
    return SliceInfo(
        index=index,
        name=name,
        driver=str(spec.get("driver") or ""),
        pool=str(pool.get("name") or ""),
        generation=int(pool.get("generation") or 0),
        count=int(pool.get("resourceSliceCount") or 1),
        node_name=str(spec.get("nodeName") or ""),
        all_nodes=bool(spec.get("allNodes")),
        node_selector=selector if isinstance(selector, Mapping) else None,
        per_device=bool(spec.get("perDeviceNodeSelection")),
        counters=bool(spec.get("sharedCounters")),
        devices=len(spec.get("devices") or ()),
        spec=spec,
        entries=sum(entries_of(d) for d in spec.get("devices") or ()),
    )


def entries_of(device: Mapping[str, Any]) -> int:
    """A device's attributes and capacities: what converting it or evaluating CEL on it copies."""
    return len(device.get("attributes") or {}) + len(device.get("capacity") or {})


class Cluster:
    """All ResourceSlices of a cluster, indexed as the scheduler's ``Allocator`` holds them."""

    def __init__(self, slices: Sequence[Mapping[str, Any]]) -> None:
        self.slices = [slice_info(obj, i) for i, obj in enumerate(slices)]
        self.on_node: dict[str, list[SliceInfo]] = {}
        self.shared: list[SliceInfo] = []
        self.by_pool: dict[PoolId, list[SliceInfo]] = {}
        for sl in self.slices:
            if sl.counters or not sl.node_name:
                self.shared.append(sl)
            else:
                self.on_node.setdefault(sl.node_name, []).append(sl)
            self.by_pool.setdefault(sl.pool_id, []).append(sl)
        self._cache: dict[str, schedwork.Work] = {}

    def gather_work(
        self,
        node_name: str,
        node_labels: Mapping[str, str] | None = None,
        *,
        literal: bool = False,
    ) -> schedwork.Work:
        """The work of ``GatherPools`` in one ``Allocate`` call for ``node_name`` (a new object;
        remembered per node when there are no labels)."""
        cacheable = node_labels is None and not literal
        if cacheable and node_name in self._cache:
            return schedwork.Work() + self._cache[node_name]
        labels = node_labels or {}
        work = schedwork.Work()
        kept: dict[PoolId, list[SliceInfo]] = {}
        for sl in (*self.on_node.get(node_name, ()), *self.shared):
            if sl.counters or _targets(sl, node_name, labels):
                _add_slice(kept, sl, work)
        for pool_id, members in kept.items():
            wanted = members[0].count
            if len(members) == wanted:
                continue  # complete: buildPool converts nothing more
            scanned, obsolete, whole = self.check_slices_in_pool(
                pool_id, members[0].generation, literal=literal
            )
            work.slices_scanned += scanned
            if obsolete or len(whole) != wanted:
                continue  # being replaced, or incomplete: no devices from it
            if len(members) == len(whole) or not _valid(members):
                continue  # buildPool returns before converting
            names = {m.name for m in members}
            for sl in whole:
                if sl.name not in names:  # DeviceSlicesNotTargetingNode
                    work.slices_gathered += 1
                    work.devices_converted += sl.devices
                    work.entries_converted += sl.entries
        if cacheable:
            self._cache[node_name] = schedwork.Work() + work
        return work

    def check_slices_in_pool(
        self, pool_id: PoolId, generation: int, *, literal: bool = False
    ) -> tuple[int, bool, list[SliceInfo]]:
        """``checkSlicesInPool``: (loop iterations, obsolete, the pool's slices of
        ``generation``). Counted from the pool's own slices unless ``literal``."""
        whole: list[SliceInfo] = []
        if literal:
            scanned = 0
            for sl in self.slices:
                scanned += 1
                if sl.pool_id != pool_id:
                    continue
                if sl.generation == generation:
                    whole.append(sl)
                elif sl.generation > generation:
                    return scanned, True, []
            return scanned, False, whole
        for sl in self.by_pool.get(pool_id, ()):
            if sl.generation == generation:
                whole.append(sl)
            elif sl.generation > generation:
                return sl.index + 1, True, []  # the loop returned at this slice
        return len(self.slices), False, whole


def _add_slice(kept: dict[PoolId, list[SliceInfo]], sl: SliceInfo, work: schedwork.Work) -> None:
    """``addSlice``: convert, then keep only the newest generation."""
    work.slices_gathered += 1
    work.devices_converted += sl.devices
    work.entries_converted += sl.entries
    members = kept.get(sl.pool_id)
    if members is None or sl.generation > members[0].generation:
        kept[sl.pool_id] = [sl]
    elif sl.generation == members[0].generation:
        members.append(sl)


def _matches(obj: Mapping[str, Any], node_name: str, labels: Mapping[str, str]) -> bool:
    """``NodeMatches`` for a slice spec or a device (per-device node selection)."""
    if obj.get("nodeName"):
        return bool(obj["nodeName"] == node_name)
    if obj.get("allNodes"):
        return True
    selector = obj.get("nodeSelector")
    if isinstance(selector, Mapping):
        return pools.node_selector_matches(selector, node_name=node_name, node_labels=labels)
    return False


def _targets(sl: SliceInfo, node_name: str, labels: Mapping[str, str]) -> bool:
    if sl.node_name or sl.all_nodes or sl.node_selector is not None:
        return _matches(sl.spec, node_name, labels)
    if sl.per_device:
        return any(_matches(d, node_name, labels) for d in sl.spec.get("devices") or ())
    return False  # some future node selection: skipped


def _valid(members: Sequence[SliceInfo]) -> bool:
    """``buildPool``'s checks of the kept slices: unique device names (device slices), unique
    counter-set names, every consumed counter set and counter present."""
    names: set[str] = set()
    sets: dict[str, set[str]] = {}
    for sl in members:
        if sl.counters:
            for entry in sl.spec.get("sharedCounters") or ():
                if entry.get("name") in sets:
                    return False
                sets[str(entry.get("name"))] = set(entry.get("counters") or {})
            continue
        for dev in sl.spec.get("devices") or ():
            if dev.get("name") in names:
                return False
            names.add(str(dev.get("name")))
    for sl in members:
        for dev in sl.spec.get("devices") or ():
            for use in dev.get("consumesCounters") or ():
                counters = sets.get(str(use.get("counterSet")))
                if counters is None or not set(use.get("counters") or {}) <= counters:
                    return False
    return True
