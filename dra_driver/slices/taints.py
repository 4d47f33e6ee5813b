"""Device taints for unhealthy GPUs: a pass over the built devices, before they become slices.

Why it exists: in DRA mode an unhealthy device is isolated by a taint in its ResourceSlice
(``resource.k8s.io/v1`` ``devices[].taints``): the scheduler then gives it only to requests that
tolerate the taint, and ``NoExecute`` also evicts the pods using it. The pass is separate from
slice building so it composes with whatever devices the builder makes: a device is tainted with
the conditions of every GPU or MIG UUID it names in its ``uuid``, ``parentUUID`` or ``uuids``
attribute (a MIG device inherits its parent GPU's taints; a device standing for a group of GPUs
is tainted when any of them is unhealthy). Taint
keys are in the driver's domain (``gpu.nvidia.com/xid``), values the XID or a short reason,
effects as the health policy says (:mod:`dra_driver.devices.healthpolicy`). On a server that
drops device taints (feature gate DRADeviceTaints off) the same pass withdraws such a device from
the slices instead (``withdraw``), until it recovers. The output is
deterministic — the same health gives byte-identical devices — so the publisher writes nothing
when nothing changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from dra_driver.devices import health, migprofiles, model
from dra_driver.slices import build, taintrules

Obj = dict[str, Any]
UUID_ATTRIBUTES = ("uuid", "parentUUID", "uuids")
_STRENGTH = {"NoExecute": 0, "NoSchedule": 1}


def device_uuids(device: Mapping[str, Any], driver_name: str) -> tuple[str, ...]:
    """The GPU and MIG UUIDs a published device stands for (own, parent's, a group's)."""
    attrs = device.get("attributes") or {}
    found: list[str] = []
    for name in UUID_ATTRIBUTES:
        for key in (name, f"{driver_name}/{name}"):
            attr = attrs.get(key) or {}
            if isinstance(attr.get("string"), str):
                found += [u.strip() for u in attr["string"].split(",") if u.strip()]
            found += [str(u) for u in attr.get("strings") or ()]
    return tuple(dict.fromkeys(found))


def taints_for(conditions: Iterable[health.Condition], driver_name: str) -> list[Obj]:
    """Taints for ``conditions`` in a fixed order (strongest effect first, then key, value),
    duplicates dropped, at most the API's limit per device."""
    unique = {(f"{driver_name}/{c.kind}", c.value, c.effect) for c in conditions}
    ordered = sorted(unique, key=lambda t: (_STRENGTH.get(t[2], 2), t[0], t[1]))
    out: list[Obj] = []
    for key, value, effect in ordered[: taintrules.MAX_TAINTS]:
        taint: Obj = {"key": key}
        if value:
            taint["value"] = value
        taint["effect"] = effect
        out.append(taint)
    return out


def device_taints(
    device: Mapping[str, Any], snapshot: health.Snapshot, driver_name: str
) -> list[Obj]:
    """The taints ``device`` carries under ``snapshot``."""
    conditions = [
        c for uuid in device_uuids(device, driver_name) for c in snapshot.conditions.get(uuid, ())
    ]
    return taints_for(conditions, driver_name)


def decorator(
    snapshot: health.Snapshot, driver_name: str, *, withdraw: bool = False
) -> Callable[[list[Obj]], None]:
    """A ``build(decorate=...)`` pass setting each device's taints from ``snapshot``.

    ``withdraw`` (the API server drops device taints, :mod:`.serverfeatures`): a device that
    would be tainted is removed from the list instead — an unhealthy GPU with its MIG devices
    and placements — so no claim gets it while it is unhealthy; the others keep their order."""

    def apply(devices: list[Obj]) -> None:
        if withdraw:  # only what a taint would keep claims off (not an effect of None)
            devices[:] = [
                d
                for d in devices
                if not any(
                    t["effect"] in _STRENGTH for t in device_taints(d, snapshot, driver_name)
                )
            ]
            return
        for device in devices:
            taints = device_taints(device, snapshot, driver_name)
            if taints:
                device["taints"] = taints
            else:
                device.pop("taints", None)

    return apply


def lookup(
    board: health.HealthBoard, uuids_by_name: Mapping[str, Iterable[str]], driver_name: str
) -> Callable[[str], list[Obj]]:
    """Device name → its taints now, each with a ``message`` saying why (for prepare's error;
    not part of the API object)."""
    named = {name: tuple(uuids) for name, uuids in uuids_by_name.items()}

    def taints_of(name: str) -> list[Obj]:
        snap = board.snapshot()
        conditions = [c for u in named.get(name, ()) for c in snap.conditions.get(u, ())]
        messages = {(f"{driver_name}/{c.kind}", c.value): c.message for c in conditions}
        return [
            {**t, "message": messages.get((t["key"], t.get("value", "")), "")}
            for t in taints_for(conditions, driver_name)
        ]

    return taints_of


def published_uuids(
    devices: model.NodeDevices,
    *,
    node_name: str,
    driver_name: str,
    dynamic_mig: migprofiles.DynamicMig = migprofiles.STATIC,
) -> dict[str, tuple[str, ...]]:
    """Published device name → the GPU/MIG UUIDs it stands for (whose health is watched)."""
    try:
        result = build.build(
            devices, node_name=node_name, driver_name=driver_name, dynamic_mig=dynamic_mig
        )
        entries = [d for s in result.slices for d in s["spec"].get("devices", [])]
    except build.BuildError:  # not publishable at all: still watch what we would prepare
        entries = build.device_entries(devices, dynamic_mig=dynamic_mig)
    return {d["name"]: device_uuids(d, driver_name) for d in entries}
