"""Helpers for tests of shared GPUs: allocation results with shares, and what a node's MPS
daemons look like from the outside (records, processes, compute modes, directories)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

from dra_driver.driver.mps import mpsprocess

from .conftest import DRIVER, NODE, Node, claim_obj


def share(
    device: str,
    *,
    memory: str = "20Gi",
    compute: str = "0",
    request: str = "gpu",
    share_id: str | None = None,
) -> dict[str, Any]:
    """An allocation result for one share of a shared GPU, as the scheduler writes it."""
    return {
        "request": request,
        "driver": DRIVER,
        "pool": NODE,
        "device": device,
        "shareID": share_id or str(uuid.uuid4()),
        "consumedCapacity": {"computeShare": compute, "memory": memory},
    }


def share_claim(name: str, *results: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return claim_obj(name=name, uid=str(uuid.uuid4()), results=list(results), **fields)


def mps_root(node: Node) -> Path:
    return node.settings.plugin_dir / "mps"


def daemon_records(node: Node) -> dict[str, dict[str, Any]]:
    """Daemon id → its record on disk."""
    folder = mps_root(node) / "daemons"
    if not folder.is_dir():
        return {}
    records = [json.loads(p.read_text()) for p in folder.glob("*.json")]
    return {r["id"]: r for r in records}


def daemon_pids(node: Node) -> dict[str, int]:
    """Every live process marked as an MPS daemon of this node: its pipe dir's daemon → pid."""
    root = str(mps_root(node)) + "/"
    found: dict[str, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state == "Z":
            continue
        for var in environ:
            key, _, value = var.decode(errors="replace").partition("=")
            if key == mpsprocess.MARKER and value.startswith(root):
                found[value[len(root) :].split("/")[0]] = int(entry.name)
    return found


def compute_modes(node: Node) -> dict[str, object]:
    """GPU UUID → compute mode, for GPUs the fake control ever changed."""
    path = node.settings.plugin_dir / "fake-gpu-control.json"
    if not path.exists():
        return {}
    return {u: s.get("computeMode") for u, s in json.loads(path.read_text()).items()}


def exclusive_gpus(node: Node) -> set[str]:
    return {u for u, mode in compute_modes(node).items() if mode == "ExclusiveProcess"}


def daemon_dirs(node: Node) -> set[str]:
    root = mps_root(node)
    if not root.is_dir():
        return set()
    return {p.name for p in root.iterdir() if p.is_dir() and p.name not in ("daemons", "locks")}


def kill_daemons(node: Node) -> None:
    """Test clean-up: end every daemon process of this node, whatever state it was left in."""
    for pid in daemon_pids(node).values():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while daemon_pids(node) and time.monotonic() < deadline:
        time.sleep(0.05)


def uuid_of(node: Node, device: str) -> str:
    found = node.driver.state.devices.get(device)
    assert found is not None
    return found.uuid


def spec_env(node: Node, claim_uid: str, device: str) -> dict[str, str]:
    """The env a container gets from ``device`` of the claim's CDI spec (common + device)."""
    spec = json.loads((node.cdi_root / f"k8s.gpu.nvidia.com-claim_{claim_uid}.json").read_text())
    env = list(spec["containerEdits"].get("env", []))
    for dev in spec["devices"]:
        if dev["name"].endswith(f"-{device}"):
            env += dev["containerEdits"].get("env", [])
    return dict(item.split("=", 1) for item in env)


def spec_mounts(node: Node, claim_uid: str, device: str) -> dict[str, str]:
    """containerPath → hostPath of the device's own mounts (not its KEP-5304 metadata file)."""
    spec = json.loads((node.cdi_root / f"k8s.gpu.nvidia.com-claim_{claim_uid}.json").read_text())
    for dev in spec["devices"]:
        if dev["name"].endswith(f"-{device}"):
            return {
                m["containerPath"]: m["hostPath"]
                for m in dev["containerEdits"].get("mounts", [])
                if not m["containerPath"].startswith(
                    "/var/run/kubernetes.io/dra-device-attributes/"
                )
            }
    return {}
