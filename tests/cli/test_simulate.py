"""``dra-driver simulate`` as a user runs it: exit 0 with the allocation, 1 with the reasons,
2 with one error line for bad input."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver import cli, examples
from dra_driver.allocation import claimgen
from dra_driver.devices import fake
from dra_driver.slices import build

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "deployments" / "examples"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dra_driver", "simulate", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,
    )


def main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["simulate", *args])
    out, err = capsys.readouterr()
    return code, out, err


def write(path: Path, *docs: Any) -> str:
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return str(path)


def test_allocates_an_example_claim() -> None:
    proc = run(str(EXAMPLES / "two-gpus-nvlink.yaml"), "--fake", "h100-nvl-pairs")
    assert proc.returncode == 0, proc.stderr
    allocation = yaml.safe_load(proc.stdout)
    assert [r["device"] for r in allocation["devices"]["results"]] == ["gpu-0", "gpu-1"]
    assert allocation["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [
        "fake-node"
    ]
    assert proc.stdout.startswith("# ResourceClaim two-gpus-nvlink: allocated on node fake-node")


def test_unsatisfiable_claim_exits_1_with_the_reasons() -> None:
    proc = run(str(EXAMPLES / "cannot-fit.yaml"), "--fake", "dgx-h100", "--node-name", "n1")
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.splitlines() == [
        "ResourceClaim cannot-fit cannot be allocated on node n1:",
        "  - request gpus: needs 16 devices of class gpu.nvidia.com; 8 of 8 usable",
    ]


def test_bad_input_is_one_error_line_exit_2(tmp_path: Path) -> None:
    proc = run(str(tmp_path / "missing.yaml"), "--fake", "dgx-h100")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"dra-driver: error: cannot read {tmp_path / 'missing.yaml'}: No such file or directory"
    ]


def test_selector_that_does_not_compile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    docs = examples.load("one-gpu")
    docs[0]["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
        {"cel": {"expression": "device.attributes.nope("}}
    ]
    code, _, err = main(capsys, write(tmp_path / "c.yaml", *docs), "--fake", "dgx-h100")
    assert code == 2
    assert err.startswith(
        "dra-driver: error: ResourceClaim one-gpu: request gpu: selectors[0]: "
        'CEL expression "device.attributes.nope(": '
    )
    assert len(err.strip().splitlines()) == 1


def test_pod_less_file_with_claim_class_and_slices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    devices = fake.FakeBackend.from_name("pcie-l4").discover()
    slices = build.build(devices, node_name="l4-node").slices
    cls = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "l4"},
        "spec": {
            "selectors": [
                {
                    "cel": {
                        "expression": 'device.attributes["gpu.nvidia.com"].productName '
                        '== "NVIDIA L4"'
                    }
                }
            ]
        },
    }
    the_claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "two-l4"},
        "spec": {
            "devices": {
                "requests": [{"name": "gpus", "exactly": {"deviceClassName": "l4", "count": 3}}]
            }
        },
    }
    path = write(tmp_path / "all.yaml", the_claim, cls, *slices)
    code, out, _ = main(capsys, path)
    assert code == 0
    assert "allocated on node l4-node" in out
    # The same devices, now in use by another claim, leave too few.
    used = write(tmp_path / "used.yaml", yaml.safe_load(out)["devices"])
    code, out, _ = main(capsys, path, "--allocated", used)
    assert code == 1 and "1 of 4 usable" in out
    assert "gpu-0, gpu-1, gpu-2: allocated to another claim" in out


def test_slices_flag_and_node_choice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    devices = fake.FakeBackend.from_name("dgx-h100").discover()
    two_nodes = [
        *build.build(devices, node_name="a").slices,
        *build.build(devices, node_name="b").slices,
    ]
    slices = write(tmp_path / "s.yaml", *two_nodes)
    claim_file = str(EXAMPLES / "one-gpu.yaml")
    code, _, err = main(capsys, claim_file, "--slices", slices)
    assert code == 2 and "choose one with --node-name" in err
    code, out, _ = main(capsys, claim_file, "--slices", slices, "--node-name", "b")
    assert code == 0 and yaml.safe_load(out)["devices"]["results"][0]["pool"] == "b"


def test_fake_file_and_class_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = REPO / "dra_driver" / "devices" / "fake" / "profiles" / "h100-nvl-pairs.yaml"
    cls = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "gpu.nvidia.com"},
        "spec": {
            "selectors": [
                {"cel": {"expression": 'device.attributes["resource.kubernetes.io"].numaNode == 1'}}
            ]
        },
    }
    code, out, _ = main(
        capsys,
        str(EXAMPLES / "one-gpu.yaml"),
        "--fake-file",
        str(profile),
        "--class",
        write(tmp_path / "cls.yaml", cls),
    )
    assert code == 0  # the user's class replaces the built-in one of the same name
    assert yaml.safe_load(out)["devices"]["results"][0]["device"] == "gpu-2"
    code, _, err = main(
        capsys,
        str(EXAMPLES / "one-gpu.yaml"),
        "--fake",
        "dgx-h100",
        "--class",
        str(EXAMPLES / "one-gpu.yaml"),
    )
    assert code == 2 and "no DeviceClass in it" in err


def test_claim_file_without_a_claim(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = main(capsys, write(tmp_path / "p.yaml", {"kind": "Pod"}), "--fake", "dgx-h100")
    assert code == 2 and "no ResourceClaim or ResourceClaimTemplate in it" in err


def test_simulate_shares_of_a_shareable_profile(tmp_path: Path) -> None:
    claims = "".join(
        f"""---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: {name}}}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.nvidia.com
        capacity: {{requests: {{memory: {memory}}}}}
