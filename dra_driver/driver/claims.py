"""What a ResourceClaim asks this node's kubelet plugin to prepare (pure functions).

The kubelet only hands us a claim's namespace, name and UID; the allocation the scheduler wrote
into ``status.allocation`` says which devices and opaque configs are ours. This module turns that
JSON into plain, typed data: the results of *our* driver and pool, each with its main request name
(``gpu/h100`` → ``gpu``, because kubelet matches request names against containers, which never
name a subrequest) and the opaque configs of our driver that apply to it, in the order they apply
(class configs first, then claim configs; later ones override earlier ones).

Every error names the claim, and the device or config entry at fault.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from dra_driver import records
from dra_driver.driver import claimrecords

Obj = Mapping[str, Any]

SOURCE_CLASS = "FromClass"
SOURCE_CLAIM = "FromClaim"
_SOURCE_ORDER = {SOURCE_CLASS: 0, SOURCE_CLAIM: 1}


class ClaimError(Exception):
    """The claim cannot be prepared as it stands; the message names the claim and the reason."""


@records.record
class ClaimRef:
    """The identity kubelet sends: enough to GET the claim and to check it is still the same."""

    uid: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"ResourceClaim {self.namespace}/{self.name} (uid {self.uid})"


@records.record
class OpaqueConfig:
    """One ``opaque`` config entry of our driver from ``status.allocation.devices.config``."""

    index: int  # position in status.allocation.devices.config, for error messages
    source: str  # FromClass / FromClaim
    requests: tuple[str, ...]  # empty = applies to every request of the claim
    parameters: Mapping[str, Any]

    def applies_to(self, request: str) -> bool:
        """Whether this config covers a result of ``request`` (``req`` or ``req/sub``).

        A config naming ``req`` covers all of its subrequests; one naming ``req/sub`` only that one.
        """
        if not self.requests:
            return True
        return any(r == request or request.startswith(r + "/") for r in self.requests)

    def describe(self) -> str:
        return f"config[{self.index}] ({self.source or 'no source'})"


@records.record
class AllocatedDevice:
    """One allocation result of our driver and pool, with the configs that apply to it."""

    request: str  # as allocated: "gpu" or "gpu/h100"
    pool: str
    device: str
    admin_access: bool
    share_id: str | None
    configs: tuple[OpaqueConfig, ...]
    # What a share of a multi-allocatable device consumes (``consumedCapacity``): name → quantity.
    consumed_capacity: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # The request's tolerations, as the scheduler copied them into the result.
    tolerations: tuple[Mapping[str, Any], ...] = ()

    @property
    def request_name(self) -> str:
        """The main request name, the only one kubelet can match against containers."""
        return main_request(self.request)


def main_request(request: str) -> str:
    """``gpu/h100`` → ``gpu``; ``gpu`` stays ``gpu``."""
    return request.split("/", 1)[0]


def check_identity(claim: Obj, ref: ClaimRef) -> None:
    """The claim read from the API server is the one kubelet meant (same UID)."""
    meta = claim.get("metadata")
    uid = meta.get("uid") if isinstance(meta, Mapping) else None
    if uid != ref.uid:
        raise ClaimError(
            f"{ref}: claim was replaced: the API server now has uid {uid!r} under that name"
        )


def reserved_pods(claim: Obj) -> tuple[str, ...]:
    """The names of the pods in the claim's ``status.reservedFor`` (other consumers and
    malformed entries are skipped: this only labels metrics)."""
    status = claim.get("status")
    entries = status.get("reservedFor") if isinstance(status, Mapping) else None
    if not isinstance(entries, list):
        return ()
    return tuple(
        e["name"]
        for e in entries
        if isinstance(e, Mapping)
        and e.get("resource") == "pods"
        and not e.get("apiGroup")
        and isinstance(e.get("name"), str)
    )


def allocated_devices(
    claim: Obj, *, ref: ClaimRef, driver: str, pool: str
) -> tuple[AllocatedDevice, ...]:
    """The devices of ``driver`` in ``pool`` that ``claim`` was allocated, in result order.

    Raises :class:`ClaimError` when the claim is not ours to prepare: another UID, not allocated,
    malformed allocation, no result of our driver, or results of our driver in another pool
    (a device this node cannot provide).
    """
    check_identity(claim, ref)
    status = claim.get("status")
    allocation = status.get("allocation") if isinstance(status, Mapping) else None
    if not isinstance(allocation, Mapping):
        raise ClaimError(f"{ref}: claim is not allocated (status.allocation is not set)")
    devices = allocation.get("devices")
    if devices is None:
        devices = {}
    if not isinstance(devices, Mapping):
        raise ClaimError(f"{ref}: status.allocation.devices is not an object")
    configs = _our_configs(devices.get("config"), ref=ref, driver=driver)
    results = devices.get("results")
    if results is None:
        results = []
    if not isinstance(results, list):
        raise ClaimError(f"{ref}: status.allocation.devices.results is not a list")

    ours: list[AllocatedDevice] = []
    foreign_pool: list[str] = []
    for index, result in enumerate(results):
        where = f"status.allocation.devices.results[{index}]"
        if not isinstance(result, Mapping):
            raise ClaimError(f"{ref}: {where} is not an object")
        if result.get("driver") != driver:
            continue
        request = _string(result, "request", ref=ref, where=where)
        device = _string(result, "device", ref=ref, where=where)
        result_pool = _string(result, "pool", ref=ref, where=where)
        if result_pool != pool:
            foreign_pool.append(f"{result_pool}/{device}")
            continue
        admin = result.get("adminAccess", False)
        if admin is None:
            admin = False
        if not isinstance(admin, bool):
            raise ClaimError(f"{ref}: {where}.adminAccess is not a boolean")
        share_id = result.get("shareID")
        if share_id is not None and not isinstance(share_id, str):
            raise ClaimError(f"{ref}: {where}.shareID is not a string")
        consumed = result.get("consumedCapacity") or {}
        if not isinstance(consumed, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str | int) for k, v in consumed.items()
        ):
            raise ClaimError(f"{ref}: {where}.consumedCapacity is not a map of quantities")
        tolerations = result.get("tolerations") or []
        if not isinstance(tolerations, list) or not all(
            isinstance(t, Mapping) for t in tolerations
        ):
            raise ClaimError(f"{ref}: {where}.tolerations must be a list of objects")
        ours.append(
            AllocatedDevice(
                request=request,
                pool=result_pool,
                device=device,
                admin_access=admin,
                share_id=share_id or None,
                configs=tuple(c for c in configs if c.applies_to(request)),
                consumed_capacity={k: str(v) for k, v in consumed.items()},
                tolerations=tuple(tolerations),
            )
        )
    if foreign_pool:
        raise ClaimError(
            f"{ref}: device(s) {', '.join(foreign_pool)} of driver {driver} are not in this "
            f"node's pool {pool!r}"
        )
    if not ours:
        raise ClaimError(f"{ref}: claim has no devices of driver {driver} in pool {pool!r}")
    return tuple(ours)


def _our_configs(raw: object, *, ref: ClaimRef, driver: str) -> tuple[OpaqueConfig, ...]:
    """Opaque configs of ``driver``: class configs first, then claim configs, each in order."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ClaimError(f"{ref}: status.allocation.devices.config is not a list")
    found: list[OpaqueConfig] = []
    for index, entry in enumerate(raw):
        where = f"status.allocation.devices.config[{index}]"
        if not isinstance(entry, Mapping):
            raise ClaimError(f"{ref}: {where} is not an object")
        opaque = entry.get("opaque")
        if not isinstance(opaque, Mapping) or opaque.get("driver") != driver:
            continue
        params = opaque.get("parameters")
        if not isinstance(params, Mapping):
            raise ClaimError(f"{ref}: {where}.opaque.parameters must be a JSON object")
        requests = entry.get("requests") or []
        if not isinstance(requests, list) or not all(isinstance(r, str) for r in requests):
            raise ClaimError(f"{ref}: {where}.requests must be a list of request names")
        source = entry.get("source") or ""
        if not isinstance(source, str):
            raise ClaimError(f"{ref}: {where}.source is not a string")
        found.append(
            OpaqueConfig(index=index, source=source, requests=tuple(requests), parameters=params)
        )
    # Stable: keeps the given order within each source; unknown sources sort last.
    found.sort(key=lambda c: _SOURCE_ORDER.get(c.source, 2))
    return tuple(found)


def _string(result: Obj, key: str, *, ref: ClaimRef, where: str) -> str:
    value = result.get(key)
    if not isinstance(value, str) or not value:
        raise ClaimError(f"{ref}: {where}.{key} is missing or not a string")
    return value


def check_ref(ref: ClaimRef) -> None:
    """:class:`ClaimError` unless ``ref`` is usable: a UID fit for file and CDI device names
    (Kubernetes UIDs are UUIDs), a namespace and a name. Fuzzed input can be huge: the error
    quotes at most 80 characters of each part."""
    if not claimrecords.valid_uid(ref.uid):
        raise ClaimError(
            f"ResourceClaim {_short(ref.namespace)}/{_short(ref.name)}: invalid claim uid "
            f"{_short(ref.uid)!r}"
        )
    if not ref.namespace or not ref.name:
        raise ClaimError(f"{ref}: namespace and name are required")


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else f"{text[:limit]}...({len(text)} characters)"
