"""``dra-driver labels`` as a user runs it: a real subprocess, YAML or JSON, env twins, errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dra_driver", "--log-format", "json", "labels", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
    )


def test_yaml_is_a_labels_map_kubectl_accepts() -> None:
    proc = run("--fake", "dgx-1-v100")
    assert proc.returncode == 0, proc.stderr
    labels = yaml.safe_load(proc.stdout)
    assert all(isinstance(v, str) for v in labels.values())  # "8", "true": quoted strings
    assert labels["nvidia.com/gpu.product"] == "Tesla-V100-SXM2-32GB"
    assert labels["nvidia.com/gpu.count"] == "8"
    assert proc.stderr == ""


def test_json_and_the_device_plugin_settings_from_env() -> None:
    proc = run("--fake", "pcie-l4", "-o", "json", env={"GPU_REPLICAS": "3"})
    assert proc.returncode == 0, proc.stderr
    labels = json.loads(proc.stdout)
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-L4-SHARED"
    assert labels["nvidia.com/gpu.replicas"] == "3"
    proc = run("--fake", "a100-mig", "-o", "json", env={"MIG_STRATEGY": "mixed"})
    assert json.loads(proc.stdout)["nvidia.com/mig-1g.5gb.count"] == "2"


def test_how_labels_were_chosen_goes_to_stderr() -> None:
    proc = run("--fake", "a100-mig", "--mig-strategy", "single")
    assert proc.returncode == 0
    assert yaml.safe_load(proc.stdout)["nvidia.com/gpu.product"].endswith("-MIG-INVALID")
    assert "warning: MIG strategy single cannot serve this node" in proc.stderr


def test_bad_input_is_one_line_and_exit_code_2() -> None:
    proc = run("--fake", "a100-mig", "--mig-strategy", "all")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "dra-driver: error: MIG strategy 'all' is not one of none, single, mixed"
    )
    proc = run("--fake", "no-such-profile")
    assert proc.returncode == 2 and "unknown fake profile 'no-such-profile'" in proc.stderr
