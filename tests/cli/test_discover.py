"""``dra-driver discover`` as a user runs it: a real subprocess, real exit codes and output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

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


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dra_driver", "--log-format", "json", "discover", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def discover_json(profile: str) -> dict[str, Any]:
    proc = run("--fake", profile, "--output", "json")
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def test_cube_mesh_reports_eight_gpus_one_island_and_link_counts() -> None:
    doc = discover_json("dgx-1-v100")
    assert len(doc["gpus"]) == 8
    assert [i["gpus"] for i in doc["topology"]["islands"]] == [list(range(8))]
    pairs = {tuple(p["gpus"]): p for p in doc["topology"]["pairs"]}
    assert len(pairs) == 28
    for (a, b), pair in pairs.items():
        assert pair["nvlinks"] == CUBE_MESH[a][b], (a, b)
        assert pair["path"] == (f"NV{CUBE_MESH[a][b]}" if CUBE_MESH[a][b] else "SYS")
    for gpu in doc["gpus"]:
        assert sum(gpu["nvlinks"].values()) == 6


def test_nvl_pairs_two_islands_and_l4_none() -> None:
    assert [i["gpus"] for i in discover_json("h100-nvl-pairs")["topology"]["islands"]] == [
        [0, 1],
        [2, 3],
    ]
    l4 = discover_json("pcie-l4")
    assert l4["topology"]["islands"] == []
    assert all(gpu["nvlinks"] == {} for gpu in l4["gpus"])


def test_table_and_yaml_outputs() -> None:
    table = run("--fake", "dgx-h100")
    assert table.returncode == 0, table.stderr
    assert "NV18" in table.stdout and "island-0" in table.stdout
    yml = run("--fake", "a100-mig", "--output", "yaml")
    assert yml.returncode == 0 and "profile: 3g.20gb" in yml.stdout


def test_unknown_profile_is_one_line_exit_2() -> None:
    proc = run("--fake", "no-such-profile")
    assert proc.returncode == 2
    assert "unknown fake profile 'no-such-profile'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_without_nvidia_driver_one_line_error_exit_2(tmp_path: Path) -> None:
    """A node without the NVIDIA driver, made here whatever this machine has: the real backend
    is pointed at an NVML library that does not exist (``DRA_DRIVER_NVML_LIBRARY``, the seam of
    :func:`dra_driver.devices.nvmlapi.load_library`) and must say so in one plain line."""
    missing = tmp_path / "no-driver" / "libnvidia-ml.so.1"
    env = {k: v for k, v in os.environ.items() if k not in ("FAKE_PROFILE", "FAKE_PROFILE_FILE")}
    proc = run(env={**env, "DRA_DRIVER_NVML_LIBRARY": str(missing)})
    assert proc.returncode == 2, proc.stdout
    assert proc.stdout == ""
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"dra-driver: error: NVML library {missing} not found: "), lines
    assert "NVIDIA driver must be installed" in lines[0] and "--fake PROFILE" in lines[0]
    assert "Traceback" not in proc.stderr


def test_health_column_and_document_from_nvml() -> None:
    table = run("--fake", "a100-mig")
    assert table.returncode == 0, table.stderr
    header, *rows = [line for line in table.stdout.splitlines() if line][:8]
    assert header.split()[-1] == "HEALTH"
    assert all(row.endswith("Healthy") for row in rows)
    doc = discover_json("a100-mig")
    for gpu in doc["gpus"]:
        assert gpu["health"] == {"health": "Healthy", "conditions": [], "source": "nvml"}
        assert all(m["health"]["health"] == "Healthy" for m in gpu["mig_devices"])


def test_asking_an_agent_that_is_not_running_fails_clearly(tmp_path: Path) -> None:
    proc = run("--fake", "pcie-l4", "--kubelet-plugins-dir", str(tmp_path))
    assert proc.returncode == 1
    assert "no node agent health socket" in proc.stderr


def test_claims_lists_the_prepared_claims_of_the_checkpoint_with_their_gpus(
    tmp_path: Path,
) -> None:
    from dra_driver.devices import fake

    gpus = {g.name: g for g in fake.FakeBackend.from_name("dgx-h100").discover().gpus}
    claims_dir = tmp_path / "plugins" / "gpu.nvidia.com" / "claims"
    claims_dir.mkdir(parents=True)
    uid = "3f1c2d4e-0000-4000-8000-000000000001"
    record = {
        "version": 1,
        "uid": uid,
        "namespace": "ml",
        "name": "train",
        "state": "PrepareCompleted",
        "bootId": "b",
        "devices": [
            {
                "requestNames": ["gpu"],
                "poolName": "n1",
                "deviceName": name,
                "cdiDeviceIds": [f"k8s.gpu.nvidia.com/claim={uid}-{name}"],
            }
            for name in ("gpu-1", "gpu-5")
        ],
        "cdiSpec": {},
    }
    (claims_dir / f"{uid}.json").write_text(json.dumps(record))
    (claims_dir / ".spare-ab-1").write_text("")  # spare files and junk are skipped
    (claims_dir / "junk.json").write_text("{")
    args = ("--fake", "dgx-h100", "--kubelet-plugins-dir", str(tmp_path / "plugins"), "--claims")
    proc = run(*args, "-o", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc == {
        "claims": [
            {
                "namespace": "ml",
                "name": "train",
                "uid": uid,
                "state": "PrepareCompleted",
                "devices": [
                    {
                        "device": name,
                        "requests": ["gpu"],
                        "gpus": [
                            {"uuid": gpus[name].uuid, "minor": gpus[name].minor, "mig_uuid": ""}
                        ],
                    }
                    for name in ("gpu-1", "gpu-5")
                ],
            }
        ]
    }
    table = run(*args)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == [
        "CLAIM",
        "UID",
        "STATE",
        "DEVICE",
        "GPU",
        "UUID",
        "MINOR",
        "MIG",
        "UUID",
    ]
    assert lines[1].split()[:6] == [
        "ml/train",
        uid,
        "PrepareCompleted",
        "gpu-1",
        gpus["gpu-1"].uuid,
        "1",
    ]
    missing = run("--fake", "dgx-h100", "--kubelet-plugins-dir", str(tmp_path / "none"), "--claims")
    assert missing.returncode == 1
    assert "no checkpoint at" in missing.stderr
