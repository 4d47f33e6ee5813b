"""``dra-driver claim``: the claims it prints, their validity, and the shipped examples it made."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from dra_driver import cli, examples
from dra_driver.allocation import claimgen
from dra_driver.devices import fake
from dra_driver.slices import build


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["claim", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_best_is_a_ladder_of_ranked_gpus_then_any_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--gpus", "4")
    assert code == 0
    obj = yaml.safe_load(out)
    assert obj["kind"] == "ResourceClaim" and obj["metadata"] == {"name": "gpus-4"}
    (request,) = obj["spec"]["devices"]["requests"]
    assert request["name"] == "gpus"
    plain = {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 4}
    # The ranks: on the selector-less class, one selector testing the driver and digit 4 of
    # setRanks; "any": the plain GPU class.
    assert request["firstAvailable"] == [
        {
            "name": f"rank{rank}",
            **plain,
            "deviceClassName": "gpu-ranked.nvidia.com",
            "selectors": [
                {
                    "cel": {
                        "expression": 'device.driver == "gpu.nvidia.com" && '
                        'device.attributes["gpu.nvidia.com"]'
                        f".?setRanks.orValue(0) / 1000 % 10 == {rank}"
                    }
                }
            ],
        }
        for rank in (1, 2)  # an 8-GPU node holds two disjoint quads
    ] + [{"name": "any", **plain}]
    assert "gpu-set" not in out and "gpuCount" not in out


def test_without_the_ranked_class_the_ranks_name_the_gpu_class(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, "--gpus", "2", "--without-ranked-class", "-o", "json")
    assert code == 0
    (request,) = json.loads(out)["spec"]["devices"]["requests"]
    alternatives = request["firstAvailable"]
    assert {a["deviceClassName"] for a in alternatives} == {"gpu.nvidia.com"}
    expression = 'device.attributes["gpu.nvidia.com"].?setRanks.orValue(0) / 10 % 10 == 1'
    assert alternatives[0]["selectors"] == [{"cel": {"expression": expression}}]
    assert [a["name"] for a in alternatives] == ["rank1", "rank2", "rank3", "rank4", "any"]


@pytest.mark.parametrize(
    ("gpus", "ranks"), [(2, 4), (3, 2), (4, 2), (5, 1), (7, 1), (8, 1), (15, 1)]
)
def test_the_ladder_asks_for_as_many_ranks_as_an_eight_gpu_node_has_sets(
    gpus: int, ranks: int
) -> None:
    (request,) = claimgen.spec(gpus)["devices"]["requests"]
    names = [alt["name"] for alt in request["firstAvailable"]]
    assert names == [f"rank{r}" for r in range(1, ranks + 1)] + ["any"]
    assert len(names) <= 8  # the API's limit on firstAvailable
    assert all(alt["count"] == gpus for alt in request["firstAvailable"])
    custom = claimgen.spec(gpus, driver_name="gpu.example.com")["devices"]["requests"][0]
    expression = custom["firstAvailable"][0]["selectors"][0]["cel"]["expression"]
    digit = "" if gpus == 1 else f" / {10 ** (gpus - 1)}"
    assert expression == (
        'device.driver == "gpu.example.com" && device.attributes["gpu.example.com"]'
        f".?setRanks.orValue(0){digit} % 10 == 1"
    )


def test_more_gpus_than_any_node_ranks_is_a_plain_count() -> None:
    # Ranks cover sets of 1..15 GPUs (16 GPUs per node at most): 16 and more take any N.
    assert claimgen.spec(16) == claimgen.spec(16, nvlink="any")
    assert claimgen.spec(32)["devices"]["requests"][0]["exactly"]["count"] == 32


def test_the_rank_attribute_and_digits_are_the_ones_the_slices_publish() -> None:
    from dra_driver.allocation import cel
    from dra_driver.slices import gpusets

    assert claimgen.PACKED_ATTRIBUTE == gpusets.PACKED_ATTRIBUTE
    assert claimgen.MAX_SIZE == gpusets.MAX_SIZE
    ranks = {1: 3, 2: 1, 4: 2, 7: 5, 15: 7}
    value = gpusets.pack(ranks)
    assert gpusets.unpack(value) == {n: ranks.get(n, 0) for n in range(1, 16)}
    assert value < 2**63  # an int64 attribute
    device = {"name": "gpu-0", "attributes": {"setRanks": {"int": value}}}
    for size in range(1, 16):
        for rank in range(1, 8):
            compiled = cel.compile_selector(
                claimgen.rank_expression(size, rank, "gpu.nvidia.com", claimgen.RANKED_CLASS)
            )
            assert compiled.matches(device, "gpu.nvidia.com") == (ranks.get(size) == rank)
            assert not compiled.matches(device, "other.example.com")  # the driver is tested
    with pytest.raises(ValueError, match="size 16"):
        gpusets.pack({16: 1})


@pytest.mark.parametrize("mode", claimgen.MODES)
@pytest.mark.parametrize("template", [False, True])
def test_every_shape_passes_the_strict_schema(
    capsys: pytest.CaptureFixture[str], mode: str, template: bool
) -> None:
    args = ["--gpus", "3", "--nvlink", mode, "-o", "json", "--namespace", "ml"]
    code, out, _ = run(capsys, *args, *(["--template"] if template else []))
    assert code == 0
    obj = json.loads(out)
    assert kubernetes_validate.validate(obj, "1.37.0", strict=True)
    assert obj["kind"] == ("ResourceClaimTemplate" if template else "ResourceClaim")
    assert obj["metadata"]["namespace"] == "ml"


def test_island_any_and_one_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    island = claimgen.spec(2, nvlink="island", driver_name="gpu.example.com")
    assert island["devices"]["constraints"] == [{"matchAttribute": "gpu.example.com/nvlinkIsland"}]
    assert claimgen.spec(2, nvlink="any")["devices"] == {
        "requests": [
            {
                "name": "gpus",
                "exactly": {
                    "deviceClassName": "gpu.nvidia.com",
                    "allocationMode": "ExactCount",
                    "count": 2,
                },
            }
        ]
    }
    # One GPU: the ladder over digit 1 of setRanks (the GPU whose loss keeps the best sets
    # whole), then any.
    single = claimgen.spec(1)["devices"]["requests"][0]["firstAvailable"]
    assert [r["name"] for r in single] == [*(f"rank{i}" for i in range(1, 8)), "any"]
    assert single[0]["selectors"][0]["cel"]["expression"] == (
        'device.driver == "gpu.nvidia.com" && '
        'device.attributes["gpu.nvidia.com"].?setRanks.orValue(0) % 10 == 1'
    )
    assert claimgen.spec(1, nvlink="island") == claimgen.spec(1, nvlink="any")
    code, out, _ = run(capsys, "--gpus", "2", "--nvlink", "island")
    assert code == 0 and yaml.safe_load(out)["metadata"]["name"] == "gpus-2-island"


@pytest.mark.parametrize("bad", [["--gpus", "0"], ["--gpus", "33"]])
def test_bad_sizes_are_one_error_line_exit_2(
    capsys: pytest.CaptureFixture[str], bad: list[str]
) -> None:
    code, out, err = run(capsys, *bad)
    assert code == 2 and out == ""
    assert err.startswith("dra-driver: error: --gpus must be between 1 and 32")


def test_shipped_examples_are_what_the_generator_writes() -> None:
    for name, template, gpus in (("four-best-gpus", True, 4), ("two-best-gpus", False, 2)):
        claim_doc = examples.load(name)[0]
        assert claim_doc == claimgen.claim(gpus, template=template, name=name), name
        command = f"dra-driver claim --gpus {gpus}" + (" --template" if template else "")
        assert f"{command} --name {name}" in examples.text(name)


def test_the_shipped_quad_gets_the_best_free_quad_from_ranked_slices(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """On a DGX-1 whose gpu-0 is held, the agent ranks gpu-4..gpu-7 first for 4 GPUs; the
    scheduler's search (``simulate``) then gives the example claim exactly those."""
    devices = fake.FakeBackend.from_name("dgx-1-v100").discover()
    slices = build.build(devices, node_name="n1", taken={"gpu-0"}).slices
    (tmp_path / "slices.yaml").write_text(yaml.safe_dump_all(slices))
    held = {
        "results": [{"request": "x", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0"}]
    }
    (tmp_path / "held.yaml").write_text(yaml.safe_dump(held))
    (tmp_path / "claim.yaml").write_text(examples.text("four-best-gpus"))
    code = cli.main(
        [
            "simulate",
            str(tmp_path / "claim.yaml"),
            "--slices",
            str(tmp_path / "slices.yaml"),
            "--allocated",
            str(tmp_path / "held.yaml"),
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    results = yaml.safe_load(out)["devices"]["results"]
    assert [r["device"] for r in results] == ["gpu-4", "gpu-5", "gpu-6", "gpu-7"]
    assert {r["request"] for r in results} == {"gpus/rank1"}


def test_runs_as_a_subprocess() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "dra_driver", "claim", "--gpus", "8", "--template"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(proc.stdout)["kind"] == "ResourceClaimTemplate"
