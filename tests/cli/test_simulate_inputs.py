"""``dra-driver simulate`` on input that would silently give a wrong answer: ``--allocated``
entries that match no device (a warning naming each, an error when none matches), files with
no allocation, and claims of an API version the simulator does not read (one line, exit 2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver import cli

REPO = Path(__file__).resolve().parents[2]
ONE_GPU = str(REPO / "deployments" / "examples" / "one-gpu.yaml")
FOUR = str(REPO / "deployments" / "examples" / "four-best-gpus.yaml")


def simulate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, list[str]]:
    code = cli.main(["simulate", *args])
    out, err = capsys.readouterr()
    return code, out, err.splitlines()


def results_file(path: Path, *entries: tuple[str, str]) -> str:
    docs = [{"driver": "gpu.nvidia.com", "pool": pool, "device": dev} for pool, dev in entries]
    path.write_text(yaml.safe_dump(docs))
    return str(path)


def picked(out: str) -> list[str]:
    return [r["device"] for r in yaml.safe_load(out)["devices"]["results"]]


def test_an_entry_naming_no_device_is_a_warning_and_the_others_still_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    taken = results_file(tmp_path / "t.yaml", ("fake-node", "gpu-0"), ("fake-node", "gpu-99"))
    code, out, err = simulate(capsys, ONE_GPU, "--fake", "dgx-h100", "--allocated", taken)
    assert code == 0
    assert picked(out) == ["gpu-1"]  # gpu-0 is held
    assert err == [
        f"dra-driver: warning: --allocated {taken}: entry gpu.nvidia.com/fake-node/gpu-99 "
        "matches no device: pool fake-node has no device gpu-99; not counted as in use"
    ]


def test_no_entry_matching_is_one_error_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other_node = results_file(tmp_path / "n1.yaml", ("n1", "gpu-0"), ("n1", "gpu-1"))
    code, out, err = simulate(capsys, ONE_GPU, "--fake", "dgx-h100", "--allocated", other_node)
    assert code == 2 and out == ""
    assert err == [
        "dra-driver: error: --allocated: no entry matches a device of the slices (2 checked); "
        f"{other_node}: entry gpu.nvidia.com/n1/gpu-0 matches no device: no pool n1 "
        "(the slices' pools: fake-node)"
    ]


def test_another_drivers_entry_names_the_driver(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "other.yaml"
    path.write_text(yaml.safe_dump([{"driver": "x.example.com", "pool": "p", "device": "d"}]))
    code, _, err = simulate(capsys, ONE_GPU, "--fake", "dgx-h100", "--allocated", str(path))
    assert code == 2
    assert err[0].endswith("matches no device: no slice is of driver x.example.com")


@pytest.mark.parametrize(
    "content",
    [[], [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {}}]],
    ids=["empty-list", "claim-without-status"],
)
def test_a_file_with_no_allocation_result_is_an_error(
    content: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "none.yaml"
    path.write_text(yaml.safe_dump(content))
    code, out, err = simulate(capsys, ONE_GPU, "--fake", "dgx-h100", "--allocated", str(path))
    assert code == 2 and out == "" and len(err) == 1
    assert err[0].startswith(f"dra-driver: error: --allocated {path}: no allocation result in it")


def test_a_claim_with_status_allocation_matches_by_pool_and_device(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "held", "namespace": "default"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "g",
                            "driver": "gpu.nvidia.com",
                            "pool": "fake-node",
                            "device": d,
                        }
                        for d in ("gpu-0", "gpu-1", "gpu-2", "gpu-3")
                    ]
                }
            }
        },
    }
    path = tmp_path / "held.yaml"
    path.write_text(yaml.safe_dump(claim))
    code, out, err = simulate(capsys, FOUR, "--fake", "dgx-h100", "--allocated", str(path))
    assert code == 0 and err == []
    assert picked(out) == ["gpu-4", "gpu-5", "gpu-6", "gpu-7"]


@pytest.mark.parametrize("version", ["resource.k8s.io/v1alpha2", "resource.k8s.io/v1beta1"])
def test_a_claim_of_an_unsupported_api_version_names_it_and_the_supported_ones(
    version: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = list(yaml.safe_load_all(Path(ONE_GPU).read_text()))
    docs[0]["apiVersion"] = version
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    code, out, err = simulate(capsys, str(path), "--fake", "dgx-h100")
    assert code == 2 and out == ""
    assert err == [
        f"dra-driver: error: {path}: ResourceClaimTemplate one-gpu is {version}, which this "
        "simulator does not read; supported: resource.k8s.io/v1, resource.k8s.io/v1beta2"
    ]


def test_a_v1beta2_claim_is_read_as_v1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    docs = list(yaml.safe_load_all(Path(ONE_GPU).read_text()))
    docs[0]["apiVersion"] = "resource.k8s.io/v1beta2"
    path = tmp_path / "beta2.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    code, out, _ = simulate(capsys, str(path), "--fake", "dgx-h100")
    assert code == 0 and picked(out) == ["gpu-0"]


def test_the_help_documents_the_allocated_file_format(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["simulate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "ResourceClaims with status.allocation" in text
    assert "bare `results:` lists, or single results" in text
    assert "no match at all an error (exit 2)" in text
