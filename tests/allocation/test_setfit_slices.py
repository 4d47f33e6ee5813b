"""``capacity`` on every kind of slice a cluster may serve: with set ranks, plain (``--gpu-sets
false``), from the GPU-set era (2-GPU set devices give the pairs' real link counts), without
topology attributes (said as unknown), with more than 16 GPUs (fit only), and a pool that is
incomplete (its GPUs not counted, the reason said)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from dra_driver.allocation import fleetnodes, setfit
from dra_driver.devices import fake
from dra_driver.slices import build
from dra_driver.testing import fakefleet

DRIVER = fakefleet.DRIVER


def answer(
    slices: list[Any], claims: Sequence[Any] = (), sizes: tuple[int, ...] = (1, 2, 4, 8)
) -> Any:
    nodes = fleetnodes.read(slices, list(claims), driver_name=DRIVER)
    return setfit.report(setfit.fleet(nodes, sizes), by_node=True)


def test_plain_slices_give_the_same_answer_as_slices_with_ranks() -> None:
    fleet = fakefleet.make(12, seed=4)
    plain = []
    for node, profile in fleet.profile_of.items():
        plain += build.build(
            fleet.devices[profile], node_name=node, driver_name=DRIVER, gpu_sets=False
        ).slices
    assert not any("setRank" in str(s) for s in plain)
    ranked = answer(fleet.slices, fleet.claims, (1, 2, 3, 4, 8))
    assert answer(plain, fleet.claims, (1, 2, 3, 4, 8)) == ranked
    assert ranked["sizes"]["2"]["fit"] > 0


def _gpu(minor: int, island: str = "island-0") -> dict[str, Any]:
    return {
        "name": f"gpu-{minor}",
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": f"GPU-{minor}"},
            "productName": {"string": "Tesla V100-SXM2-32GB"},
            "nvlinkIsland": {"string": island},
            "resource.kubernetes.io/numaNode": {"int": 0},
            "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
        },
    }


def _pair(a: int, b: int, links: int) -> dict[str, Any]:
    return {
        "name": f"gpus-{a}-{b}",
        "attributes": {
            "type": {"string": "gpu-set"},
            "gpuCount": {"int": 2},
            "nvlinkLinks": {"int": links},
            "uuid0": {"string": f"GPU-{a}"},
            "uuid1": {"string": f"GPU-{b}"},
        },
    }


def _slice(node: str, devices: list[dict[str, Any]], name: str = "") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name or f"{node}-{DRIVER}-0"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def _held(node: str, *devices: str) -> dict[str, Any]:
    return {"results": [{"driver": DRIVER, "pool": node, "device": d} for d in devices]}


def test_gpu_set_era_slices_give_the_real_links_of_their_pairs() -> None:
    # One island of four GPUs; gpu-0/gpu-1 and gpu-2/gpu-3 have 2 links, gpu-0/gpu-2 one.
    devices = [_gpu(m) for m in range(4)] + [_pair(0, 1, 2), _pair(2, 3, 2), _pair(0, 2, 1)]
    node = _slice("old", devices)
    # gpu-1 and gpu-3 held (a set of old, gone since, and a GPU): gpu-0 + gpu-2 are free, one
    # link where the best pair has two; by the island alone they would look optimal.
    got = answer([node], [_held("old", "gpus-1-3")])
    assert got["byNode"]["old"]["sizes"]["2"] == {"fit": 1, "optimal": 0}
    assert got["unknown"] == []
    island_only = answer([_slice("old", [_gpu(m) for m in range(4)])], [_held("old", "gpus-1-3")])
    assert island_only["byNode"]["old"]["sizes"]["2"] == {"fit": 1, "optimal": 1}
    assert [u["nodes"] for u in island_only["unknown"]] == [["old"]]
    # gpu-2 held instead: gpu-0 + gpu-1 (two links) are the best pair again.
    assert answer([node], [_held("old", "gpu-2")])["sizes"]["2"] == {
        "fit": 1,
        "optimal": 1,
        "nodes": 1,
    }


def test_missing_numa_and_pcie_root_are_said_and_pair_islands_are_exact() -> None:
    devices = [_gpu(m, island=f"island-{m - m % 2}") for m in range(4)]
    for dev in devices:
        del dev["attributes"]["resource.kubernetes.io/numaNode"]
    del devices[3]["attributes"]["resource.kubernetes.io/pcieRoot"]
    got = answer([_slice("n", devices)])
    assert [(u["what"].split()[0:4], u["nodes"]) for u in got["unknown"]] == [
        (["the", "NUMA", "node", "of"], ["n"]),
        (["the", "PCIe", "root", "of"], ["n"]),
    ]
    # NVLink pairs (0,1) and (2,3), but gpu-3 shares no known PCIe root: only (0,1) is optimal.
    assert got["byNode"]["n"]["sizes"]["2"] == {"fit": 2, "optimal": 1}
    devices[3]["attributes"]["resource.kubernetes.io/pcieRoot"] = {"string": "pci0000:00"}
    assert answer([_slice("n", devices)])["byNode"]["n"]["sizes"]["2"] == {"fit": 2, "optimal": 2}


def test_a_node_of_more_than_16_gpus_gets_fit_but_no_optimal() -> None:
    devices = [_gpu(m) for m in range(20)]
    got = answer([_slice("big", devices)], [_held("big", "gpu-0", "gpu-1", "gpu-2")])
    assert got["byNode"]["big"]["sizes"]["8"] == {"fit": 2, "optimal": None}
    assert got["byNode"]["big"]["free"] == 17 and got["byNode"]["big"]["stranded"] == 1
    assert any("more than 16 GPUs" in u["what"] for u in got["unknown"])


def test_an_incomplete_pool_counts_no_gpu_and_says_why() -> None:
    devices = fake.FakeBackend.from_name("dgx-h100").discover()
    slices = build.build(devices, node_name="half", driver_name=DRIVER).slices
    broken = copy.deepcopy(slices[0])
    broken["spec"]["pool"]["resourceSliceCount"] = 2  # the second slice never arrived
    got = answer([broken])
    assert got["gpus"]["total"] == 0 and got["sizes"]["1"]["fit"] == 0
    assert got["byNode"]["half"]["problem"] == "pool incomplete (not all its slices are there)"
    assert [u["nodes"] for u in got["unknown"] if "incomplete" in u["what"]] == [["half"]]


def test_other_drivers_and_unallocated_claims_do_not_count() -> None:
    devices = [_gpu(m) for m in range(4)]
    other = _slice("n", copy.deepcopy(devices), name="n-other")
    other["spec"]["driver"] = "other.example.com"
    other["spec"]["pool"]["name"] = "n-other"
    pending = {"kind": "ResourceClaim", "metadata": {"name": "p"}, "status": {}}
    foreign = {"results": [{"driver": "other.example.com", "pool": "n", "device": "gpu-0"}]}
    got = answer([_slice("n", devices), other], [pending, foreign])
    assert got["nodes"] == 1 and got["gpus"]["free"] == 4
