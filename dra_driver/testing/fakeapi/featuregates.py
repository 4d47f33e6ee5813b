"""DRA feature gates turned off in the fake API server: the fields a real server then drops.

Why it exists: a kube-apiserver with a DRA feature gate off does not refuse a ResourceSlice field
of that gate. It drops the field silently, stores the rest and answers 201 (200 on update) with
no warning (``dropDisabledFields`` in kubernetes ``pkg/registry/resource/resourceslice/
strategy.go``, run before validation). A driver that publishes counters, taints or shareable
devices must be tested against such servers, so the fake can be built with gates off
(``InMemoryApi(disabled_gates=...)``, ``FakeApiServer(disabled_gates=...)``, ``python -m
dra_driver.testing.fakeapi.fakeserver --feature-gates DRADeviceTaints=false``). Tests hold it to
what a real v1.36.2 server with each gate off stored (``../shared/reference/apiserver-verdicts/
gates-off``). With no gate off the fake is the recorded server: every DRA gate on, the alpha
``DRAListTypeAttributes`` and ``DRANodeAllocatableResources`` included.

The rule, per gate (:data:`SLICE_RULES`): the gate's fields are removed from the slice sent,
unless the **old** stored slice (on update) already uses one of them — then all are kept, so a
server whose gate was turned off does not strip fields from objects written before. Only
ResourceSlices: the fake does not emulate what these gates drop from ResourceClaims.

Test kit: nothing in the driver imports this module.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from typing import Any

from dra_driver import records

Obj = dict[str, Any]


@records.record
class SliceRule:
    """The ResourceSlice fields one upstream ``dropDisabled...Fields`` function removes, and
    the gates of which any one being off makes it remove them."""

    gates: frozenset[str]
    spec: tuple[str, ...] = ()  # ResourceSliceSpec fields
    device: tuple[str, ...] = ()  # Device fields, every device
    capacity: tuple[str, ...] = ()  # DeviceCapacity fields, every capacity of every device
    attribute: tuple[str, ...] = ()  # DeviceAttribute fields, every attribute of every device


SLICE_RULES: tuple[SliceRule, ...] = (
    SliceRule(frozenset({"DRADeviceTaints"}), device=("taints",)),
    SliceRule(
        frozenset({"DRAPartitionableDevices"}),
        spec=("sharedCounters", "perDeviceNodeSelection"),
        device=("consumesCounters", "nodeName", "nodeSelector", "allNodes"),
    ),
    SliceRule(
        frozenset({"DRADeviceBindingConditions", "DRAResourceClaimDeviceStatus"}),
        device=("bindsToNode", "bindingConditions", "bindingFailureConditions"),
    ),
    SliceRule(
        frozenset({"DRAConsumableCapacity"}),
        device=("allowMultipleAllocations",),
        capacity=("requestPolicy",),
    ),
    SliceRule(
        frozenset({"DRANodeAllocatableResources"}), device=("nodeAllocatableResourceMappings",)
    ),
    SliceRule(
        frozenset({"DRAListTypeAttributes"}), attribute=("bools", "ints", "strings", "versions")
    ),
)

# Gates that may be turned off: those above, and DRADeviceTaintRules, which only governs
# DeviceTaintRule objects (the fake serves none; the recording turned it off with DRADeviceTaints).
GATES: frozenset[str] = frozenset(
    {"DRADeviceTaintRules", *(gate for rule in SLICE_RULES for gate in rule.gates)}
)


def checked(disabled: Iterable[str]) -> frozenset[str]:
    """``disabled`` as a set, or ValueError naming a gate the fake cannot turn off."""
    gates = frozenset(disabled)
    unknown = sorted(gates - GATES)
    if unknown:
        raise ValueError(
            f"the fake API server cannot turn off {', '.join(unknown)}: it emulates "
            f"{', '.join(sorted(GATES))} off"
        )
    return gates


def parse(text: str) -> frozenset[str]:
    """The gates off in a kube-apiserver ``--feature-gates`` value (``A=false,B=true``)."""
    off: set[str] = set()
    for term in filter(None, (t.strip() for t in text.split(","))):
        name, sep, value = term.partition("=")
        if not sep or value.strip().lower() not in ("true", "false"):
            raise ValueError(f"--feature-gates: {term!r} is not <gate>=<true|false>")
        if value.strip().lower() == "false":
            off.add(name.strip())
    return checked(off)


def drop_disabled_fields(new: Obj, old: Obj | None, disabled: frozenset[str]) -> Obj:
    """A copy of the ResourceSlice ``new`` without the fields of the ``disabled`` gates, as
    the server's ``PrepareForCreate`` (``old`` None) or ``PrepareForUpdate`` leaves it. ``new``
    must have passed strict decoding; ``old`` is the stored slice it replaces."""
    out = copy.deepcopy(new)
    spec = out.get("spec")
    if not isinstance(spec, dict):
        return out
    for rule in SLICE_RULES:
        if rule.gates & disabled and not (old is not None and _in_use(rule, old)):
            for holder, key in _fields(rule, spec):
                holder.pop(key, None)
    return out


def _in_use(rule: SliceRule, obj: Obj) -> bool:
    """Whether ``obj`` sets one of the rule's fields (the ``...FeatureInUse`` functions:
    a non-empty list or map, any other value that is not null)."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return False
    return any(holder.get(key) not in (None, [], {}) for holder, key in _fields(rule, spec))


def _fields(rule: SliceRule, spec: Obj) -> Iterator[tuple[Obj, str]]:
    """(object, key) of every place the rule's fields may sit in ``spec``."""
    for key in rule.spec:
        yield spec, key
    for device in _dicts(spec.get("devices")):
        for key in rule.device:
            yield device, key
        for inner, keys in (("capacity", rule.capacity), ("attributes", rule.attribute)):
            if keys and isinstance(device.get(inner), dict):
                for value in _dicts(list(device[inner].values())):
                    for key in keys:
                        yield value, key


def _dicts(items: Any) -> Iterator[Obj]:
    """The objects of a decoded list (``null`` items are zero values: nothing to drop)."""
    if isinstance(items, list):
        yield from (item for item in items if isinstance(item, dict))
