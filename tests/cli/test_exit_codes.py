"""Exit codes as ``--help`` states them: input mistakes are exit 2 with one line, never 1."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_driver import cli

TYPO = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: typo}
spec:
  spec:
    devices:
      requests:
      - name: gpus
        firstAvailable:
        - {name: ranked, deviceClassName: gpu-ranked.nvidia.com, count: 1}
        - {name: plain, deviceClassName: gpu.nvidia.comm, count: 1}
"""


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    code = cli.main(argv)
    return code, capsys.readouterr().err.splitlines()


def test_unknown_device_class_names_the_closest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    claim = tmp_path / "typo.yaml"
    claim.write_text(TYPO)
    code, err = _run(["simulate", str(claim), "--fake", "dgx-h100"], capsys)
    assert code == 2 and len(err) == 1, err
    assert "unknown DeviceClass 'gpu.nvidia.comm'" in err[0]
    assert "did you mean gpu.nvidia.com?" in err[0]
    # Defined with --class, the same name is no longer unknown (the claim is allocated).
    cls = tmp_path / "class.yaml"
    cls.write_text(
        "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata: {name: gpu.nvidia.comm}\n"
        "spec:\n  selectors:\n  - cel: {expression: 'device.driver == \"gpu.nvidia.com\"'}\n"
    )
    code, err = _run(["simulate", str(claim), "--fake", "dgx-h100", "--class", str(cls)], capsys)
    assert code == 0, err


@pytest.mark.parametrize("content", ["", "---\n", '{"kind": "List", "items": []}\n'])
def test_allocated_without_results_is_refused_by_simulate_and_capacity(
    content: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    slices = tmp_path / "slices.yaml"
    assert cli.main(["slices", "--fake", "dgx-h100", "--node-name", "n1"]) == 0
    slices.write_text(capsys.readouterr().out)
    empty = tmp_path / "allocated.yaml"
    empty.write_text(content)
    claim = Path(__file__).resolve().parents[2] / "deployments" / "examples" / "one-gpu.yaml"
    for argv in (
        ["simulate", str(claim), "--slices", str(slices), "--allocated", str(empty)],
        ["capacity", "--slices", str(slices), "--allocated", str(empty)],
    ):
        code, err = _run(argv, capsys)
        assert code == 2 and len(err) == 1, (argv, err)
        assert f"{empty}: no allocation result in it" in err[0]
