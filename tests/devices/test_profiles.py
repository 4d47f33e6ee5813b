"""The profile format: every shipped profile loads, and every mistake names the file and field."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from scriptload import load_script

from dra_driver.devices.fake import profiles

REQUIRED = {"dgx-h100", "dgx-1-v100", "h100-nvl-pairs", "pcie-l4", "a100-mig", "gb200-nvl"}

GOOD = """\
name: my-node
driverVersion: "580.95.05"
cudaDriverVersion: "13.0"
defaults: {productName: NVIDIA L4, brand: Nvidia, architecture: Ada Lovelace,
           cudaComputeCapability: "8.9", memory: 23034Mi}
gpus:
  - {pciBusId: "0000:01:00.0", pcieRoot: pci0000:00, numaNode: 0}
  - {pciBusId: "0000:81:00.0", pcieRoot: pci0000:80, numaNode: 1}
"""


def test_required_profiles_are_shipped() -> None:
    assert set(profiles.builtin_names()) >= REQUIRED


def test_the_json_twins_are_what_their_yaml_sources_say(tmp_path: Path) -> None:
    """A fake agent reads the JSON twin; regenerating (scripts/gen_profiles.py) changes none,
    and the check names a stale, a missing and an orphaned twin."""
    gen = load_script("gen_profiles")
    assert gen.drift() == [], "run `python scripts/gen_profiles.py` and commit the result"
    folder = tmp_path / "profiles"
    shutil.copytree(gen.FOLDER, folder)
    (folder / "pcie-l4.json").write_text('{"name": "pcie-l4"}\n')
    (folder / "dgx-h100.json").unlink()
    (folder / "gone.json").write_text("{}\n")
    assert gen.drift(folder) == [
        "dgx-h100.json: missing",
        "pcie-l4.json: differs from pcie-l4.yaml",
        "gone.json: no gone.yaml",
    ]


def test_a_builtin_profile_loads_without_a_yaml_parser() -> None:
    """A real node's agent holds no PyYAML (its configuration is in-cluster): a fake node's,
    which fleet figures stand in for, must not either (docs/fleet.md)."""
    probe = (
        "import sys; from dra_driver.devices import fake; "
        "b = fake.FakeBackend.from_name('dgx-h100'); "
        "print(len(b.profile.gpus), 'yaml' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["8", "False"]


@pytest.mark.parametrize("name", profiles.builtin_names())
def test_every_builtin_profile_loads(name: str) -> None:
    prof = profiles.load_builtin(name)
    assert prof.name == name
    assert prof.gpus
    for pos in range(len(prof.gpus)):
        assert prof.resolved(pos, "memory") > 0
        assert prof.gpu_uuid(pos).startswith("GPU-")
    # What profiles.dump gives is a profile file that loads back to the same profile.
    assert profiles.parse(yaml.safe_dump(profiles.dump(prof)), source=name) == prof


def test_builtin_profile_facts() -> None:
    h100 = profiles.load_builtin("dgx-h100")
    assert len(h100.gpus) == 8
    assert h100.resolved(0, "product_name") == "NVIDIA H100 80GB HBM3"
    assert h100.nvlink is not None and h100.nvlink.switched == 18
    assert [g.numa_node for g in h100.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert len({g.pcie_root for g in h100.gpus}) == 4
    mig = profiles.load_builtin("a100-mig")
    assert all(g.mig for g in mig.gpus)
    assert len({m.profile for g in mig.gpus for m in g.mig or ()}) >= 3
    gb200 = profiles.load_builtin("gb200-nvl")
    assert len(gb200.gpus) == 4
    assert gb200.resolved(0, "fabric") is not None


def test_unknown_builtin_lists_the_known_ones() -> None:
    with pytest.raises(profiles.ProfileError, match=r"unknown fake profile 'dgx-9'.*dgx-h100"):
        profiles.load_builtin("dgx-9")


def test_user_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(GOOD)
    prof = profiles.load_file(path)
    assert prof.name == "my-node"
    assert prof.resolved(1, "memory") == 23034 << 20


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (('pciBusId: "0000:81:00.0"', 'pciBusId: "81:00"'), "gpus.1.pciBusId"),
        (("memory: 23034Mi", "memory: 23 GB"), "defaults.memory"),
        (("numaNode: 1", "numaNode: -1"), "gpus.1.numaNode"),
        (('driverVersion: "580.95.05"', "driverVersion: latest"), "driverVersion"),
        (("name: my-node", "name: my-node\ncolour: blue"), "colour"),
        (("brand: Nvidia, ", ""), "gpus[0]: brand is not set"),
    ],
)
def test_errors_name_file_and_field(tmp_path: Path, change: tuple[str, str], field: str) -> None:
    path = tmp_path / "bad.yaml"
    assert change[0] in GOOD
    path.write_text(GOOD.replace(*change))
    with pytest.raises(profiles.ProfileError) as info:
        profiles.load_file(path)
    message = str(info.value)
    assert str(path) in message
    assert field in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        pytest.param(
            ("numaNode: 1", "numaNode: true"),
            "gpus.1.numaNode: expected an integer, got a boolean True",
            id="bool-is-not-int",
        ),
        pytest.param(
            ('cudaDriverVersion: "13.0"', "cudaDriverVersion: 13.0"),
            "cudaDriverVersion: expected a string, got a number 13.0",
            id="number-is-not-string",
        ),
        pytest.param(
            ('driverVersion: "580.95.05"\n', ""),
            "driverVersion: required field missing",
            id="required",
        ),
        pytest.param(
            ("numaNode: 1}", "numaNode: 1, telemetry: {gpuUtilization: 101}}"),
            "gpus.1.telemetry.gpuUtilization: must be at most 100, got 101",
            id="le",
        ),
        pytest.param(
            ("numaNode: 1}", "numaNode: 1, telemetry: {notSupported: [colour]}}"),
            "gpus.1.telemetry.notSupported.0: must be one of 'utilization', 'memory', 'power', "
            "'temperature', got a string 'colour'",
            id="literal",
        ),
        pytest.param(
            ("numaNode: 1}", "numaNode: 1, telemetry: {memoryUsed: 1 GB}}"),
            "gpus.1.telemetry.memoryUsed: '1 GB' is not a byte size like 80Gi, 4864Mi or 1024",
            id="bytes",
        ),
        pytest.param(
            ("name: my-node", "name: my-node\nmachineType: ''"),
            "machineType: must have a length of at least 1",
            id="min-length",
        ),
        pytest.param(
            ("name: my-node", f"name: my-node\nmachineType: {'x' * 257}"),
            "machineType: must have a length of at most 256",
            id="max-length",
        ),
        pytest.param(
            ("gpus:\n", "gpus: []\nold:\n"),
            "old: unknown field (accepted: name, description, driverVersion, machineType, "
            "cudaDriverVersion, defaults, gpus, nvlink); gpus: must have a length of at least 1",
            id="min-items-and-every-problem",
        ),
        pytest.param(
            ("numaNode: 1}", "numaNode: 1, numa_node: 1}"),
            "gpus.1.numaNode: given twice, as numaNode and numa_node",
            id="alias-and-name",
        ),
        pytest.param(
            ("name: my-node", "name: My-Node"),
            "name: 'My-Node' does not match the pattern ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
            id="pattern",
        ),
    ],
)
def test_strict_rules_give_the_whole_message(change: tuple[str, str], problem: str) -> None:
    assert change[0] in GOOD
    with pytest.raises(profiles.ProfileError) as info:
        profiles.parse(GOOD.replace(*change, 1), source="my.yaml")
    assert str(info.value) == f"my.yaml: invalid profile: {problem}"


def test_fields_may_be_given_by_their_python_names() -> None:
    text = GOOD.replace("pciBusId", "pci_bus_id").replace("numaNode", "numa_node")
    assert profiles.parse(text, source="snake") == profiles.parse(GOOD, source="camel")


def test_a_profile_changed_in_code_is_checked_and_frozen() -> None:
    h100 = profiles.load_builtin("dgx-h100")
    moved = dataclasses.replace(h100.gpus[1], index=9)
    with pytest.raises(ValueError, match=r"GPU indices must be 0\.\.7 without gaps"):
        dataclasses.replace(h100, gpus=[h100.gpus[0], moved, *h100.gpus[2:]])
    with pytest.raises(dataclasses.FrozenInstanceError):
        h100.name = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ("nvlink: {switched: 18, pairs: [{gpus: [0, 1], links: 2}]}", "exactly one of"),
        ("nvlink: {matrix: [[0, 1], [2, 0]]}", "not symmetric"),
        ("nvlink: {matrix: [[0, 1]]}", "must be 2x2"),
        ("nvlink: {pairs: [{gpus: [0, 5], links: 2}]}", "bad GPU pair"),
    ],
)
def test_nvlink_mistakes(tmp_path: Path, extra: str, reason: str) -> None:
    path = tmp_path / "links.yaml"
    path.write_text(GOOD + extra + "\n")
    with pytest.raises(profiles.ProfileError, match=reason) as info:
        profiles.load_file(path)
    assert str(path) in str(info.value)


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(profiles.ProfileError, match=r"cannot read .*missing\.yaml"):
        profiles.load_file(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(profiles.ProfileError, match=re.escape(f"{bad}: not valid YAML")):
        profiles.load_file(bad)
    bad.write_text("- just\n- a list\n")
    with pytest.raises(profiles.ProfileError, match="must be a YAML mapping"):
        profiles.load_file(bad)


def test_parse_bytes() -> None:
    assert profiles.parse_bytes("80Gi") == 80 << 30
    assert profiles.parse_bytes("4864Mi") == 4864 << 20
    assert profiles.parse_bytes(1024) == 1024
    with pytest.raises(ValueError, match="not a byte size"):
        profiles.parse_bytes("80GB")
