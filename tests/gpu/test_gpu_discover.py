"""``discover`` and ``slices`` on the real GPUs: what NVML gives us matches what nvidia-smi
says, and the slices we would publish pass the API server's validation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from dra_driver.slices import validate

from . import gpukit

pytestmark = pytest.mark.gpu


def test_discover_json_matches_nvidia_smi(node: gpukit.GpuNode, nvidia_smi: Path) -> None:
    proc = gpukit.run_cli("discover", "-o", "json")
    assert proc.returncode == 0, proc.stderr
    ours = {g["uuid"]: g for g in json.loads(proc.stdout)["gpus"]}
    theirs = {row["uuid"]: row for row in gpukit.query_gpus(nvidia_smi, gpukit.SMI_FIELDS)}
    assert set(ours) == set(theirs), "discover and nvidia-smi list different GPUs"
    cuda = gpukit.cuda_version(gpukit.smi(nvidia_smi, "-q"))
    for uuid, smi in theirs.items():
        gpu: dict[str, Any] = ours[uuid]
        assert gpu["index"] == int(smi["index"]), uuid
        assert gpu["product_name"] == smi["name"], uuid
        # nounits: MiB as an integer; NVML's total in bytes, floored the same way
        assert abs(gpu["memory_bytes"] // (1 << 20) - int(smi["memory.total"])) <= 1, uuid
        assert gpu["pci_bus_id"] == gpukit.bus_id(smi["pci.bus_id"]), uuid
        assert gpu["driver_version"] == smi["driver_version"], uuid
        if cuda is not None:
            assert gpu["cuda_driver_version"] == cuda, uuid
        assert gpu["mig_capable"] == gpukit.mig_capable(smi["mig.mode.current"]), uuid
        assert gpu["mig_enabled"] == (smi["mig.mode.current"] == "Enabled"), uuid
        assert gpu["health"]["health"] == "Healthy", (uuid, gpu["health"])
    assert cuda is not None, "nvidia-smi -q names no CUDA Version"


def test_slices_are_valid_and_hold_every_gpu(node: gpukit.GpuNode) -> None:
    proc = gpukit.run_cli(
        "slices",
        "--node-name",
        gpukit.NODE,
        "--dynamic-mig",
        "none",
        "--shareable",
        "none",
        "-o",
        "json",
    )
    assert proc.returncode == 0, proc.stderr
    items = json.loads(proc.stdout)["items"]
    assert items
    for doc in items:
        assert validate.validate(doc) == [], doc["metadata"]["name"]
        assert kubernetes_validate.validate(doc, "1.37.0", strict=True)
        assert doc["spec"]["nodeName"] == gpukit.NODE
    assert set(gpukit.device_per_gpu(items, node.uuids)) == node.uuids
