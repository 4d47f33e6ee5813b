"""The devices a node can allocate from, gathered from ResourceSlices like the scheduler does.

Why it exists: which devices count is part of the scheduler's verdict. Only slices that target
the node (``nodeName``, ``allNodes``, a matching ``nodeSelector``, or per-device selection) are
used; per pool only the highest ``generation`` counts, and a pool whose slices of that
generation are not all visible is *incomplete*: it contributes no devices and makes
``allocationMode: All`` fail. Duplicate device names make a pool invalid, and so do counter sets
a device consumes but the pool lacks. Devices come out in the order the scheduler tries them:
pools by driver and name, slices by name, devices in order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dra_driver import records
from dra_driver.allocation import counters

DeviceId = tuple[str, str, str]  # (driver, pool, device)


class SliceError(Exception):
    """A ResourceSlice (or allocated-devices input) is not usable; names the object and field."""


@records.record
class Device:
    """One device of a usable pool, with where it came from."""

    driver: str
    pool: str
    name: str
    data: Mapping[str, Any]  # the ResourceSlice device, resource.k8s.io/v1 JSON form
    slice_name: str
    node_name: str | None  # the node the device is local to, if the slice says so
    node_selector: Mapping[str, Any] | None
    consumes: counters.Consumption = ()  # counters the device uses up while allocated

    @property
    def id(self) -> DeviceId:
        return (self.driver, self.pool, self.name)


@records.record
class Pool:
    driver: str
    name: str
    devices: tuple[Device, ...]
    incomplete: bool = False
    invalid: str | None = None
    counter_sets: counters.CounterSets = dataclasses.field(default_factory=dict)
    # Devices of the pool's other slices (not for this node): their counters still count.
    elsewhere: tuple[Device, ...] = ()


def _requirement_matches(req: Mapping[str, Any], value: str | None) -> bool:
    op = req.get("operator")
    values = [str(v) for v in req.get("values") or ()]
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and values:
        try:
            a, b = int(value), int(values[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def node_selector_matches(
    selector: Mapping[str, Any], *, node_name: str, node_labels: Mapping[str, str]
) -> bool:
    """A core NodeSelector against a node known by name and labels (terms are ORed)."""
    for term in selector.get("nodeSelectorTerms") or ():
        fields = term.get("matchFields") or ()
        exprs = term.get("matchExpressions") or ()
        if not fields and not exprs:
            continue
        ok = all(
            _requirement_matches(r, node_name if r.get("key") == "metadata.name" else None)
            for r in fields
        ) and all(_requirement_matches(r, node_labels.get(str(r.get("key")))) for r in exprs)
        if ok:
            return True
    return False


def _targets(obj: Mapping[str, Any], *, node_name: str, node_labels: Mapping[str, str]) -> bool:
    if obj.get("nodeName"):
        return bool(obj["nodeName"] == node_name)
    if obj.get("allNodes"):
        return True
    selector = obj.get("nodeSelector")
    if isinstance(selector, Mapping):
        return node_selector_matches(selector, node_name=node_name, node_labels=node_labels)
    return False


@dataclasses.dataclass(slots=True)
class _Slice:
    name: str
    driver: str
    pool: str
    generation: int
    count: int
    spec: Mapping[str, Any]


def _parse_slice(obj: Any, index: int) -> _Slice:
    if not isinstance(obj, Mapping):
        raise SliceError(f"ResourceSlice #{index}: must be an object")
    name = str((obj.get("metadata") or {}).get("name") or f"#{index}")
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise SliceError(f"ResourceSlice {name}: spec is required")
    pool = spec.get("pool")
    if not isinstance(pool, Mapping) or not isinstance(pool.get("name"), str):
        raise SliceError(f"ResourceSlice {name}: spec.pool.name is required")
    driver = spec.get("driver")
    if not isinstance(driver, str) or not driver:
        raise SliceError(f"ResourceSlice {name}: spec.driver is required")
    generation, count = pool.get("generation", 0), pool.get("resourceSliceCount", 1)
    if not isinstance(generation, int) or not isinstance(count, int) or count < 1:
        raise SliceError(
            f"ResourceSlice {name}: spec.pool.generation and "
            "spec.pool.resourceSliceCount must be integers (count >= 1)"
        )
    devices = spec.get("devices") or []
    if not isinstance(devices, list) or not all(
        isinstance(d, Mapping) and isinstance(d.get("name"), str) for d in devices
    ):
        raise SliceError(f"ResourceSlice {name}: spec.devices must be a list of named devices")
    return _Slice(name, driver, pool["name"], generation, count, spec)


def gather(
    slices: Sequence[Any], *, node_name: str, node_labels: Mapping[str, str] | None = None
) -> list[Pool]:
    """The pools with devices for ``node_name``, in the order the scheduler tries them.

    As kube-scheduler 1.36 gathers them: slices that target the node, plus every slice with
    ``sharedCounters`` (counter sets live in slices of their own); per pool only the newest
    generation; a pool is incomplete unless all its slices of that generation are there, and
    invalid for duplicate device or counter-set names or a device consuming a counter the pool
    does not have. Pools sorted by driver and name, slices by name.
    """
    labels = node_labels or {}
    parsed = [_parse_slice(s, i) for i, s in enumerate(slices)]
    relevant: dict[tuple[str, str], list[_Slice]] = {}
    for sl in parsed:
        if not _relevant(sl.spec, node_name=node_name, node_labels=labels):
            continue
        key = (sl.driver, sl.pool)
        current = relevant.get(key)
        if current is None or sl.generation > current[0].generation:
            relevant[key] = [sl]
        elif sl.generation == current[0].generation:
            current.append(sl)
    pools: list[Pool] = []
    for (driver, pool_name), members in sorted(relevant.items()):
        generation, wanted = members[0].generation, members[0].count
        whole = members
        if len(members) != wanted:
            same_pool = [s for s in parsed if (s.driver, s.pool) == (driver, pool_name)]
            if any(s.generation > generation for s in same_pool):
                continue  # being replaced by a newer generation without devices for this node
            whole = [s for s in same_pool if s.generation == generation]
            if len(whole) != wanted:
                pools.append(Pool(driver, pool_name, (), incomplete=True))
                continue
        pools.append(_build_pool(driver, pool_name, members, whole, node_name, labels))
    return pools


def _relevant(spec: Mapping[str, Any], *, node_name: str, node_labels: Mapping[str, str]) -> bool:
    if spec.get("sharedCounters"):
        return True  # needed to use the pool, whatever node it is for
    if spec.get("nodeName") or spec.get("allNodes") or spec.get("nodeSelector") is not None:
        return _targets(spec, node_name=node_name, node_labels=node_labels)
    if spec.get("perDeviceNodeSelection"):
        return any(
            _targets(d, node_name=node_name, node_labels=node_labels)
            for d in spec.get("devices") or ()
        )
    return False


def _build_pool(
    driver: str,
    pool_name: str,
    members: Sequence[_Slice],
    whole: Sequence[_Slice],
    node_name: str,
    labels: Mapping[str, str],
) -> Pool:
    device_slices = sorted((s for s in members if not s.spec.get("sharedCounters")), key=_name)
    names: set[str] = set()
    for sl in device_slices:
        for dev in sl.spec.get("devices") or ():
            if dev["name"] in names:
                return Pool(driver, pool_name, (), invalid=f"duplicate device name {dev['name']}")
            names.add(dev["name"])
    try:
        sets = counters.counter_sets(s.spec for s in members if s.spec.get("sharedCounters"))
    except counters.CounterError as err:
        return Pool(driver, pool_name, (), invalid=str(err))
    devices: list[Device] = []
    elsewhere: list[Device] = []
    seen = {s.name for s in members}
    others = [s for s in whole if s.name not in seen and not s.spec.get("sharedCounters")]
    for sl, local in [(s, True) for s in device_slices] + [(s, False) for s in others]:
        per_device = bool(sl.spec.get("perDeviceNodeSelection"))
        for dev in sl.spec.get("devices") or ():
            try:
                consumes = counters.consumption(dev, sets)
            except counters.CounterError as err:
                return Pool(driver, pool_name, (), invalid=str(err))
            where = dev if per_device else sl.spec
            device = Device(
                driver=driver,
                pool=pool_name,
                name=dev["name"],
                data=dev,
                slice_name=sl.name,
                node_name=where.get("nodeName") or None,
                node_selector=where.get("nodeSelector"),
                consumes=consumes,
            )
            targets = not per_device or _targets(dev, node_name=node_name, node_labels=labels)
            (devices if local and targets else elsewhere).append(device)
    return Pool(driver, pool_name, tuple(devices), counter_sets=sets, elsewhere=tuple(elsewhere))


def _name(sl: _Slice) -> str:
    return sl.name


def allocated_ids(objects: Iterable[Any]) -> set[DeviceId]:
    """Devices already in use: from ResourceClaims with ``status.allocation`` or bare results.

    Results with ``adminAccess: true`` do not make a device busy, as in the scheduler.
    """
    used: set[DeviceId] = set()
    for i, obj in enumerate(objects):
        if not isinstance(obj, Mapping):
            raise SliceError(f"allocated entry #{i}: must be an object")
        if obj.get("kind") == "ResourceClaim" or "status" in obj:
            alloc = (obj.get("status") or {}).get("allocation") or {}
            results = (alloc.get("devices") or {}).get("results") or []
        elif "results" in obj:
            results = obj.get("results") or []
        else:
            results = [obj]
        for j, res in enumerate(results):
            if not isinstance(res, Mapping) or not all(
                isinstance(res.get(k), str) for k in ("driver", "pool", "device")
            ):
                raise SliceError(
                    f"allocated entry #{i}, result #{j}: needs driver, pool and device strings"
                )
            if not res.get("adminAccess") and not res.get("shareID"):
                used.add((res["driver"], res["pool"], res["device"]))
    return used


def lookup_attribute(device: Device, name: str) -> Mapping[str, Any] | None:
    """A fully qualified attribute of a device; bare names live in the driver's domain."""
    attrs = device.data.get("attributes") or {}
    if name in attrs:
        found = attrs[name]
        return found if isinstance(found, Mapping) else None
    domain, _, ident = name.partition("/")
    if domain == device.driver and ident in attrs:
        found = attrs[ident]
        return found if isinstance(found, Mapping) else None
    return None


def attribute_key(attr: Mapping[str, Any] | None) -> tuple[str, Any] | None:
    """A comparable (type, value) for ``matchAttribute``; ``None`` when unset or unknown."""
    if attr is None:
        return None
    for kind in ("string", "int", "bool", "version"):
        if kind in attr:
            return (kind, attr[kind])
    return None
