"""NVLink and PCIe topology of a node, derived from the device model.

Everything topology-aware in the driver reads this one view: the ``nvlinkIsland`` attribute of
ResourceSlices, the ``discover`` matrix, the allocator's placement scoring and the device
plugin's preferred allocation. Pure functions of :class:`~dra_driver.devices.model.NodeDevices`
(the last node's view kept by :func:`build`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping

from dra_driver import records
from dra_driver.devices import model


@records.record
class Island:
    """A connected component of the NVLink graph (an NVSwitch system is a single island)."""

    id: str  # "island-<lowest minor in it>": stable across restarts with the same hardware
    gpu_indices: tuple[int, ...]


@records.record
class Topology:
    """Pairwise NVLink link counts, islands and ``nvidia-smi topo -m`` path types."""

    indices: tuple[int, ...]
    pair_links: Mapping[tuple[int, int], int]  # unordered pairs, lower index first; >0 only
    islands: tuple[Island, ...]
    island_of: Mapping[int, str]  # only GPUs with active NVLink to a peer
    numa_of: Mapping[int, int | None]
    pcie_root_of: Mapping[int, str | None]
    pcie_paths: Mapping[tuple[int, int], model.PathType]

    def links(self, a: int, b: int) -> int:
        """Active NVLink links between GPUs ``a`` and ``b`` (0 when none or a == b)."""
        if a == b:
            return 0
        return self.pair_links.get((a, b) if a < b else (b, a), 0)

    def path(self, a: int, b: int) -> str:
        """Path label like nvidia-smi: ``X`` on the diagonal, ``NV<n>``, or the PCIe path."""
        if a == b:
            return "X"
        n = self.links(a, b)
        if n:
            return f"NV{n}"
        key = (a, b) if a < b else (b, a)
        return self.pcie_paths.get(key, model.PathType.SYS).value

    def score(self, indices: Iterable[int]) -> tuple[int, int, int]:
        """Placement quality of a GPU set, compared lexicographically (higher is better).

        (NVLink links inside the set, pairs sharing a NUMA node, pairs sharing a PCIe root).
        """
        chosen = sorted(indices)
        links = numa = root = 0
        for a, b in itertools.combinations(chosen, 2):
            links += self.links(a, b)
            na, nb = self.numa_of.get(a), self.numa_of.get(b)
            if na is not None and na == nb:
                numa += 1
            ra, rb = self.pcie_root_of.get(a), self.pcie_root_of.get(b)
            if ra is not None and ra == rb:
                root += 1
        return links, numa, root


def pair_links(devices: model.NodeDevices) -> dict[tuple[int, int], int]:
    """Link count per unordered GPU pair.

    Direct links are reported by both ends and must agree; where they disagree (a flaky link
    seen from one side only) the smaller count is the one both can use.
    """
    present = {g.index for g in devices.gpus}
    out: dict[tuple[int, int], int] = {}
    for gpu in devices.gpus:
        for peer, count in gpu.nvlinks.items():
            if peer == gpu.index or peer not in present or count <= 0:
                continue
            key = (gpu.index, peer) if gpu.index < peer else (peer, gpu.index)
            out[key] = min(out.get(key, count), count)
    # A link seen from only one side is kept: NVML can miss the remote end's state.
    return out


def islands(
    indices: Iterable[int], links: Mapping[tuple[int, int], int], minors: Mapping[int, int]
) -> tuple[Island, ...]:
    """Connected components of the NVLink graph; GPUs without any NVLink form no island."""
    parent: dict[int, int] = {i: i for i in indices}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for a, b in links:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    linked = {i for pair in links for i in pair}
    groups: dict[int, list[int]] = {}
    for i in sorted(linked):
        groups.setdefault(find(i), []).append(i)
    result = [
        Island(id=f"island-{min(minors[i] for i in members)}", gpu_indices=tuple(members))
        for members in groups.values()
    ]
    return tuple(sorted(result, key=lambda isl: isl.gpu_indices))


_last: tuple[model.NodeDevices, Topology] | None = None  # see build()


def build(devices: model.NodeDevices) -> Topology:
    """Derive the whole topology view of a node. The last node's view is kept and given again
    for the same (immutable) ``devices`` object: every slice rebuild, set-rank pass and
    set-capacity gauge update asks for it, and on 256 GPUs its 32,640 PCIe pairs were a tenth of
    the agent's CPU while its watch read a node's claims (issue 46)."""
    global _last
    last = _last
    if last is not None and last[0] is devices:
        return last[1]
    topo = _derive(devices)
    _last = (devices, topo)
    return topo


def _derive(devices: model.NodeDevices) -> Topology:
    links = pair_links(devices)
    indices = tuple(sorted(g.index for g in devices.gpus))
    minors = {g.index: g.minor for g in devices.gpus}
    isl = islands(indices, links, minors)
    island_of = {i: island.id for island in isl for i in island.gpu_indices}
    paths = {(a, b): devices.pcie_path(a, b) for a, b in itertools.combinations(indices, 2)}
    return Topology(
        indices=indices,
        pair_links=links,
        islands=isl,
        island_of=island_of,
        numa_of={g.index: g.numa_node for g in devices.gpus},
        pcie_root_of={g.index: g.pcie_root for g in devices.gpus},
        pcie_paths=paths,
    )


def derive_pcie_path(
    a: model.Gpu, b: model.Gpu, switch_a: str | None, switch_b: str | None
) -> model.PathType:
    """PCIe path between two GPUs from where they hang: switch, root complex, NUMA node.

    Used by the fake backend (profiles name switches and roots); the real backend asks NVML.
    """
    if switch_a is not None and switch_a == switch_b:
        return model.PathType.PIX
    if a.pcie_root is not None and a.pcie_root == b.pcie_root:
        return model.PathType.PHB
    if a.numa_node is not None and a.numa_node == b.numa_node:
        return model.PathType.NODE
    return model.PathType.SYS


def matrix(topo: Topology) -> list[list[str]]:
    """The ``nvidia-smi topo -m`` style matrix, rows and columns in index order."""
    return [[topo.path(a, b) for b in topo.indices] for a in topo.indices]
