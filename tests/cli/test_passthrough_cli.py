"""``simulate`` and ``slices`` with ``--passthrough``, as a user runs them (real subprocesses):
a VM claim takes every GPU as gpu-vfio-N and a container claim after it is refused with the
counter's reason; ``slices`` counts the passthrough devices; a bad selection is exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CLAIMS = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: vm, namespace: t}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: vfio.gpu.nvidia.com, count: 4}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: pod, namespace: t}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: gpu.nvidia.com}
"""


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dra_driver", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_simulate_gives_the_vm_every_gpu_and_refuses_the_pod_saying_why(tmp_path: Path) -> None:
    path = tmp_path / "claims.yaml"
    path.write_text(CLAIMS)
    proc = run("simulate", "--fake", "pcie-l4", "--passthrough", "all", str(path))
    assert proc.returncode == 1, proc.stderr
    out = proc.stdout
    assert all(f"device: gpu-vfio-{i}" in out for i in range(4))
    assert "ResourceClaim pod cannot be allocated" in out
    assert "its shared counter is used up" in out
    plain = run("simulate", "--fake", "pcie-l4", str(path))
    assert "ResourceClaim vm cannot be allocated" in plain.stdout  # nothing offered to VMs


def test_slices_counts_the_passthrough_devices_and_bad_flags_are_usage_errors() -> None:
    proc = run("slices", "--node-name", "n1", "--fake", "a100-mig", "--passthrough", "all")
    assert proc.returncode == 0, proc.stderr
    assert "5 MIG devices, 2 passthrough devices; 2 counter sets" in proc.stderr
    bad = run("slices", "--node-name", "n1", "--fake", "pcie-l4", "--passthrough", "auto")
    assert bad.returncode == 2 and "--passthrough 'auto': say which GPUs" in bad.stderr
