"""Consumable capacity the way the scheduler's allocator accounts for it (DRAConsumableCapacity).

Why it exists: a device with ``allowMultipleAllocations: true`` can go to many claims; each
allocation *consumes* part of every capacity of the device, and a device fits a request only if
what is left covers it. This module is the scheduler's arithmetic in one place, so the simulator
gives the same verdicts and the same ``consumedCapacity`` the scheduler writes:

* a capacity the request names is consumed as requested, rounded up by the capacity's
  ``requestPolicy`` (``validRange``: up to ``min``, then to ``min + n·step``; ``validValues``: to
  the smallest value not below it); one it does not name consumes the policy's ``default``, or
  the whole capacity when there is no policy;
* the rounded amount must obey the policy (not above ``max``, on a step, one of the values);
* the device fits when, for every capacity, what earlier claims consumed plus what this claim
  already took from it plus this amount stays within the capacity's ``value``;
* a request that names a capacity the device does not have never fits that device (the
  allocator skips the device; unqualified names mean the driver's own domain).

The same rules apply to a device without ``allowMultipleAllocations`` (capacity requests then
act as minimums), but only multi-allocatable devices record consumption, get a ``shareID`` and
stay usable by other claims (and by other requests of the same claim). Every "does not fit"
comes with a reason in plain words, such as ``12Gi of memory left, 20Gi requested``.

A device with shares also stands in for the shared counters it consumes (:mod:`.counters`):
the scheduler charges them once, for the first share, so :meth:`Ledger.has` is what decides
whether the next share skips the counter check.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from dra_driver import records
from dra_driver.allocation import pools
from dra_driver.apimachinery import quantity
from dra_driver.slices import requestpolicy

Q = quantity.Quantity


class CapacityError(Exception):
    """A capacity request or consumedCapacity entry that is not a quantity (names the field)."""


@records.record
class Fit:
    """Whether a device fits a request: ``consumed`` (by the device's capacity names) or why not."""

    consumed: dict[str, Q] | None
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.consumed is not None


def multi_allocatable(device: pools.Device) -> bool:
    return device.data.get("allowMultipleAllocations") is True


def parse(raw: Mapping[str, Any], where: str) -> dict[str, Q]:
    """``capacity.requests`` (or a ``consumedCapacity``) as quantities."""
    out: dict[str, Q] = {}
    for name, text in raw.items():
        try:
            out[str(name)] = quantity.parse_quantity(str(text))
        except quantity.QuantityError as exc:
            raise CapacityError(f"{where}[{name}]: {text!r} is not a quantity: {exc}") from None
    return out


class Ledger:
    """What allocated claims consume of each multi-allocatable device (device id → name → sum)."""

    def __init__(self) -> None:
        self.used: dict[pools.DeviceId, dict[str, Q]] = {}

    @classmethod
    def from_allocated(cls, objects: Iterable[Any]) -> Ledger:
        """From ResourceClaims with ``status.allocation``, or bare allocation results: every
        result with a ``shareID`` adds its ``consumedCapacity``."""
        ledger = cls()
        for i, obj in enumerate(objects):
            for j, res in enumerate(_results(obj)):
                if not isinstance(res, Mapping) or not res.get("shareID"):
                    continue
                ids = tuple(res.get(k) for k in ("driver", "pool", "device"))
                if not all(isinstance(x, str) for x in ids):
                    continue  # pools.allocated_ids names malformed results
                consumed = res.get("consumedCapacity") or {}
                if not isinstance(consumed, Mapping):
                    raise CapacityError(f"allocated entry #{i}, result #{j}: consumedCapacity")
                driver = str(ids[0])
                parsed = parse(consumed, f"allocated entry #{i}, result #{j}: consumedCapacity")
                ledger.add(
                    (driver, str(ids[1]), str(ids[2])),
                    {_full(name, driver): value for name, value in parsed.items()},
                )
        return ledger

    def add(self, device: pools.DeviceId, consumed: Mapping[str, Q]) -> None:
        """Add ``consumed`` (fully qualified capacity names) to ``device``'s use."""
        mine = self.used.setdefault(device, {})
        for name, value in consumed.items():
            mine[name] = mine.get(name, Q(0)).add(value)

    def remove(self, device: pools.DeviceId, consumed: Mapping[str, Q]) -> None:
        mine = self.used.get(device, {})
        for name, value in consumed.items():
            if name in mine:
                mine[name] = mine[name].sub(value)

    def of(self, device: pools.DeviceId) -> Mapping[str, Q]:
        return self.used.get(device, {})

    def has(self, device: pools.DeviceId) -> bool:
        """Whether allocated shares use ``device`` (the scheduler's "capacity in use")."""
        return device in self.used

    def devices(self) -> set[pools.DeviceId]:
        return set(self.used)

    def copy(self) -> Ledger:
        other = Ledger()
        other.used = {k: dict(v) for k, v in self.used.items()}
        return other


def fit(device: pools.Device, requests: Mapping[str, Q], used: Mapping[str, Q]) -> Fit:
    """Whether ``device`` can take a request for ``requests`` with ``used`` already consumed."""
    caps = _capacities(device)
    wanted: dict[str, Q] = {}
    for name, value in requests.items():
        key = _resolve(name, device.driver, caps)
        if key is None:
            return Fit(None, f"has no capacity {name}")
        wanted[key] = value
    consumed: dict[str, Q] = {}
    for key, cap in caps.items():
        total = _q(cap.get("value"))
        policy = cap.get("requestPolicy") if isinstance(cap.get("requestPolicy"), Mapping) else None
        amount = _consume(wanted.get(key), total, policy)
        asked = wanted.get(key)
        problem = _violation(amount, policy)
        if problem:
            shown = requestpolicy.shown(asked) if asked is not None else "nothing"
            return Fit(None, f"{_label(key, device)}: {shown} requested, {problem}")
        left = total.sub(used.get(key, Q(0)))
        if amount.compare(left) > 0:
            what = f"{requestpolicy.shown(asked)} requested" if asked is not None else ""
            if asked is not None and asked != amount:
                what += f" (rounded up to {requestpolicy.shown(amount)})"
            if asked is None:
                what = f"{requestpolicy.shown(amount)} needed by default (not requested)"
            return Fit(None, f"{_left(left)} of {_label(key, device)} left, {what}")
        consumed[key] = amount
    return Fit(consumed)


def consumption(device: pools.Device, requests: Mapping[str, Q]) -> dict[str, Q]:
    """What a share of ``device`` consumes for ``requests`` (rounded, defaults filled in), by
    fully qualified capacity name; assumes :func:`fit` accepted the request."""
    out: dict[str, Q] = {}
    wanted = {_full(name, device.driver): value for name, value in requests.items()}
    for key, cap in _capacities(device).items():
        policy = cap.get("requestPolicy") if isinstance(cap.get("requestPolicy"), Mapping) else None
        out[key] = _consume(wanted.get(key), _q(cap.get("value")), policy)
    return out


def combined(*parts: Mapping[str, Q]) -> dict[str, Q]:
    """The sum of several consumptions (capacity name → amount)."""
    out: dict[str, Q] = {}
    for part in parts:
        for name, value in part.items():
            out[name] = out.get(name, Q(0)).add(value)
    return out


def as_status(consumed: Mapping[str, Q], device: pools.Device) -> dict[str, str]:
    """``consumedCapacity`` as the scheduler writes it: every capacity of the device, keyed as the
    device publishes it, values in canonical form."""
    names = {_full(k, device.driver): k for k in (device.data.get("capacity") or {})}
    return {names.get(k, k): requestpolicy.shown(v) for k, v in sorted(consumed.items())}


def share_id(rng: random.Random | None = None) -> str:
    """A new shareID: a lowercase RFC 4122 UUID (seeded for reproducible simulations)."""
    if rng is None:
        return str(uuid.uuid4())
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


# ---- the arithmetic ---------------------------------------------------------------------------


def _results(obj: Any) -> list[Any]:
    if not isinstance(obj, Mapping):
        return []
    if obj.get("kind") == "ResourceClaim" or "status" in obj:
        alloc = (obj.get("status") or {}).get("allocation") or {}
        return list((alloc.get("devices") or {}).get("results") or [])
    if "results" in obj:
        return list(obj.get("results") or [])
    return [obj]


def _capacities(device: pools.Device) -> dict[str, Mapping[str, Any]]:
    """The device's capacities by fully qualified name (its own domain's entry wins)."""
    out: dict[str, Mapping[str, Any]] = {}
    raw = device.data.get("capacity") or {}
    for name, cap in sorted(raw.items(), key=lambda kv: "/" in kv[0]):
        if isinstance(cap, Mapping):
            out[_full(name, device.driver)] = cap
    return out


def _full(name: str, driver: str) -> str:
    return name if "/" in name else f"{driver}/{name}"


def _resolve(name: str, driver: str, caps: Mapping[str, Any]) -> str | None:
    full = _full(name, driver)
    return full if full in caps else None


def _label(key: str, device: pools.Device) -> str:
    return key.removeprefix(f"{device.driver}/")


def _left(left: Q) -> str:
    return requestpolicy.shown(left) if left.sign() > 0 else "0"


def _q(text: Any) -> Q:
    return quantity.parse_quantity(str(text)) if text is not None else Q(0)


def _consume(asked: Q | None, total: Q, policy: Mapping[str, Any] | None) -> Q:
    if asked is None:
        if policy is not None and policy.get("default") is not None:
            return _q(policy["default"])
        return total
    if policy is None:
        return asked
    valid_range = policy.get("validRange")
    if isinstance(valid_range, Mapping) and valid_range.get("min") is not None:
        low = _q(valid_range["min"])
        if asked.compare(low) < 0:
            return low
        step = valid_range.get("step")
        if step is None:
            return asked
        step_q = _q(step)
        n = -(-(asked.nanos - low.nanos) // step_q.nanos)  # ceiling division
        return Q(low.nanos + n * step_q.nanos, step_q.format)
    values = policy.get("validValues")
    if values:
        for value in (_q(v) for v in values):
            if asked.compare(value) <= 0:
                return value
    return asked


def _violation(amount: Q, policy: Mapping[str, Any] | None) -> str:
    """Why ``amount`` breaks the policy ("" when it does not)."""
    if policy is None:
        return ""
    if policy.get("default") is not None and amount == _q(policy["default"]):
        return ""
    valid_range = policy.get("validRange")
    if isinstance(valid_range, Mapping):
        high = valid_range.get("max")
        if high is not None and amount.compare(_q(high)) > 0:
            return f"more than the most a request may take ({requestpolicy.shown(_q(high))})"
        step = valid_range.get("step")
        if step is not None and (amount.nanos - _q(valid_range.get("min")).nanos) % _q(step).nanos:
            return f"not a multiple of {requestpolicy.shown(_q(step))}"
        return ""
    values = [_q(v) for v in policy.get("validValues") or ()]
    if values and amount not in values:
        return f"not one of {', '.join(requestpolicy.shown(v) for v in values)}"
    return ""
