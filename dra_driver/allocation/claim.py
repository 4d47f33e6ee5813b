"""Typed views of the ResourceClaim and DeviceClass fields that allocation reads.

Why it exists: the allocator, its scheduler emulation and the explanations all walk the same
requests, subrequests and constraints. Parsing the resource.k8s.io/v1 dicts once, with the
server's defaults applied (``allocationMode: ExactCount``, ``count: 1``; ``count: 0`` counts as
unset) and every structural mistake reported with its field path, keeps those three honest.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from dra_driver import records
from dra_driver.apimachinery import quantity

EXACT_COUNT = "ExactCount"
ALL = "All"
MAX_RESULTS = 32  # allocation results per claim (resource.k8s.io limit)


class ClaimError(Exception):
    """A claim or class cannot be used as given; the message names the object and field."""


@records.record
class Request:
    """One thing to allocate: a plain request, or one subrequest of a ``firstAvailable`` list."""

    name: str  # "req" or "req/sub": the name allocation results carry
    main: str  # the request's own name
    sub: str | None
    class_name: str
    selectors: tuple[str, ...]
    mode: str  # ExactCount | All
    count: int  # ExactCount only
    admin_access: bool
    tolerations: tuple[Mapping[str, Any], ...]
    # ``capacity.requests``: what the request consumes of a shared device (name → quantity)
    capacity: Mapping[str, quantity.Quantity] = dataclasses.field(default_factory=dict)


@records.record
class RequestGroup:
    """An entry of ``spec.devices.requests``: one request, or alternatives tried in order."""

    name: str
    alternatives: tuple[Request, ...]
    first_available: bool


@records.record
class Constraint:
    """A ``matchAttribute`` constraint; ``requests`` empty = every request of the claim."""

    index: int
    attribute: str  # fully qualified
    requests: tuple[str, ...]

    def applies(self, request: Request) -> bool:
        if not self.requests:
            return True
        return request.main in self.requests or request.name in self.requests


@records.record
class Claim:
    name: str
    namespace: str
    groups: tuple[RequestGroup, ...]
    constraints: tuple[Constraint, ...]
    config: tuple[Mapping[str, Any], ...]


@records.record
class DeviceClass:
    name: str
    selectors: tuple[str, ...]
    config: tuple[Mapping[str, Any], ...]


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ClaimError(f"{where}: must be an object")
    return value


def _list(value: Any, where: str) -> Sequence[Any]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ClaimError(f"{where}: must be a list")
    return value


def _name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ClaimError(f"{where}: required, a non-empty string")
    return value


def _selectors(value: Any, where: str) -> tuple[str, ...]:
    out: list[str] = []
    for i, sel in enumerate(_list(value, where)):
        expr = _mapping(_mapping(sel, f"{where}[{i}]").get("cel"), f"{where}[{i}].cel")
        expression = expr.get("expression")
        if not isinstance(expression, str):
            raise ClaimError(f"{where}[{i}].cel.expression: required, a string")
        out.append(expression)
    return tuple(out)


def _request(spec: Mapping[str, Any], *, main: str, sub: str | None, where: str) -> Request:
    class_name = _name(spec.get("deviceClassName"), f"{where}.deviceClassName")
    mode = spec.get("allocationMode") or EXACT_COUNT
    if mode not in (EXACT_COUNT, ALL):
        raise ClaimError(f"{where}.allocationMode: must be ExactCount or All, not {mode!r}")
    count = spec.get("count")
    if count is None or count == 0:
        count = 1 if mode == EXACT_COUNT else 0
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ClaimError(f"{where}.count: must be a positive integer, not {count!r}")
    if mode == ALL and count:
        raise ClaimError(f"{where}.count: must not be set with allocationMode All")
    admin = spec.get("adminAccess", False)
    if not isinstance(admin, bool):
        raise ClaimError(f"{where}.adminAccess: must be a boolean")
    tolerations = tuple(
        _mapping(t, f"{where}.tolerations[{i}]")
        for i, t in enumerate(_list(spec.get("tolerations"), f"{where}.tolerations"))
    )
    requests = _mapping(
        _mapping(spec.get("capacity"), f"{where}.capacity").get("requests"),
        f"{where}.capacity.requests",
    )
    capacity: dict[str, quantity.Quantity] = {}
    for key, text in requests.items():
        try:
            capacity[str(key)] = quantity.parse_quantity(str(text))
        except quantity.QuantityError as err:
            raise ClaimError(f"{where}.capacity.requests[{key}]: {err}") from err
    return Request(
        name=main if sub is None else f"{main}/{sub}",
        main=main,
        sub=sub,
        class_name=class_name,
        selectors=_selectors(spec.get("selectors"), f"{where}.selectors"),
        mode=mode,
        count=count,
        admin_access=admin,
        tolerations=tolerations,
        capacity=capacity,
    )


def claim_spec(obj: Mapping[str, Any]) -> tuple[str, str, Mapping[str, Any]]:
    """(name, namespace, ResourceClaimSpec) of a ResourceClaim or ResourceClaimTemplate."""
    kind = obj.get("kind", "ResourceClaim")
    meta = _mapping(obj.get("metadata"), "metadata")
    name = str(meta.get("name") or meta.get("generateName") or "<unnamed>")
    namespace = str(meta.get("namespace") or "default")
    if kind == "ResourceClaimTemplate":
        spec = _mapping(_mapping(obj.get("spec"), "spec").get("spec"), "spec.spec")
    elif kind == "ResourceClaim":
        spec = _mapping(obj.get("spec"), "spec")
    else:
        raise ClaimError(f"{kind} {name}: not a ResourceClaim or ResourceClaimTemplate")
    return name, namespace, spec


def parse_claim(obj: Mapping[str, Any]) -> Claim:
    """Parse a ResourceClaim (or template); raises :class:`ClaimError` naming the field."""
    name, namespace, spec = claim_spec(obj)
    try:
        return _parse_spec(name, namespace, spec)
    except ClaimError as err:
        raise ClaimError(f"ResourceClaim {name}: {err}") from err


def _parse_spec(name: str, namespace: str, spec: Mapping[str, Any]) -> Claim:
    devices = _mapping(spec.get("devices"), "spec.devices")
    groups: list[RequestGroup] = []
    seen: set[str] = set()
    for i, req in enumerate(_list(devices.get("requests"), "spec.devices.requests")):
        where = f"spec.devices.requests[{i}]"
        req = _mapping(req, where)
        main = _name(req.get("name"), f"{where}.name")
        if main in seen:
            raise ClaimError(f"{where}.name: duplicate request name {main!r}")
        seen.add(main)
        exactly, first = req.get("exactly"), req.get("firstAvailable")
        if (exactly is None) == (first is None):
            raise ClaimError(f"{where}: exactly one of exactly or firstAvailable is required")
        alts: tuple[Request, ...]
        if exactly is not None:
            alts = (
                _request(
                    _mapping(exactly, f"{where}.exactly"),
                    main=main,
                    sub=None,
                    where=f"{where}.exactly",
                ),
            )
        else:
            subs = _list(first, f"{where}.firstAvailable")
            if not subs:
                raise ClaimError(f"{where}.firstAvailable: must not be empty")
            parsed = []
            for j, sub in enumerate(subs):
                sw = f"{where}.firstAvailable[{j}]"
                sub = _mapping(sub, sw)
                if sub.get("adminAccess"):
                    raise ClaimError(f"{sw}.adminAccess: not allowed in a subrequest")
                parsed.append(
                    _request(sub, main=main, sub=_name(sub.get("name"), f"{sw}.name"), where=sw)
                )
            alts = tuple(parsed)
        groups.append(RequestGroup(main, alts, exactly is None))
    if not groups:
        raise ClaimError("spec.devices.requests: the claim requests no devices")
    constraints: list[Constraint] = []
    for i, con in enumerate(_list(devices.get("constraints"), "spec.devices.constraints")):
        where = f"spec.devices.constraints[{i}]"
        con = _mapping(con, where)
        attribute = con.get("matchAttribute")
        if attribute is None:
            kinds = sorted(k for k in con if k != "requests")
            raise ClaimError(f"{where}: only matchAttribute is supported (got {kinds or 'none'})")
        if not isinstance(attribute, str) or "/" not in attribute:
            raise ClaimError(
                f"{where}.matchAttribute: must be a fully qualified name "
                f"like gpu.nvidia.com/nvlinkIsland, not {attribute!r}"
            )
        reqs = tuple(str(r) for r in _list(con.get("requests"), f"{where}.requests"))
        constraints.append(Constraint(i, attribute, reqs))
    config = tuple(
        _mapping(c, f"spec.devices.config[{i}]")
        for i, c in enumerate(_list(devices.get("config"), "spec.devices.config"))
    )
    return Claim(name, namespace, tuple(groups), tuple(constraints), config)


def parse_class(obj: Mapping[str, Any]) -> DeviceClass:
    """Parse a DeviceClass; raises :class:`ClaimError` naming the class and field."""
    meta = _mapping(obj.get("metadata"), "metadata")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise ClaimError("DeviceClass: metadata.name is required")
    try:
        spec = _mapping(obj.get("spec"), "spec")
        selectors = _selectors(spec.get("selectors"), "spec.selectors")
        config = tuple(
            _mapping(c, f"spec.config[{i}]")
            for i, c in enumerate(_list(spec.get("config"), "spec.config"))
        )
    except ClaimError as err:
        raise ClaimError(f"DeviceClass {name}: {err}") from err
    return DeviceClass(name, selectors, config)
