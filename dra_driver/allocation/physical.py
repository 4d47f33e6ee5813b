"""Which physical GPUs published devices stand for, and how well a choice of them is placed.

Why it exists: a published device is one GPU, a MIG device of one GPU, or a set of GPUs
(``uuid0``, ``uuid1``, ... in minor order). Placement quality is a property of the physical GPUs
a claim ends up with: NVLink links between them, pairs on one NUMA node, pairs under one PCIe
root (:meth:`dra_driver.devices.topology.Topology.score`). This module turns devices into their
GPUs and builds the pairwise weights the optimum search uses, from the node's real topology when
known, else from the published ``nvlinkIsland``/``numaNode``/``pcieRoot`` attributes (one link
per pair on one island).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from dra_driver.allocation import placement, pools
from dra_driver.devices import model, topology

NUMA_ATTRIBUTE = "resource.kubernetes.io/numaNode"
PCIE_ROOT_ATTRIBUTE = "resource.kubernetes.io/pcieRoot"


def _string(device: pools.Device, name: str) -> str | None:
    attr = pools.lookup_attribute(device, f"{device.driver}/{name}")
    value = attr.get("string") if attr else None
    return value if isinstance(value, str) else None


def members(device: pools.Device) -> tuple[str, ...]:
    """UUIDs of the physical GPUs ``device`` uses (a MIG device: its parent)."""
    found: list[str] = []
    while (uuid := _string(device, f"uuid{len(found)}")) is not None:
        found.append(uuid)
    if found:
        return tuple(found)
    for key in ("parentUUID", "uuid"):
        uuid = _string(device, key)
        if uuid is not None:
            return (uuid,)
    return ()


def kind(device: pools.Device) -> str | None:
    """The ``type`` attribute: ``gpu``, ``mig``, ``gpu-set`` (``None`` when not set)."""
    return _string(device, "type")


def _keys(device: pools.Device) -> tuple[Hashable, Hashable, Hashable]:
    return (
        pools.attribute_key(pools.lookup_attribute(device, f"{device.driver}/nvlinkIsland")),
        pools.attribute_key(pools.lookup_attribute(device, NUMA_ATTRIBUTE)),
        pools.attribute_key(pools.lookup_attribute(device, PCIE_ROOT_ATTRIBUTE)),
    )


class Gpus:
    """The physical GPUs behind a node's devices and the score of any collection of them."""

    def __init__(
        self, devices: Sequence[pools.Device], *, node_devices: model.NodeDevices | None
    ) -> None:
        self.devices = devices
        self._of: dict[int, tuple[str, ...]] = {}
        self.topo = topology.build(node_devices) if node_devices is not None else None
        self.index: dict[str, int] = {}
        if node_devices is not None:
            for gpu in node_devices.gpus:
                self.index[gpu.uuid] = gpu.index
                for mig in gpu.mig_devices:
                    self.index[mig.uuid] = gpu.index
        self._attrs: dict[str, tuple[Hashable, Hashable, Hashable]] | None = None

    def of(self, pos: int) -> tuple[str, ...]:
        """The GPUs of the device at ``pos``."""
        found = self._of.get(pos)
        if found is None:
            found = self._of[pos] = members(self.devices[pos])
        return found

    @property
    def attrs(self) -> dict[str, tuple[Hashable, Hashable, Hashable]]:
        """Without the topology: a GPU's keys from the device that is that one GPU (or MIG)."""
        if self._attrs is None:
            self._attrs = {}
            for pos, dev in enumerate(self.devices):
                uuids = self.of(pos)
                if len(uuids) == 1 and uuids[0] not in self._attrs:
                    self._attrs[uuids[0]] = _keys(dev)
        return self._attrs

    def pair(self, a: str, b: str) -> placement.Score:
        """Score of two GPUs (the same GPU twice: two MIG devices of one GPU)."""
        if self.topo is not None and a in self.index and b in self.index:
            ia, ib = self.index[a], self.index[b]
            na, nb = self.topo.numa_of.get(ia), self.topo.numa_of.get(ib)
            ra, rb = self.topo.pcie_root_of.get(ia), self.topo.pcie_root_of.get(ib)
            return (
                self.topo.links(ia, ib),
                int(na is not None and na == nb),
                int(ra is not None and ra == rb),
            )
        ka, kb = self.attrs.get(a), self.attrs.get(b)
        if ka is None or kb is None:
            return (0, 0, 0)
        same = [int(x is not None and x == y) for x, y in zip(ka, kb, strict=True)]
        return (same[0], same[1], same[2])

    def score(self, uuids: Sequence[str]) -> placement.Score:
        """Score of a collection of GPUs (repeats allowed: MIG devices of one GPU)."""
        total = [0, 0, 0]
        for i, a in enumerate(uuids):
            for b in uuids[i + 1 :]:
                for k, v in enumerate(self.pair(a, b)):
                    total[k] += v
        return total[0], total[1], total[2]

    def of_positions(self, positions: Sequence[int]) -> list[str]:
        return [u for p in positions for u in self.of(p)]

    def weights(self) -> placement.Weights:
        """Pairwise weights over the devices (a set device's own pairs as its self score)."""
        n = len(self.devices)
        cache: dict[tuple[str, str], placement.Score] = {}

        def cross(a: Sequence[str], b: Sequence[str]) -> placement.Score:
            total = [0, 0, 0]
            for x in a:
                for y in b:
                    key = (x, y) if x <= y else (y, x)
                    if key not in cache:
                        cache[key] = self.pair(*key)
                    for k, v in enumerate(cache[key]):
                        total[k] += v
            return total[0], total[1], total[2]

        every = [self.of(i) for i in range(n)]
        rows: list[list[placement.Score]] = [[(0, 0, 0)] * n for _ in range(n)]
        for i in range(n):
            for j in range(i + 1, n):
                rows[i][j] = rows[j][i] = cross(every[i], every[j])
        own = [self.score(u) for u in every]
        gpus = sum(max(1, len(u)) for u in every)
        return placement.Weights(rows, own=own, pairs=gpus * (gpus - 1) // 2)

    def overlap(self, positions: Sequence[int]) -> bool:
        """Whether two of these devices use one physical GPU in full (MIG siblings do not)."""
        seen: dict[str, bool] = {}
        for p in positions:
            whole = len(self.of(p)) > 1 or _string(self.devices[p], "parentUUID") is None
            for uuid in self.of(p):
                if uuid in seen and (whole or seen[uuid]):
                    return True
                seen[uuid] = seen.get(uuid, False) or whole
        return False
