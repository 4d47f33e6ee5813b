"""Simulator inputs and the shipped example claims, run on fake profiles."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from claimkit import DRIVER, NODE, rclaim, request

from dra_driver import examples
from dra_driver.allocation import allocator, pools, simulator
from dra_driver.devices import fake
from dra_driver.slices import shares

REPO = Path(__file__).resolve().parents[2]
DEPLOYED = REPO / "deployments" / "examples"


def _inputs(
    profile: str, docs: list[dict[str, Any]], allocated: set[pools.DeviceId] | None = None
) -> simulator.Inputs:
    devices = fake.FakeBackend.from_name(profile).discover()
    kinds = simulator.split_kinds(docs, source="test")
    return simulator.Inputs(
        claims=kinds["claims"],
        classes=simulator.merge_classes(simulator.builtin_classes(), kinds["classes"]),
        slices=simulator.fake_slices(devices, node_name=NODE, driver_name=DRIVER),
        node_name=NODE,
        allocated=allocated or set(),
        node_devices=devices,
    )


def _run(profile: str, example: str) -> allocator.Outcome:
    (outcome,) = simulator.run(_inputs(profile, examples.load(example)))
    return outcome


def _devices(outcome: allocator.Outcome) -> list[str]:
    assert outcome.allocation is not None, outcome.explanation
    return [r["device"] for r in outcome.allocation["devices"]["results"]]


def test_deployed_examples_are_copies_of_the_package_data() -> None:
    deployed = sorted(p.stem for p in DEPLOYED.glob("*.yaml"))
    assert deployed == examples.names(), "deployments/examples/ and dra_driver/examples/ differ"
    for name in examples.names():
        assert (DEPLOYED / f"{name}.yaml").read_text() == examples.text(name), (
            f"deployments/examples/{name}.yaml differs from dra_driver/examples/{name}.yaml; "
            "edit the package copy and run: cp dra_driver/examples/*.yaml deployments/examples/"
        )


def test_every_example_has_a_claim_and_a_pod_using_it() -> None:
    assert len(examples.names()) >= 7
    for name in examples.names():
        docs = examples.load(name)
        kinds = [d["kind"] for d in docs]
        assert kinds[0] in simulator.CLAIM_KINDS and "Pod" in kinds, name
        claim_name = docs[0]["metadata"]["name"]
        pod = next(d for d in docs if d["kind"] == "Pod")
        refs = pod["spec"]["resourceClaims"]
        assert any(
            claim_name in (r.get("resourceClaimName"), r.get("resourceClaimTemplateName"))
            for r in refs
        ), name
    shared = next(d for d in examples.load("shared-by-two-containers") if d["kind"] == "Pod")
    assert len(shared["spec"]["containers"]) == 2
    assert all(c["resources"]["claims"] == [{"name": "gpu"}] for c in shared["spec"]["containers"])


@pytest.mark.parametrize("name", examples.names())
def test_examples_on_dgx_h100(name: str) -> None:
    """Every example fits a DGX H100 except the one meant not to fit, the MIG one, and the GPU
    share (its GPUs are not published as shareable: they have no computeShare capacity)."""
    outcome = _run("dgx-h100", name)
    expected = name not in ("cannot-fit", "mig-1g", "gpu-share-20gi")
    assert outcome.allocated == expected, outcome.explanation


def test_share_example_on_shareable_gpus() -> None:
    devices = fake.FakeBackend.from_name("dgx-h100").discover()
    inputs = _inputs("dgx-h100", examples.load("gpu-share-20gi"))
    shared = simulator.fake_slices(
        devices, node_name=NODE, driver_name=DRIVER, shareable=shares.Shareable.parse("H100")
    )
    (outcome,) = simulator.run(dataclasses.replace(inputs, slices=shared))
    assert outcome.allocation is not None, outcome.explanation
    (result,) = outcome.allocation["devices"]["results"]
    assert result["consumedCapacity"] == {"computeShare": "25", "memory": "20Gi"}
    assert result["shareID"]
    plain = _run("dgx-h100", "gpu-share-20gi")
    assert "has no capacity computeShare" in "\n".join(plain.explanation)


def test_mig_example_on_a100_mig() -> None:
    assert _devices(_run("a100-mig", "mig-1g")) == ["gpu-0-mig-1g-5gb-2"]


def test_example_placements() -> None:
    assert _devices(_run("h100-nvl-pairs", "two-gpus-nvlink")) == ["gpu-0", "gpu-1"]
    assert _devices(_run("dgx-h100", "gpus-one-numa-node")) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    h100 = _run("dgx-h100", "h100-or-any-gpu")
    l4 = _run("pcie-l4", "h100-or-any-gpu")
    assert h100.allocation is not None and l4.allocation is not None
    assert h100.allocation["devices"]["results"][0]["request"] == "gpu/h100"
    assert l4.allocation["devices"]["results"][0]["request"] == "gpu/any"
    assert not _run("pcie-l4", "h100-40gi").allocated
    cannot = _run("dgx-h100", "cannot-fit")
    assert (
        cannot.explanation[0] == "request gpus: needs 16 devices of class gpu.nvidia.com; "
        "8 of 8 usable"
    )


def test_four_gpus_on_one_island_do_not_fit_h100_nvl_pairs() -> None:
    docs = examples.load("two-gpus-nvlink")
    docs[0]["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] = 4
    (outcome,) = simulator.run(_inputs("h100-nvl-pairs", docs))
    assert not outcome.allocated
    assert any(
        "no 4 devices share gpu.nvidia.com/nvlinkIsland (largest group: 2" in line
        for line in outcome.explanation
    )


def test_claims_are_allocated_in_turn() -> None:
    docs = [
        rclaim(request("a", cls="gpu.nvidia.com", count=3), name="first"),
        rclaim(request("b", cls="gpu.nvidia.com", count=2), name="second"),
    ]
    first, second = simulator.run(_inputs("h100-nvl-pairs", docs))
    assert len(_devices(first)) == 3 and not second.allocated
    assert "gpu-" in simulator.render(second, node_name=NODE)
    text = simulator.render(first, node_name=NODE)
    assert text.startswith("# ResourceClaim first: allocated on node node-1; placement: 12 ")


def test_parse_documents() -> None:
    text = "kind: List\nitems:\n- {kind: DeviceClass}\n---\n- {kind: Pod}\n---\n"
    assert simulator.parse_documents(text, source="x") == [{"kind": "DeviceClass"}, {"kind": "Pod"}]
    with pytest.raises(simulator.SimulateError, match=r"^f\.yaml: not valid YAML"):
        simulator.parse_documents("a: [", source="f.yaml")
    with pytest.raises(simulator.SimulateError, match=r"^f\.yaml: document 2: expected a mapping"):
        simulator.parse_documents("a: 1\n---\n- 3\n", source="f.yaml")
    with pytest.raises(simulator.SimulateError, match="object 1 has kind 'Secret'"):
        simulator.split_kinds([{"kind": "Secret"}], source="f.yaml")


def test_allocated_inputs() -> None:
    result = {"driver": DRIVER, "pool": NODE, "device": "gpu-1"}
    claim_obj = {
        "kind": "ResourceClaim",
        "status": {
            "allocation": {
                "devices": {"results": [result, {**result, "device": "gpu-2", "adminAccess": True}]}
            }
        },
    }
    assert simulator.allocated_from(
        [claim_obj, {"results": [{**result, "device": "gpu-3"}]}], source="x"
    ) == {(DRIVER, NODE, "gpu-1"), (DRIVER, NODE, "gpu-3")}
    with pytest.raises(simulator.SimulateError, match=r"^a\.yaml: allocated entry #0, result #0"):
        simulator.allocated_from([{"results": [{"device": "gpu-0"}]}], source="a.yaml")


def test_builtin_classes_follow_the_driver_name() -> None:
    names = {c["metadata"]["name"] for c in simulator.builtin_classes()}
    assert {"gpu.nvidia.com", "mig.nvidia.com"} <= names
    other = simulator.builtin_classes(driver_name="gpu.example.com")
    # Every class with selectors selects that driver; the ranked class has none (its claims'
    # selectors test the driver).
    selecting = [c for c in other if c["metadata"]["name"] != "gpu-ranked.nvidia.com"]
    assert all("gpu.example.com" in str(c["spec"]["selectors"]) for c in selecting)
    assert [c["spec"] for c in other if c not in selecting] == [{}]
