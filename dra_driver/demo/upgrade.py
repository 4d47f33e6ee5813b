"""The upgrade demo scene: the NVIDIA driver is upgraded under a running claim, no drain; then a
GPU is hot-added and used (docs/lifecycle.md).

Steps, on a DGX H100 fake node:

1. A claim is prepared on gpu-0 (its container "runs").
2. ``dra-driver fake-event --driver-unload`` makes the driver go away. Every GPU in the
   published slice is tainted ``gpu.nvidia.com/driver-unavailable:NoSchedule``, and ``/readyz``
   says why. The running claim's CDI spec is untouched. A new one-GPU claim fits nowhere, and
   one the scheduler had allocated before gets the one retryable error at prepare.
3. ``fake-event --driver-load --driver-version 590.10.01`` brings the driver back upgraded. The
   slice carries the new ``driverVersion``, without taints, in one write. The waiting claim is
   prepared, and the running one is still prepared as it was.
4. ``fake-event --gpu-add`` hot-adds a GPU. It is published, and a claim on it is prepared.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from dra_driver import driverwatch, examples
from dra_driver.allocation import allocator, simulator
from dra_driver.demo import report as reporting
from dra_driver.demo import rig as rigging
from dra_driver.devices import fake
from dra_driver.driver import claims
from dra_driver.testing import kubeletsim as sim

PROFILE = "dgx-h100"
NEW_VERSION = "590.10.01"
TAINT = "gpu.nvidia.com/driver-unavailable"
Report = reporting.Report


def scene(
    report: Report, *, base: Path, backend: fake.FakeBackend, node_name: str, driver_name: str
) -> None:
    """Upgrade the driver under a running claim, then hot-add a GPU and use it."""
    with rigging.node(
        report,
        base=base,
        backend=fake.FakeBackend.from_name(PROFILE),
        node_name=node_name,
        driver_name=driver_name,
        extra=["--health-min-hold", "0"],
    ) as rig:
        kubelet = sim.KubeletSim(rig.plugin.registry_dir)
        try:
            kubelet.register(driver_name)
            _story(report, rig, kubelet)
        finally:
            kubelet.close()


def _story(report: Report, rig: rigging.Rig, kubelet: sim.KubeletSim) -> None:
    report.section("A claim runs on gpu-0")
    running = _allocated_claim(rig, "training", "gpu-0")
    error = kubelet.prepare([running]).claims[running.uid].error
    report.check(error == "", "training is prepared on gpu-0 (its container runs)")
    spec = rig.spec_file(running.uid)
    spec_before = spec.read_bytes() if spec is not None else b""
    old = _gpus(rig.slices())["gpu-0"]["attributes"]["driverVersion"]["version"]
    report.say(f"  driver version published: {old}")

    report.section("The driver is upgraded: dra-driver fake-event --driver-unload")
    waiting = _allocated_claim(rig, "waiting", "gpu-1")  # the scheduler placed it just before
    _fake_event(report, rig, "--driver-unload")
    began = time.monotonic()
    tainted = _wait(lambda: _all_tainted(rig.slices()))
    report.check(
        tainted,
        f"every GPU carries {TAINT}=not-loaded:NoSchedule after "
        f"{time.monotonic() - began:.2f} s (never NoExecute: nothing is evicted)",
    )
    status, body = rig.plugin.http_get("/readyz")
    reason = json.loads(body).get("reasons", {}).get("nvidia_driver", "")
    report.check(status == 503 and "not loaded" in reason, f"/readyz {status}: {reason[:90]}")
    spec = rig.spec_file(running.uid)
    report.check(
        spec is not None and spec.read_bytes() == spec_before,
        "training's CDI spec is untouched: its container keeps its device nodes",
    )
    one = rig.api.create_resource_claim(
        rigging.claim_from(examples.load("one-gpu"), name="new-one")
    )
    report.check(
        _allocate(rig, one, rig.slices()) is None,
        "a new one-GPU claim fits nowhere while the driver is away",
    )
    error = kubelet.prepare([waiting]).claims[waiting.uid].error
    report.check(driverwatch.DRIVER_GONE_MESSAGE in error, f"waiting's prepare is refused: {error}")

    report.section(
        f"The new driver is loaded: fake-event --driver-load --driver-version {NEW_VERSION}"
    )
    writes = rig.api.writes
    _fake_event(report, rig, "--driver-load", "--driver-version", NEW_VERSION)
    began = time.monotonic()
    current = _wait(lambda: _current(rig.slices(), "590.10.1"))
    report.check(
        current,
        f"driverVersion {old} -> 590.10.1, taints gone, after {time.monotonic() - began:.2f} s",
    )
    time.sleep(0.5)
    report.check(
        rig.api.writes - writes == len(rig.slices()),
        f"{rig.api.writes - writes} ResourceSlice write(s) for {len(rig.slices())} slice(s)",
    )
    error = kubelet.prepare([waiting]).claims[waiting.uid].error
    report.check(error == "", "the kubelet's retry prepares waiting on gpu-1")
    spec = rig.spec_file(running.uid)
    report.check(
        spec is not None and spec.read_bytes() == spec_before,
        "training is still prepared, its CDI spec byte for byte as before",
    )

    report.section("A GPU is hot-added: fake-event --gpu-add")
    _fake_event(report, rig, "--gpu-add")
    added = _wait(lambda: "gpu-8" in _gpus(rig.slices()))
    report.check(added, "gpu-8 is published")
    hot = _allocated_claim(rig, "hot", "gpu-8")
    error = kubelet.prepare([hot]).claims[hot.uid].error
    report.check(error == "", "a claim on gpu-8 is prepared")
    for ref in (running, waiting, hot):
        kubelet.unprepare([ref])


def _fake_event(report: Report, rig: rigging.Rig, *args: str) -> None:
    where = ["--kubelet-plugins-dir", str(rig.plugin.plugins_dir)]
    done = subprocess.run(
        [sys.executable, "-m", "dra_driver", "fake-event", *args, *where],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    report.block(f"$ dra-driver fake-event {' '.join(args)}\n{done.stdout}{done.stderr}")


def _wait(probe: Any, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if probe():
            return True
        time.sleep(0.02)
    return False


def _gpus(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    found = (d for s in slices for d in s["spec"].get("devices", []))
    return {d["name"]: d for d in found if d["name"][4:].isdigit()}


def _all_tainted(slices: list[dict[str, Any]]) -> bool:
    gpus = _gpus(slices)
    return bool(gpus) and all(
        any(t["key"] == TAINT for t in d.get("taints", ())) for d in gpus.values()
    )


def _current(slices: list[dict[str, Any]], version: str) -> bool:
    gpus = _gpus(slices)
    return bool(gpus) and all(
        not d.get("taints") and d["attributes"]["driverVersion"]["version"] == version
        for d in gpus.values()
    )


def _allocate(rig: rigging.Rig, obj: dict[str, Any], slices: list[dict[str, Any]]) -> Any:
    outcome = allocator.allocate(
        obj,
        slices=slices,
        classes=simulator.builtin_classes(driver_name=rig.driver_name),
        node_name=rig.node_name,
    )
    return outcome.allocation


def _allocated_claim(rig: rigging.Rig, name: str, device: str) -> claims.ClaimRef:
    """A claim the scheduler allocated to ``device``."""
    created = rig.api.create_resource_claim(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": rigging.NAMESPACE},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]
                }
            },
        }
    )
    result = {"request": "gpu", "driver": rig.driver_name, "pool": rig.node_name, "device": device}
    status = {
        "allocation": {"devices": {"results": [result]}},
        "reservedFor": [{"resource": "pods", "name": name, "uid": str(uuid.uuid4())}],
    }
    rig.api.put_resource_claim({**created, "status": status})
    meta = created["metadata"]
    return claims.ClaimRef(uid=meta["uid"], namespace=meta["namespace"], name=meta["name"])
