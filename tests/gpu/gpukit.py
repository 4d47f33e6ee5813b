"""What the real-GPU checks share: the node as NVML and nvidia-smi see it, the environment our
processes get, and ResourceClaims as the scheduler would leave them.

Nothing here changes a GPU: nvidia-smi is only ever asked to *query* (``--query-gpu``, ``-q``,
``-L``), and the processes we start get explicit flags that keep dynamic MIG, sharing and MPS
off whatever the environment of the node says (docs/gpu-check.md).
"""

from __future__ import annotations

import csv
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from dra_driver.devices import model
from dra_driver.driver import claims, driverfiles
from dra_driver.testing.fakeapi import fakeserver

NODE = "gpu-check-node"
DRIVER = "gpu.nvidia.com"
# The environment our own processes keep: what finds Python, the NVML library and a home.
KEPT_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "LD_LIBRARY_PATH", "PYTHONPATH")
SMI_FIELDS = (
    "index",
    "uuid",
    "name",
    "memory.total",
    "pci.bus_id",
    "driver_version",
    "mig.mode.current",
)
SETTINGS_FIELDS = ("uuid", "compute_mode", "mig.mode.current", "mig.mode.pending")
NOT_AVAILABLE = ("[N/A]", "N/A", "[Not Supported]", "Not Supported")


@dataclasses.dataclass(frozen=True)
class GpuNode:
    """This machine's GPUs as discovery read them in the probe, and where the driver is."""

    devices: model.NodeDevices
    driver_root: Path
    nvidia_smi: Path | None

    @property
    def uuids(self) -> set[str]:
        return {g.uuid for g in self.devices.gpus}


def clean_env(**extra: str) -> dict[str, str]:
    """The environment for our CLI and plugin processes: the node's own settings (``DRIVER_ROOT``,
    ``DYNAMIC_MIG``, ``SHAREABLE``, ``NODE_NAME``, ...) stay out, so only our flags count."""
    env = {k: os.environ[k] for k in KEPT_ENV if k in os.environ}
    env.update({k: v for k, v in os.environ.items() if k == "DRA_DRIVER_NVML_LIBRARY"})
    return {**env, **extra}


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dra_driver", "--log-format", "json", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=clean_env(),
    )


# --- where the driver is ---------------------------------------------------------------------


