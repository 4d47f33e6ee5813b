"""Which ``dra-driver simulate --allocated`` entries name a device of the slices, and which not.

Why it exists: an allocation result is matched by driver, pool and device name; an entry from
another node's claim (``pool: n1`` against a profile published as ``fake-node``) or with a typo
(``device: gpu-99``) matches nothing, so the device it meant stays free and is handed out again
— a wrong answer with exit 0. The simulator says so instead: a warning per entry that matches
nothing, naming the file and the entry, and an error when no entry of any file matches.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dra_driver.allocation import pools

FORMAT = (
    "ResourceClaims with status.allocation (as `kubectl get resourceclaims -o yaml` exports "
    "them), bare `results:` lists, or single results; each result names driver, pool (the "
    "node name for node-local slices) and device"
)


class AllocatedError(Exception):
    """No ``--allocated`` entry names a device of the slices (or a file names none)."""


def entries(docs: Iterable[Any], *, source: str) -> list[pools.DeviceId]:
    """Every result in ``docs``, admin-access and share results included (they name devices
    too); the shapes :func:`~dra_driver.allocation.pools.allocated_ids` reads. A file with no
    result at all is an :class:`AllocatedError`."""
    found: list[pools.DeviceId] = []
    for obj in docs:
        if not isinstance(obj, Mapping):
            continue  # allocated_ids reports these
        if obj.get("kind") == "ResourceClaim" or "status" in obj:
            results = ((obj.get("status") or {}).get("allocation") or {}).get("devices") or {}
            results = results.get("results") or []
        elif "results" in obj:
            results = obj.get("results") or []
        else:
            results = [obj]
        for res in results:
            if isinstance(res, Mapping) and all(
                isinstance(res.get(k), str) for k in ("driver", "pool", "device")
            ):
                found.append((res["driver"], res["pool"], res["device"]))
    if not found:
        raise AllocatedError(
            f"--allocated {source}: no allocation result in it (expected {FORMAT})"
        )
    return found


def check(
    by_source: Mapping[str, Sequence[pools.DeviceId]], slices: Iterable[Mapping[str, Any]]
) -> list[str]:
    """One warning per entry that names no device of ``slices``; :class:`AllocatedError`
    when there are entries and none matches."""
    devices: set[pools.DeviceId] = set()
    pool_names: dict[str, set[str]] = {}
    for obj in slices:
        spec = obj.get("spec") or {}
        driver = str(spec.get("driver") or "")
        pool = str((spec.get("pool") or {}).get("name") or "")
        pool_names.setdefault(driver, set()).add(pool)
        for device in spec.get("devices") or ():
            if isinstance(device, Mapping):
                devices.add((driver, pool, str(device.get("name"))))
    misses: list[str] = []
    total = 0
    for source, found in by_source.items():
        for driver, pool, device in found:
            total += 1
            if (driver, pool, device) in devices:
                continue
            if driver not in pool_names:
                why = f"no slice is of driver {driver}"
            elif pool not in pool_names[driver]:
                why = f"no pool {pool} (the slices' pools: {', '.join(sorted(pool_names[driver]))})"
            else:
                why = f"pool {pool} has no device {device}"
            misses.append(f"{source}: entry {driver}/{pool}/{device} matches no device: {why}")
    if total and len(misses) == total:
        raise AllocatedError(
            f"--allocated: no entry matches a device of the slices ({total} checked); {misses[0]}"
        )
    return [f"--allocated {miss}; not counted as in use" for miss in misses]
