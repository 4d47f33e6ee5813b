"""Builders for allocation tests: ResourceSlices, devices, DeviceClasses and claims as dicts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

DRIVER = "gpu.nvidia.com"
NODE = "node-1"

Obj = dict[str, Any]


def _attr(value: Any) -> Obj:
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    if isinstance(value, tuple) and value[0] == "version":
        return {"version": value[1]}
    return {"string": str(value)}


def device(name: str, *, memory: str = "80Gi", **attributes: Any) -> Obj:
    """A ResourceSlice device; ``numa=``/``root=`` become the standard attributes."""
    attrs: Obj = {"type": {"string": "gpu"}}
    for key, value in attributes.items():
        if key == "numa":
            attrs["resource.kubernetes.io/numaNode"] = _attr(value)
        elif key == "root":
            attrs["resource.kubernetes.io/pcieRoot"] = _attr(value)
        else:
            attrs[key] = _attr(value)
    return {"name": name, "attributes": attrs, "capacity": {"memory": {"value": memory}}}


def rslice(
    devices: Sequence[Obj],
    *,
    name: str = "s-0",
    node: str | None = NODE,
    pool: str = NODE,
    generation: int = 1,
    count: int = 1,
    driver: str = DRIVER,
    **spec: Any,
) -> Obj:
    body: Obj = {
        "driver": driver,
        "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
        "devices": list(devices),
        **spec,
    }
    if node is not None:
        body["nodeName"] = node
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": body,
    }


def device_class(name: str, *selectors: str, config: Sequence[Mapping[str, Any]] = ()) -> Obj:
    spec: Obj = {"selectors": [{"cel": {"expression": s}} for s in selectors]}
    if config:
        spec["config"] = list(config)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": spec,
    }


def request(
    name: str,
    *selectors: str,
    count: int | None = None,
    cls: str = "gpu",
    mode: str | None = None,
    admin: bool = False,
    **extra: Any,
) -> Obj:
    exactly: Obj = {"deviceClassName": cls, **extra}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    if count is not None:
        exactly["count"] = count
    if mode is not None:
        exactly["allocationMode"] = mode
    if admin:
        exactly["adminAccess"] = True
    return {"name": name, "exactly": exactly}


def first_available(name: str, *subs: Obj) -> Obj:
    return {"name": name, "firstAvailable": [{"name": s["name"], **s["exactly"]} for s in subs]}


def rclaim(
    *requests: Obj, constraints: Sequence[Obj] = (), config: Sequence[Obj] = (), name: str = "c"
) -> Obj:
    devices: Obj = {"requests": list(requests)}
    if constraints:
        devices["constraints"] = list(constraints)
    if config:
        devices["config"] = list(config)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": devices},
    }


GPU_CLASS = device_class("gpu", f'device.driver == "{DRIVER}"')
# Whole GPUs only, as the shipped gpu.nvidia.com class: leaves out MIG devices and GPU sets.
WHOLE_GPU_CLASS = device_class(
    "gpu", f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "gpu"'
)
