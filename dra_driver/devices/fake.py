"""The fake discovery backend: a node's GPUs described by a topology profile.

Runs the driver without GPUs (laptops, CI, kind clusters). It turns a
:class:`~dra_driver.devices.profiles.Profile` into the same device model the NVML backend
produces, with features a card lacks simply absent, as NVML reports them.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from dra_driver.devices import model, profiles, topology


class FakeBackend:
    """Discovery from a profile; also the source of fake health changes for tests and demos."""

    def __init__(self, profile: profiles.Profile) -> None:
        self.profile = profile

    @classmethod
    def from_name(cls, name: str) -> FakeBackend:
        return cls(profiles.load_builtin(name))

    @classmethod
    def from_file(cls, path: Path) -> FakeBackend:
        return cls(profiles.load_file(path))

    def discover(self) -> model.NodeDevices:
        prof = self.profile
        n = len(prof.gpus)
        switched = prof.nvlink.switched if prof.nvlink else None
        gpus: list[model.Gpu] = []
        for pos in range(n):
            gpus.append(self._gpu(pos, switched))
        by_index = {g.index: (g, prof.gpus[pos].pcie_switch) for pos, g in enumerate(gpus)}
        paths = {}
        for a, b in itertools.combinations(sorted(by_index), 2):
            (ga, sa), (gb, sb) = by_index[a], by_index[b]
            paths[(a, b)] = topology.derive_pcie_path(ga, gb, sa, sb)
        return model.NodeDevices(gpus=tuple(sorted(gpus, key=lambda g: g.index)),
                                 pcie_paths=paths)

    def _gpu(self, pos: int, switched: int | None) -> model.Gpu:
        prof = self.profile
        spec = prof.gpus[pos]
        index = prof.gpu_index(pos)
        if switched:
            links = {prof.gpu_index(p): switched for p in range(len(prof.gpus)) if p != pos}
        else:
            links = {
                prof.gpu_index(p): prof.links(pos, p)
                for p in range(len(prof.gpus))
                if p != pos and prof.links(pos, p) > 0
            }
        fabric = prof.resolved(pos, "fabric")
        migs = tuple(
            model.MigDevice(
                uuid=prof.mig_uuid(pos, m),
                parent_index=index,
                profile=m.profile,
                gpu_instance_id=i + 1,
                compute_instance_id=0,
                placement_start=m.placement_start,
                placement_size=m.placement_size,
                memory_bytes=m.memory,
                multiprocessors=m.multiprocessors,
                copy_engines=m.copy_engines,
                decoders=m.decoders,
                encoders=m.encoders,
                jpeg_engines=m.jpeg_engines,
                ofa_engines=m.ofa_engines,
            )
            for i, m in enumerate(sorted(spec.mig or (), key=lambda m: m.placement_start))
        )
        return model.Gpu(
            index=index,
            minor=spec.minor if spec.minor is not None else index,
            uuid=prof.gpu_uuid(pos),
            product_name=prof.resolved(pos, "product_name"),
            brand=prof.resolved(pos, "brand"),
            architecture=prof.resolved(pos, "architecture"),
            cuda_compute_capability=prof.resolved(pos, "cuda_compute_capability"),
            driver_version=prof.driver_version,
            cuda_driver_version=prof.cuda_driver_version,
            memory_bytes=prof.resolved(pos, "memory"),
            pci_bus_id=_sysfs_bus_id(spec.pci_bus_id),
            pcie_root=spec.pcie_root,
            numa_node=spec.numa_node,
            mig_enabled=spec.mig is not None,
            mig_devices=migs,
            nvlinks=links,
            nvlink_switched=bool(switched),
            fabric=None if fabric is None else model.FabricInfo(
                cluster_uuid=fabric.cluster_uuid, clique_id=fabric.clique_id, state=fabric.state
            ),
        )


def _sysfs_bus_id(bus_id: str) -> str:
    """NVML's ``00000000:17:00.0`` and sysfs' ``0000:17:00.0`` both become the sysfs form."""
    domain, rest = bus_id.lower().split(":", 1)
    return f"{int(domain, 16):04x}:{rest}"
