"""Shared counters of partitionable devices, as kube-scheduler 1.36 books them.

Why it exists: with DRAPartitionableDevices (beta, on by default in 1.36) a pool publishes
counter sets (``sharedCounters``, in slices of their own) and a device may consume counters
from them (``consumesCounters``); a device can only be allocated while every counter it uses
has enough left. Our own slices rely on this: a device standing for several GPUs and each of
those GPUs consume the same per-GPU counter, so the scheduler never hands out one GPU twice.
The simulator must book counters exactly like the scheduler to predict its picks:

* what is left of a counter = its value minus what every *allocated* device of the pool
  consumes (devices of the pool's other slices included); that may go negative;
* a candidate fits when, after adding its consumption to what the claims being allocated
  already use, no counter of any set of the pool is used beyond what is left (so one counter
  already overdrawn by allocated devices blocks every consuming device of the pool).

Values are held as integer nano-units (exact, like Go's ``resource.Quantity``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dra_driver.apimachinery import quantity as qty

CounterSets = dict[str, dict[str, int]]  # set name -> counter name -> value (nanos)
Consumption = tuple[tuple[str, tuple[tuple[str, int], ...]], ...]  # (set, ((counter, nanos)))
PoolKey = tuple[str, str]  # (driver, pool)


class CounterError(Exception):
    """A counter set or consumption the pool cannot honour (makes the pool invalid)."""


def _nanos(value: Any, where: str) -> int:
    text = value.get("value") if isinstance(value, Mapping) else None
    if not isinstance(text, str):
        raise CounterError(f"{where}: value must be a quantity string")
    try:
        return _parse(text)
    except qty.QuantityError as err:
        raise CounterError(f"{where}: {err}") from err


@functools.lru_cache(maxsize=1024)
def _parse(text: str) -> int:
    return qty.parse_quantity(text).nanos


def counter_sets(specs: Iterable[Mapping[str, Any]]) -> CounterSets:
    """All counter sets of a pool's counter slices; a name used twice is an error."""
    sets: CounterSets = {}
    for spec in specs:
        for entry in spec.get("sharedCounters") or ():
            name = entry.get("name") if isinstance(entry, Mapping) else None
            if not isinstance(name, str):
                raise CounterError("a counter set has no name")
            if name in sets:
                raise CounterError(f"duplicate counter set name {name}")
            raw = entry.get("counters") or {}
            sets[name] = {c: _nanos(v, f"counter set {name}: counter {c}") for c, v in raw.items()}
    return sets


def consumption(device: Mapping[str, Any], sets: Mapping[str, Mapping[str, int]]) -> Consumption:
    """What ``device`` consumes; a set or counter the pool lacks is an error."""
    out: list[tuple[str, tuple[tuple[str, int], ...]]] = []
    for entry in device.get("consumesCounters") or ():
        name = entry.get("counterSet") if isinstance(entry, Mapping) else None
        if not isinstance(name, str) or name not in sets:
            raise CounterError(f"counter set {name} not found")
        used: list[tuple[str, int]] = []
        for counter, value in (entry.get("counters") or {}).items():
            if counter not in sets[name]:
                raise CounterError(f"counter {counter} not found in counter set {name}")
            used.append((counter, _nanos(value, f"device {device.get('name')}: {counter}")))
        out.append((name, tuple(used)))
    return tuple(out)


class Ledger:
    """Counters left per pool, and what the claims being allocated consume on top.

    ``pools`` maps a pool to its counter sets and to the consumption of every device of the
    pool that is allocated already.
    """

    def __init__(
        self, pools: Mapping[PoolKey, tuple[Mapping[str, Mapping[str, int]], Sequence[Consumption]]]
    ) -> None:
        self.left: dict[PoolKey, CounterSets] = {}
        self.overdrawn: set[PoolKey] = set()
        self.using: dict[PoolKey, dict[tuple[str, str], int]] = {}
        for key, (sets, allocated) in pools.items():
            left = {name: dict(values) for name, values in sets.items()}
            for consumed in allocated:
                for set_name, used in consumed:
                    for counter, nanos in used:
                        if counter in left.get(set_name, {}):
                            left[set_name][counter] -= nanos
            self.left[key] = left
            if any(v < 0 for values in left.values() for v in values.values()):
                self.overdrawn.add(key)
            self.using[key] = {}

    def fits(self, pool: PoolKey, consumes: Consumption) -> bool:
        """Whether a device consuming ``consumes`` fits on top of what is booked."""
        if not consumes:
            return True
        if pool in self.overdrawn:
            return False
        left, using = self.left.get(pool, {}), self.using.get(pool, {})
        need: dict[tuple[str, str], int] = {}
        for set_name, used in consumes:
            for counter, nanos in used:
                key = (set_name, counter)
                need[key] = need.get(key, 0) + nanos
        for (set_name, counter), nanos in need.items():
            if using.get((set_name, counter), 0) + nanos > left.get(set_name, {}).get(counter, 0):
                return False
        return True

    def take(self, pool: PoolKey, consumes: Consumption) -> bool:
        """Book ``consumes`` if it fits; ``False`` (nothing booked) when it does not."""
        if not self.fits(pool, consumes):
            return False
        using = self.using.setdefault(pool, {})
        for set_name, used in consumes:
            for counter, nanos in used:
                using[(set_name, counter)] = using.get((set_name, counter), 0) + nanos
        return True

    def give_back(self, pool: PoolKey, consumes: Consumption) -> None:
        using = self.using.setdefault(pool, {})
        for set_name, used in consumes:
            for counter, nanos in used:
                using[(set_name, counter)] -= nanos
