"""``dra-driver capacity`` against the fake API server over HTTP: 50 fake nodes of mixed profiles
(the real slice builder, set ranks of the GPUs their claims leave free) and seeded allocated
claims. Every ``fit`` is proved with the project's allocator (that many claims of ``dra-driver
claim --gpus N`` allocate on the node, one more does not), and every ``optimal`` against an
exhaustive search over the node's GPUs."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from dra_driver import cli
from dra_driver.allocation import claimgen, fleetnodes, pools, setfit, simulator
from dra_driver.devices import topology
from dra_driver.testing import fakefleet
from dra_driver.testing.fakeapi import fakeserver, memory

SIZES = (1, 2, 3, 4, 8)
# Profiles whose slices tell the real topology (NVSwitch, NVLink bridges, PCIe only): there the
# slices' view of "optimal" must be the real one; a DGX-1's mesh is only known by its island.
EXACT = ("dgx-h100", "h100-nvl-pairs", "pcie-l4")


@pytest.fixture(scope="module")
def fleet() -> fakefleet.Fleet:
    return fakefleet.make(50, seed=7, busy=0.45)


@pytest.fixture(scope="module")
def answer(fleet: fakefleet.Fleet, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The command's JSON answer, read from the fake API server over HTTP."""
    server = fakeserver.FakeApiServer(memory.InMemoryApi(use_default_cel=False)).start()
    try:
        for obj in fleet.slices:
            server.api.put_resource_slice(obj)
        for obj in fleet.claims:
            server.api.put_resource_claim(obj)
        kubeconfig = server.write_kubeconfig(tmp_path_factory.mktemp("kc") / "kubeconfig")
        argv = ["--kubeconfig", str(kubeconfig), "--sizes", "3", "-o", "json", "--by-node"]
        done = subprocess.run(
            [sys.executable, "-m", "dra_driver", "capacity", *argv],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        calls = [c.method for c in server.api.calls]
    finally:
        server.stop()
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert calls.count("list_resource_claims") == 1  # one LIST of claims, cluster-wide
    out: dict[str, Any] = json.loads(done.stdout)
    return out


def _run_cli(argv: list[str]) -> dict[str, Any]:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert cli.main(argv) == 0
    result: dict[str, Any] = json.loads(buf.getvalue())
    return result


def _node_slices(fleet: fakefleet.Fleet, node: str) -> list[dict[str, Any]]:
    return [s for s in fleet.slices if s["spec"]["nodeName"] == node]


def _allocate(fleet: fakefleet.Fleet, node: str, size: int, count: int) -> list[Any]:
    """``count`` claims for ``size`` GPUs allocated one after another on ``node``."""
    inputs = simulator.Inputs(
        claims=[claimgen.claim(size, name=f"c{i}") for i in range(count)],
        classes=simulator.builtin_classes(),
        slices=_node_slices(fleet, node),
        node_name=node,
        allocated=pools.allocated_ids(c for c in fleet.claims if _on(c, node)),
    )
    return simulator.run(inputs)


def _on(claim: Mapping[str, Any], node: str) -> bool:
    return any(r["pool"] == node for r in claim["status"]["allocation"]["devices"]["results"])


def test_the_answer_has_every_size_and_sums_its_nodes(
    answer: dict[str, Any], fleet: fakefleet.Fleet
) -> None:
    assert list(answer["sizes"]) == [str(s) for s in SIZES]
    assert answer["nodes"] == 50
    held = sum(len(h) for h in fleet.held.values())
    assert answer["gpus"]["held"] == held and answer["gpus"]["unhealthy"] == 0
    free = answer["gpus"]["total"] - held
    assert answer["gpus"]["free"] == free and answer["sizes"]["1"]["fit"] == free
    for size in SIZES:
        rows = answer["byNode"].values()
        assert answer["sizes"][str(size)]["fit"] == sum(r["sizes"][str(size)]["fit"] for r in rows)
    assert 0 < answer["sizes"]["4"]["fit"] < answer["sizes"]["2"]["fit"]  # a fragmented fleet
    assert answer["sizes"]["2"]["optimal"] < answer["sizes"]["2"]["fit"]
    largest = [n for n, r in answer["byNode"].items() if r["sizes"]["8"]["fit"]]
    assert answer["largest"] == {"size": 8, "nodes": largest} and largest


@pytest.mark.parametrize("size", SIZES)
def test_each_fit_is_what_the_allocator_places_and_one_more_fails(
    answer: dict[str, Any], fleet: fakefleet.Fleet, size: int
) -> None:
    placed = 0
    for node, row in answer["byNode"].items():
        fit = row["sizes"][str(size)]["fit"]
        outcomes = _allocate(fleet, node, size, fit + 1)
        assert [o.allocation is not None for o in outcomes] == [True] * fit + [False], node
        placed += fit
    assert placed == answer["sizes"][str(size)]["fit"]


def _visible_pairs(devs: Sequence[Mapping[str, Any]]) -> list[list[tuple[int, int, int]]]:
    """Pair scores from the published attributes, computed here on their own."""

    def get(dev: Mapping[str, Any], key: str) -> Any:
        found = dev["attributes"].get(key)
        return None if found is None else next(iter(found.values()))

    keys = ("nvlinkIsland", "resource.kubernetes.io/numaNode", "resource.kubernetes.io/pcieRoot")
    vals = [[get(d, k) for k in keys] for d in devs]
    return [
        [
            (0, 0, 0)
            if a == b
            else tuple(int(x is not None and x == y) for x, y in zip(vals[a], vals[b], strict=True))
            for b in range(len(devs))
        ]
        for a in range(len(devs))
    ]  # type: ignore[misc]


def _score(pairs: Sequence[Sequence[tuple[int, ...]]], members: Sequence[int]) -> tuple[int, ...]:
    total = [0, 0, 0]
    for a, b in itertools.combinations(members, 2):
        total = [t + v for t, v in zip(total, pairs[a][b], strict=True)]
    return tuple(total)


def _packings(free: Sequence[int], size: int, good: set[tuple[int, ...]]) -> Iterator[int]:
    """Numbers of disjoint optimal sets reachable from ``free`` (every way, exhaustively)."""
    yield 0
    for first in itertools.combinations(free, size):
        if first in good:
            rest = [g for g in free if g not in first and g > first[0]]
            for more in _packings(rest, size, good):
                yield 1 + more


@pytest.mark.parametrize("size", [2, 3, 4, 8])
def test_each_optimal_is_the_exhaustive_best_packing_of_optimal_sets(
    answer: dict[str, Any], fleet: fakefleet.Fleet, size: int
) -> None:
    total = 0
    for node, row in answer["byNode"].items():
        devs = [d for s in _node_slices(fleet, node) for d in s["spec"]["devices"]]
        gpus = list(range(len(devs)))
        free = [i for i in gpus if devs[i]["name"] not in fleet.held[node]]
        pairs = _visible_pairs(devs)
        scores = {c: _score(pairs, c) for c in itertools.combinations(gpus, size)}
        best = max(scores.values(), default=None)
        good = {c for c, s in scores.items() if s == best}
        most = max(_packings(free, size, good))
        assert row["sizes"][str(size)]["optimal"] == most, (node, size)
        total += most
        profile = fleet.profile_of[node]
        if profile in EXACT:  # the slices' view is the real topology's
            topo = topology.build(fleet.devices[profile])
            index = {g.name: g.index for g in fleet.devices[profile].gpus}
            real = {c: topo.score(index[devs[i]["name"]] for i in c) for c in scores}
            top = max(real.values(), default=None)
            assert {c for c, s in real.items() if s == top} == good, (node, size)
    assert total == answer["sizes"][str(size)]["optimal"]


def test_the_ladder_claims_get_exactly_the_optimal_count_on_exact_profiles(
    answer: dict[str, Any], fleet: fakefleet.Fleet
) -> None:
    """The allocator's picks for a burst of ``claim --gpus 4``: as many on a set scoring the
    empty node's best (real topology) as ``optimal`` says."""
    checked = 0
    for node, row in answer["byNode"].items():
        profile = fleet.profile_of[node]
        fit = row["sizes"]["4"]["fit"]
        if profile not in EXACT or not fit:
            continue
        devices = fleet.devices[profile]
        topo = topology.build(devices)
        by_uuid = {g.uuid: g.index for g in devices.gpus}
        best = max(topo.score(c) for c in itertools.combinations(sorted(by_uuid.values()), 4))
        outcomes = _allocate(fleet, node, 4, fit)
        got = sum(topo.score(by_uuid[u] for u in o.gpus) == best for o in outcomes)
        assert got == row["sizes"]["4"]["optimal"], node
        checked += 1
    assert checked >= 3


def test_the_island_only_view_is_named_as_unknown(
    answer: dict[str, Any], fleet: fakefleet.Fleet
) -> None:
    meshes = sorted(n for n, p in fleet.profile_of.items() if p == "dgx-1-v100")
    (island,) = [u for u in answer["unknown"] if "nvlinkIsland" in u["what"]]
    assert set(meshes) <= set(island["nodes"])
    assert not any(fleet.profile_of[n] in ("pcie-l4", "h100-nvl-pairs") for n in island["nodes"])


def test_files_give_the_same_answer_as_the_cluster(
    answer: dict[str, Any], fleet: fakefleet.Fleet, tmp_path: Path
) -> None:
    slices, claims = tmp_path / "slices.json", tmp_path / "claims.yaml"
    slices.write_text(json.dumps({"kind": "List", "items": fleet.slices}))
    import yaml

    claims.write_text(yaml.safe_dump_all(fleet.claims))
    argv = ["capacity", "--slices", str(slices), "--allocated", str(claims), "--sizes", "3"]
    assert _run_cli([*argv, "-o", "json", "--by-node"]) == answer


def test_a_tainted_gpu_an_old_set_allocation_and_a_share_are_not_free(
    fleet: fakefleet.Fleet,
) -> None:
    node = next(n for n, p in fleet.profile_of.items() if p == "dgx-h100" and not fleet.held[n])
    slices = _node_slices(fleet, node)
    slices[0]["spec"]["devices"][7]["taints"] = [{"key": "k", "effect": "NoSchedule"}]
    results = [
        {"driver": fakefleet.DRIVER, "pool": node, "device": "gpus-0-1"},  # a set of old
        {"driver": fakefleet.DRIVER, "pool": node, "device": "gpu-2", "shareID": "x"},
        {"driver": fakefleet.DRIVER, "pool": node, "device": "gpu-3", "adminAccess": True},
    ]
    (got,) = fleetnodes.read(slices, [{"results": results}], driver_name=fakefleet.DRIVER)
    assert (got.held, got.unhealthy, got.free.bit_count()) == (3, 1, 4)
    assert setfit.fleet([got]).nodes[0].fit == {1: 4, 2: 2, 4: 1, 8: 0}
