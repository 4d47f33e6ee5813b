"""``dra-driver claim``: the claims it prints, their validity, and the shipped examples it made."""

from __future__ import annotations

import json
import subprocess
import sys

import kubernetes_validate
import pytest
import yaml

from dra_driver import cli, examples
from dra_driver.allocation import claimgen


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["claim", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_best_is_a_ladder_of_one_gpu_set_then_any_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--gpus", "4")
    assert code == 0
    obj = yaml.safe_load(out)
    assert obj["kind"] == "ResourceClaim" and obj["metadata"] == {"name": "gpus-4"}
    (request,) = obj["spec"]["devices"]["requests"]
    assert request["name"] == "gpus"
    first, second = request["firstAvailable"]
    assert first["deviceClassName"] == "gpu-set.nvidia.com" and first["count"] == 1
    assert first["selectors"] == [
        {"cel": {"expression": 'device.attributes["gpu.nvidia.com"].gpuCount == 4'}}
    ]
    assert second == {
        "name": "any",
        "deviceClassName": "gpu.nvidia.com",
        "allocationMode": "ExactCount",
        "count": 4,
    }


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
    assert claimgen.spec(1) == claimgen.spec(1, nvlink="any")  # one GPU: nothing to connect
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