def loaded_nvml() -> Path | None:
    """The NVML library file this process has mapped (after the probe's ``nvmlInit``)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and "/libnvidia-ml.so" in fields[5]:
            return Path(fields[5].strip())
    return None


def driver_root_of(library: Path | None) -> Path:
    """The driver root a library directory belongs to (``/usr/local/nvidia/lib64`` →
    ``/usr/local/nvidia``; ``/usr/lib/x86_64-linux-gnu`` → ``/``): the longest of the plugin's
    library directories the path ends with; ``/`` when none does."""
    if library is None:
        return Path("/")
    directory = library.parent.as_posix().rstrip("/")
    matches = [rel for rel in driverfiles.LIBRARY_DIRS if directory.endswith("/" + rel)]
    if not matches:
        return Path("/")
    rel = max(matches, key=len)
    return Path(directory[: -len(rel) - 1] or "/")


def find_nvidia_smi(driver_root: Path) -> Path | None:
    for rel in ("usr/bin/nvidia-smi", "bin/nvidia-smi"):
        candidate = driver_root / rel
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("nvidia-smi")
    return Path(found) if found else None


# --- nvidia-smi, read only -------------------------------------------------------------------


def smi(binary: Path, *args: str) -> str:
    """Run a *query* of nvidia-smi (never a setter) and return its standard output."""
    assert all(a in ("-q", "-L") or a.startswith(("--query-gpu=", "--format=")) for a in args)
    done = subprocess.run(
        [str(binary), *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, f"nvidia-smi {' '.join(args)}: {done.stderr or done.stdout}"
    return done.stdout


def query_gpus(binary: Path, fields: tuple[str, ...]) -> list[dict[str, str]]:
    """``nvidia-smi --query-gpu=... --format=csv,noheader,nounits``: one dict per GPU."""
    text = smi(binary, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits")
    return parse_csv(text, fields)


def parse_csv(text: str, fields: tuple[str, ...]) -> list[dict[str, str]]:
    rows = [row for row in csv.reader(text.splitlines(), skipinitialspace=True) if row]
    assert all(len(row) == len(fields) for row in rows), text
    return [{f: v.strip() for f, v in zip(fields, row, strict=True)} for row in rows]


def cuda_version(query_text: str) -> str | None:
    """The ``CUDA Version`` line of ``nvidia-smi -q`` (the driver's, as NVML reports it)."""
    found = re.search(r"^\s*CUDA Version\s*:\s*(\S+)\s*$", query_text, re.MULTILINE)
    return found.group(1) if found else None


def bus_id(value: str) -> str:
    """A PCI bus ID in one form whatever wrote it: NVML's ``00000000:17:00.0`` and sysfs'
    ``0000:17:00.0`` both become ``0000:17:00.0`` (lower case, 4-digit domain)."""
    domain, rest = value.strip().lower().split(":", 1)
    return f"{int(domain, 16):04x}:{rest}"


def mig_capable(mode: str) -> bool:
    """nvidia-smi's ``mig.mode.current`` is ``Enabled``/``Disabled`` on MIG-capable GPUs."""
    return mode.strip() not in NOT_AVAILABLE


def uuid_hex(value: str) -> str:
    """A GPU UUID as its 32 hex digits (``GPU-…`` of NVML, CUDA's bare or byte forms)."""
    text = value.strip().lower()
    return re.sub(r"[^0-9a-f]", "", text.removeprefix("gpu-"))


def settings(binary: Path) -> dict[str, object]:
    """What no check may change: compute and MIG modes of every GPU, and the GPU and MIG device
    list (``nvidia-smi -L``, which names every MIG instance)."""
    return {
        "modes": query_gpus(binary, SETTINGS_FIELDS),
        "list": smi(binary, "-L").strip().splitlines(),
    }


# --- claims ----------------------------------------------------------------------------------


def put_claim(server: fakeserver.FakeApiServer, name: str, device: str) -> claims.ClaimRef:
    """A claim for one device of our pool, allocated as the scheduler would have done it."""
    uid = str(uuid.uuid4())
    server.api.put_resource_claim(
        {
            "metadata": {"name": name, "namespace": "gpu-check", "uid": uid},
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "gpu", "exactly": {"deviceClassName": DRIVER, "count": 1}}
                    ]
                }
            },
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}
                        ]
                    }
                }
            },
        }
    )
    return claims.ClaimRef(uid=uid, namespace="gpu-check", name=name)


@dataclasses.dataclass(frozen=True)
class Claimable:
    """The published device a check claims for one GPU."""

    name: str
    full: bool  # the full GPU (else a MIG device of a GPU in MIG mode)


def device_per_gpu(slices: list[dict[str, Any]], gpus: set[str]) -> dict[str, Claimable]:
    """GPU UUID → the published device to claim for it: the full GPU, or for a GPU in MIG mode
    (not published itself) its first MIG device."""
    full: dict[str, Claimable] = {}
    mig: dict[str, Claimable] = {}
    for item in slices:
        for device in item["spec"].get("devices") or []:
            attrs = device.get("attributes") or {}
            kind = attrs.get("type", {}).get("string")
            if kind == "gpu" and attrs.get("uuid", {}).get("string") in gpus:
                full[attrs["uuid"]["string"]] = Claimable(device["name"], full=True)
            elif kind == "mig" and attrs.get("parentUUID", {}).get("string") in gpus:
                mig.setdefault(attrs["parentUUID"]["string"], Claimable(device["name"], full=False))
    return {**mig, **full}
