"""Topology derived from discovered devices: link counts, islands and nvidia-smi path types."""

from __future__ import annotations

import itertools

import pytest

from dra_driver.devices import fake, model, topology

# Issue 2: links per pair of the DGX-1 V100 hybrid cube-mesh (row GPU, columns 0..7).
CUBE_MESH = [
    [0, 1, 1, 2, 2, 0, 0, 0],
    [1, 0, 2, 1, 0, 2, 0, 0],
    [1, 2, 0, 2, 0, 0, 1, 0],
    [2, 1, 2, 0, 0, 0, 0, 1],
    [2, 0, 0, 0, 0, 1, 1, 2],
    [0, 2, 0, 0, 1, 0, 2, 1],
    [0, 0, 1, 0, 1, 2, 0, 2],
    [0, 0, 0, 1, 2, 1, 2, 0],
]


def build(name: str) -> tuple[model.NodeDevices, topology.Topology]:
    devices = fake.FakeBackend.from_name(name).discover()
    return devices, topology.build(devices)


def test_dgx1_cube_mesh_link_counts() -> None:
    devices, topo = build("dgx-1-v100")
    assert topo.indices == tuple(range(8))
    pairs = list(itertools.combinations(range(8), 2))
    assert len(pairs) == 28
    for a, b in pairs:
        assert topo.links(a, b) == CUBE_MESH[a][b], (a, b)
        assert topo.links(b, a) == CUBE_MESH[a][b], (b, a)
        # 0 = no NVLink: those pairs are all on different sockets, so the path is SYS.
        assert topo.path(a, b) == (f"NV{CUBE_MESH[a][b]}" if CUBE_MESH[a][b] else "SYS")
    for gpu in devices.gpus:
        assert gpu.active_links == 6, gpu.index
        assert not gpu.nvlink_switched
    assert [i.gpu_indices for i in topo.islands] == [tuple(range(8))]
    assert topo.islands[0].id == "island-0"


def test_dgx1_path_types() -> None:
    _, topo = build("dgx-1-v100")
    # 0 and 5 share no NVLink and sit on different NUMA nodes.
    assert topo.path(0, 5) == "SYS"
    assert topo.path(1, 4) == "SYS"
    assert topo.path(3, 6) == "SYS"
    # No pair without NVLink shares a socket in the cube-mesh, so check the PCIe layer directly.
    assert topo.pcie_paths[(0, 1)] is model.PathType.PIX  # same PCIe switch
    assert topo.pcie_paths[(0, 2)] is model.PathType.PHB  # same root complex
    assert topo.pcie_paths[(0, 4)] is model.PathType.SYS  # across NUMA nodes
    assert topo.path(2, 2) == "X"


def test_h100_nvl_pairs_form_two_islands() -> None:
    _, topo = build("h100-nvl-pairs")
    assert [i.gpu_indices for i in topo.islands] == [(0, 1), (2, 3)]
    assert topo.island_of == {0: "island-0", 1: "island-0", 2: "island-2", 3: "island-2"}
    assert topo.links(0, 1) == topo.links(2, 3) == 12
    assert topo.links(1, 2) == 0
    assert topo.path(0, 1) == "NV12"
    assert topo.path(0, 2) == "SYS"
    assert topo.path(1, 3) == "SYS"


def test_pcie_l4_has_no_island() -> None:
    devices, topo = build("pcie-l4")
    assert topo.islands == ()
    assert topo.pair_links == {}
    assert topo.island_of == {}
    assert all(g.nvlinks == {} and g.active_links == 0 for g in devices.gpus)
    assert topology.matrix(topo) == [
        ["X", "PIX", "SYS", "SYS"],
        ["PIX", "X", "SYS", "SYS"],
        ["SYS", "SYS", "X", "NODE"],
        ["SYS", "SYS", "NODE", "X"],
    ]


def test_dgx_h100_is_one_nvswitch_island() -> None:
    devices, topo = build("dgx-h100")
    assert [i.gpu_indices for i in topo.islands] == [tuple(range(8))]
    for a, b in itertools.combinations(range(8), 2):
        assert topo.path(a, b) == "NV18"
    assert all(g.nvlink_switched and g.active_links == 18 for g in devices.gpus)
    # Underneath the NVLink: root complexes shared by pairs, NUMA split 0-3 / 4-7.
    assert topo.pcie_paths[(0, 1)] is model.PathType.PHB
    assert topo.pcie_paths[(0, 2)] is model.PathType.NODE
    assert topo.pcie_paths[(3, 4)] is model.PathType.SYS


def test_gb200_fabric_gpus_are_one_island() -> None:
    _, topo = build("gb200-nvl")
    assert [i.gpu_indices for i in topo.islands] == [(0, 1, 2, 3)]
    assert topo.path(0, 3) == "NV18"


def test_score_prefers_nvlink_then_numa_then_root() -> None:
    _, topo = build("dgx-1-v100")
    assert topo.score([0, 3]) > topo.score([0, 1])  # 2 links beat 1
    assert topo.score([0, 1]) > topo.score([0, 5])  # NVLink beats none
    _, l4 = build("pcie-l4")
    assert l4.score([0, 1]) == (0, 1, 1)
    assert l4.score([2, 3]) == (0, 1, 0)
    assert l4.score([0, 2]) == (0, 0, 0)


def test_one_sided_link_is_kept_and_disagreement_takes_the_minimum() -> None:
    def gpu(index: int, links: dict[int, int]) -> model.Gpu:
        return model.Gpu(
            index=index, minor=index, uuid=f"GPU-{index}", product_name="x", brand="Nvidia",
            architecture="Hopper", cuda_compute_capability="9.0", driver_version="1",
            cuda_driver_version="13.0", memory_bytes=1, pci_bus_id=f"0000:0{index}:00.0",
            pcie_root=None, numa_node=None, nvlinks=links,
        )  # fmt: skip

    devices = model.NodeDevices(gpus=(gpu(0, {1: 4, 2: 2}), gpu(1, {0: 3}), gpu(2, {})))
    assert topology.pair_links(devices) == {(0, 1): 3, (0, 2): 2}


@pytest.mark.parametrize("name", ["dgx-1-v100", "dgx-h100", "pcie-l4", "h100-nvl-pairs"])
def test_matrix_is_symmetric(name: str) -> None:
    _, topo = build(name)
    m = topology.matrix(topo)
    n = len(topo.indices)
    assert all(m[a][b] == m[b][a] for a in range(n) for b in range(n))


def test_the_same_node_gets_the_same_view_and_another_node_its_own() -> None:
    """build() keeps the last node's view (every slice rebuild asks for it): the same devices
    object gets it again, an equal but new one (rediscovered GPUs) is derived afresh."""
    first = fake.FakeBackend.from_name("dgx-h100").discover()
    again = fake.FakeBackend.from_name("dgx-h100").discover()
    view = topology.build(first)
    assert topology.build(first) is view
    fresh = topology.build(again)
    assert fresh is not view and fresh == view
    assert topology.build(first) is not view  # only the last node is kept