"""
        for name, memory in (("a", "12Gi"), ("b", "11Gi"))
    )
    path = tmp_path / "shares.yaml"
    path.write_text(claims)
    one_gpu = tmp_path / "one-l4.yaml"
    one_gpu.write_text(
        'name: one-l4\ndriverVersion: "580.95.05"\ncudaDriverVersion: "13.0"\n'
        "defaults: {productName: NVIDIA L4, brand: Nvidia, architecture: Ada Lovelace, "
        'cudaComputeCapability: "8.9", memory: 22Gi}\ngpus:\n  - {pciBusId: "0000:01:00.0"}\n'
    )
    proc = subprocess.run(
        [sys.executable, "-m", "dra_driver", "simulate", str(path), "--fake-file", str(one_gpu),
         "--shareable", "L4"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    first, second = proc.stdout.split("---\n")
    assert "shareID:" in first and "memory: 12Gi" in first
    assert "ResourceClaim b cannot be allocated" in second
    assert "gpu-0: 10Gi of memory left, 11Gi requested" in second


def _taken(tmp_path: Path, *names: str, pool: str = "fake-node") -> str:
    results = [{"driver": "gpu.nvidia.com", "pool": pool, "device": n} for n in names]
    return write(tmp_path / "taken.yaml", results)


def test_explain_shows_the_optimum_the_gap_and_the_better_claim(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = write(tmp_path / "plain.yaml", claimgen.claim(4, nvlink="any", name="plain"))
    args = ["--fake", "dgx-1-v100", "--allocated", _taken(tmp_path, "gpu-0"), "--explain"]
    code, out, _ = main(capsys, plain, *args)
    assert code == 0
    lines = [ln for ln in out.splitlines() if ln.startswith("# explain:")]
    assert lines[0].startswith("# explain: scheduler's pick: gpu-1, gpu-2, gpu-3, gpu-4 (5 NVLink")
    assert lines[1].startswith("# explain: optimum: gpu-4, gpu-5, gpu-6, gpu-7 (9 NVLink links")
    assert lines[2] == "# explain: gap: 4 NVLink links, 3 same-NUMA pairs, 3 same-PCIe-root pairs"
    assert (
        "`dra-driver claim --gpus 4` writes this claim instead (on this node it gets gpu-4, "
        in (lines[3])
    )
    suggested = yaml.safe_load(
        "\n".join(ln[4:] for ln in out.splitlines() if ln.startswith("#   "))
    )
    assert suggested == claimgen.claim(4, name="plain-best")
    # Without --explain the output is the allocation alone.
    code, quiet, _ = main(capsys, plain, *args[:-1])
    assert code == 0 and "# explain" not in quiet


def test_explain_of_the_generated_claim_finds_no_gap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    best = write(tmp_path / "best.yaml", claimgen.claim(4))
    args = ["--fake", "dgx-1-v100", "--allocated", _taken(tmp_path, "gpu-0"), "--explain"]
    code, out, _ = main(capsys, best, *args)
    assert code == 0
    results = yaml.safe_load(out.split("# explain")[0])["devices"]["results"]
    assert [r["device"] for r in results] == ["gpu-4", "gpu-5", "gpu-6", "gpu-7"]
    assert {r["request"] for r in results} == {"gpus/rank1"}  # ranked with gpu-0 held
    assert "# explain: gap: none, the scheduler's pick is optimal" in out


def test_explain_says_when_the_slices_carry_stale_ranks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exported slices ranked for an empty node, GPUs since taken: the ladder's ranks are out of
    date, the claim falls back to any GPUs, and --explain says why the better claim is no
    better here."""
    devices = fake.FakeBackend.from_name("hgx-16-mesh").discover()
    stale = write(tmp_path / "slices.yaml", *build.build(devices, node_name="mesh").slices)
    taken = [f"gpu-{i}" for i in (1, 3, 4, 5, 7, 8, 9, 11, 15)]
    best = write(tmp_path / "best.yaml", claimgen.claim(4))
    args = ["--slices", stale, "--allocated", _taken(tmp_path, *taken, pool="mesh"), "--explain"]
    code, out, _ = main(capsys, best, *args)
    assert code == 0
    assert "# explain: optimum: gpu-10, gpu-12, gpu-13, gpu-14 (6 NVLink links" in out
    assert "the set ranks in these slices are not those of the GPUs free here" in out
    fresh = ["--fake", "hgx-16-mesh", "--allocated", _taken(tmp_path, *taken), "--explain"]
    code, out, _ = main(capsys, best, *fresh)
    assert code == 0
    assert "# explain: gap: none, the scheduler's pick is optimal" in out
