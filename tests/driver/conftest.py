"""Fixtures for the driver core: a node with fake GPUs, an in-memory API, real files in tmp dirs."""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import refdata
import referencing
import referencing.jsonschema

from dra_driver import app, logs
from dra_driver.devices import fake
from dra_driver.driver import claims
from dra_driver.driver import driver as driver_mod
from dra_driver.testing.fakeapi import memory

DRIVER = "gpu.nvidia.com"
NODE = "n1"
REFERENCE = refdata.REFERENCE


def new_uid() -> str:
    return str(uuid.uuid4())


def claim_obj(
    *,
    name: str,
    uid: str,
    devices: list[str] | None = None,
    namespace: str = "default",
    request: str = "gpu",
    pool: str = NODE,
    driver: str = DRIVER,
    config: list[dict[str, Any]] | None = None,
    results: list[dict[str, Any]] | None = None,
    allocated: bool = True,
) -> dict[str, Any]:
    """A ResourceClaim as the scheduler leaves it (one request, given devices)."""
    obj: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": request.split("/")[0],
                        "exactly": {
                            "deviceClassName": "gpu.nvidia.com",
                            "count": len(devices or [1]),
                        },
                    }
                ]
            }
        },
    }
    if allocated:
        if results is None:
            results = [
                {"request": request, "driver": driver, "pool": pool, "device": d}
                for d in devices or []
            ]
        obj["status"] = {"allocation": {"devices": {"results": results, "config": config or []}}}
    return obj


def gpu_config(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": "gpu.nvidia.com/v1", "kind": "GpuConfig", **fields}


def opaque(
    params: dict[str, Any],
    *,
    source: str = "FromClaim",
    requests: list[str] | None = None,
    driver: str = DRIVER,
) -> dict[str, Any]:
    entry: dict[str, Any] = {"source": source, "opaque": {"driver": driver, "parameters": params}}
    if requests is not None:
        entry["requests"] = requests
    return entry


def ref_of(obj: dict[str, Any]) -> claims.ClaimRef:
    meta = obj["metadata"]
    return claims.ClaimRef(uid=meta["uid"], namespace=meta["namespace"], name=meta["name"])


def make_driver_root(root: Path) -> Path:
    """A fake NVIDIA driver installation: versioned libraries, soname links, a binary."""
    lib = root / "usr/lib/x86_64-linux-gnu"
    lib.mkdir(parents=True)
    (lib / "libcuda.so.580.95.05").write_text("cuda")
    (lib / "libcuda.so.1").symlink_to("libcuda.so.580.95.05")
    (lib / "libnvidia-ml.so.580.95.05").write_text("nvml")
    (lib / "libnvidia-ml.so.1").symlink_to("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05")
    (lib / "libnvidia-broken.so.1").symlink_to("nowhere")
    (lib / "libcuda.so.dangling").symlink_to("nowhere")
    (lib / "libz.so.1").write_text("not ours")
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/nvidia-smi").write_text("#!/bin/sh\n")
    (root / "usr/bin/bash").write_text("not ours")
    return root


@dataclasses.dataclass
class Node:
    """One node's plugin core over real directories; ``restart()`` rebuilds it from disk."""

    api: memory.InMemoryApi
    settings: app.PluginSettings
    driver: driver_mod.Driver

    @property
    def cdi_root(self) -> Path:
        return self.settings.cdi_root

    @property
    def claims_dir(self) -> Path:
        return self.settings.plugin_dir / "claims"

    profile: str = "dgx-h100"

    def restart(self, **changes: Any) -> driver_mod.Driver:
        self.driver.close()
        self.settings = dataclasses.replace(self.settings, **changes)
        self.driver = build(self.settings, self.api, self.profile)
        return self.driver

    def add(self, obj: dict[str, Any]) -> claims.ClaimRef:
        self.api.put_resource_claim(obj)
        return ref_of(obj)

    def spec_files(self) -> list[str]:
        return (
            sorted(p.name for p in self.cdi_root.glob("*.json")) if self.cdi_root.is_dir() else []
        )


def build(
    settings: app.PluginSettings, api: memory.InMemoryApi, profile: str = "dgx-h100"
) -> driver_mod.Driver:
    """The plugin core on a fake profile; with ``settings.dynamic_mig`` its MIG instances live
    in the stand-in's state file under the plugin directory, as the agent keeps them."""
    backend = fake.FakeBackend.from_name(profile)
    mig_control = app.mig_control_for(settings, backend)
    devices = backend.discover()
    return app.build_driver(
        settings, devices=devices, api=api, log=logs.get("test"), mig_control=mig_control
    )


@pytest.fixture
def node_factory(tmp_path: Path) -> Iterator[Callable[..., Node]]:
    made: list[Node] = []

    def make(profile: str = "dgx-h100", **changes: Any) -> Node:
        base = tmp_path / f"node{len(made)}"
        (base / "boot_id").parent.mkdir(parents=True, exist_ok=True)
        (base / "boot_id").write_text("boot-1\n")
        settings = app.PluginSettings(
            node_name=NODE,
            driver_name=DRIVER,
            registry_dir=base / "registry",
            plugins_dir=base / "plugins",
            cdi_root=base / "cdi",
            driver_root=make_driver_root(base / "driver-root"),
            fake=True,
            boot_id_file=base / "boot_id",
            cleanup_interval_s=0,
            publish=False,
        )
        settings = dataclasses.replace(settings, **changes)
        api = memory.InMemoryApi(use_default_cel=False)
        n = Node(api=api, settings=settings, driver=build(settings, api, profile), profile=profile)
        made.append(n)
        return n

    yield make
    from . import sharekit  # MPS daemons outlive drivers by design: end them here

    for n in made:
        n.driver.close()
        sharekit.kill_daemons(n)


@pytest.fixture
def node(node_factory: Callable[..., Node]) -> Node:
    return node_factory()


@pytest.fixture(scope="session")
def cdi_validator() -> jsonschema.protocols.Validator:
    """The upstream CDI JSON schema (schema.json + defs.json) as a validator."""
    schema = json.loads((REFERENCE / "cdi" / "schema.json").read_text())
    defs = json.loads((REFERENCE / "cdi" / "defs.json").read_text())
    registry: referencing.Registry[Any] = referencing.Registry().with_resource(
        "defs.json",
        referencing.Resource.from_contents(
            defs, default_specification=referencing.jsonschema.DRAFT7
        ),
    )
    return jsonschema.Draft7Validator(schema, registry=registry)
