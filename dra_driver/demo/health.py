"""The health demo scene: a GPU fails, is isolated by a taint, and comes back.

Steps, on a DGX H100 fake node: the agent publishes clean slices and a one-GPU claim would land on
gpu-0 → ``dra-driver fake-event --gpu 0 --xid 79`` over the agent's health socket (the agent's
NVML watcher receives it as a real XID event) → the slice on the API server carries the taint,
with a new pool generation → ``discover`` and the kubelet's health stream show gpu-0 Unhealthy →
the one-GPU claim lands elsewhere, an eight-GPU claim no longer fits (and says why), a claim
allocated to gpu-0 earlier is refused at prepare, one that tolerates the taint is accepted →
``fake-event --recovered``: after the hold time the taint is gone and the eight-GPU claim fits.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

from dra_driver import examples, healthcontrol
from dra_driver.allocation import allocator, simulator
from dra_driver.demo import report as reporting
from dra_driver.demo import rig as rigging
from dra_driver.devices import fake
from dra_driver.driver import claims
from dra_driver.testing import kubeletsim as sim

PROFILE = "dgx-h100"
HOLD_S = 3.0
TOLERATION = {"key": "gpu.nvidia.com/xid", "operator": "Exists"}
Report = reporting.Report


def scene(
    report: Report, *, base: Path, backend: fake.FakeBackend, node_name: str, driver_name: str
) -> None:
    """Fail a GPU, watch it being isolated, recover it."""
    extra = ["--health-min-hold", str(HOLD_S), "--health-poll-interval", "1"]
    with rigging.node(
        report,
        base=base,
        backend=fake.FakeBackend.from_name(PROFILE),
        node_name=node_name,
        driver_name=driver_name,
        extra=extra,
    ) as rig:
        _story(report, rig)


def _story(report: Report, rig: rigging.Rig) -> None:
    report.section("A healthy node: slices without taints")
    before = rig.slices()
    generation = _generation(before)
    report.check(not _tainted(before), f"no device is tainted (pool generation {generation})")
    one = _claim(rig, "one-gpu", examples.load("one-gpu"))
    placed = _allocate(rig, one, before)
    report.check(placed == ["gpu-0"], f"a one-GPU claim would get {placed}")
    early = _allocated_claim(rig, "early", "gpu-0")  # allocated before the failure
    tolerant = _allocated_claim(rig, "tolerant", "gpu-0", tolerations=[TOLERATION])

    report.section("GPU 0 falls off the bus: dra-driver fake-event --gpu 0 --xid 79")
    began = time.monotonic()
    _fake_event(report, rig, "--gpu", "0", "--xid", "79")
    sent = time.monotonic()
    after = _wait(lambda: _tainted(rig.slices()) or None)
    done = time.monotonic()
    report.check(
        bool(after),
        f"taint in the API server {(done - sent) * 1000:.0f} ms after the command returned "
        f"({done - began:.2f} s with the command's own start-up)",
    )
    slices = rig.slices()
    gpu0 = _devices(slices)["gpu-0"]
    report.block(yaml.safe_dump({"name": "gpu-0", "taints": gpu0.get("taints")}, sort_keys=False))
    ranks = gpu0["attributes"].get("setRanks")
    report.check(
        _generation(slices) == generation + 1 and _tainted(slices) == {"gpu-0"},
        f"pool generation {generation} → {_generation(slices)}; tainted: gpu-0 alone",
    )
    report.check(
        ranks == {"int": 0},
        "gpu-0 left every ranked set (setRanks = 0): dra-driver claim no longer picks it",
    )
    report.say("\n  dra-driver discover --kubelet-plugins-dir ... (the agent's view):")
    table = _discover(rig)
    report.block("\n".join(line for line in table.splitlines()[:9]), indent="    ")
    report.check("Unhealthy (xid=79)" in table, "discover shows gpu-0 Unhealthy (xid=79)")
    _health_stream(report, rig)

    report.section("Scheduling and preparing around the failed GPU")
    placed = _allocate(rig, one, slices)
    report.check(placed not in (None, ["gpu-0"]), f"the one-GPU claim now lands on {placed}")
    eight = _claim(rig, "eight-gpus", [_eight_gpus()])
    outcome = allocator.allocate(
        eight,
        slices=slices,
        classes=simulator.builtin_classes(driver_name=rig.driver_name),
        node_name=rig.node_name,
    )
    report.check(outcome.allocation is None, "an eight-GPU claim no longer fits:")
    report.block(simulator.render(outcome, node_name=rig.node_name), indent="     ")
    kubelet = sim.KubeletSim(rig.plugin.registry_dir)
    try:
        kubelet.register(rig.driver_name)
        answer = kubelet.prepare([early, tolerant]).claims
        report.check(
            "tainted gpu.nvidia.com/xid=79:NoExecute" in answer[early.uid].error,
            f"a claim allocated to gpu-0 before the failure is refused: {answer[early.uid].error}",
        )
        report.check(
            not answer[tolerant.uid].error,
            "a claim whose request tolerates gpu.nvidia.com/xid is prepared",
        )
        kubelet.unprepare([tolerant])
    finally:
        kubelet.close()

    report.section("GPU 0 is fixed: dra-driver fake-event --gpu 0 --recovered")
    _fake_event(report, rig, "--gpu", "0", "--recovered")
    healed = _wait(lambda: not _tainted(rig.slices()) or None)
    slices = rig.slices()
    report.check(
        bool(healed), f"taint removed; pool generation {_generation(slices)}; gpu-0 Healthy"
    )
    fits = allocator.allocate(
        eight,
        slices=slices,
        classes=simulator.builtin_classes(driver_name=rig.driver_name),
        node_name=rig.node_name,
    )
    report.check(fits.allocation is not None, "the eight-GPU claim fits again")
    _flap(report, rig)


def _flap(report: Report, rig: rigging.Rig) -> None:
    hold = HOLD_S * 2  # the hold doubles with each recovery of the GPU
    report.section(f"GPU 0 flaps: XID 79 again, recovered at once (held {hold:g}s)")
    _fake_event(report, rig, "--gpu", "0", "--xid", "79")
    _wait(lambda: _tainted(rig.slices()) or None)
    _fake_event(report, rig, "--gpu", "0", "--recovered")
    status = _status(rig)["gpu-0"]
    report.check(
        status["health"] == "Unhealthy" and "gpu-0" in _tainted(rig.slices()),
        f"held: gpu-0 stays Unhealthy and tainted, {status['holdLeftSeconds']}s of the hold left",
    )
    began = time.monotonic()
    healed = _wait(lambda: not _tainted(rig.slices()) or None, timeout_s=30 + hold)
    report.check(bool(healed), f"the taint went {time.monotonic() - began:.1f}s later")
    doc = json.loads(_discover(rig, "-o", "json"))
    recoveries = doc["gpus"][0]["health"].get("recoveries")
    report.check(recoveries == 2, f"discover: gpu-0 Healthy, recoveries {recoveries}")


def _health_stream(report: Report, rig: rigging.Rig) -> None:
    kubelet = sim.KubeletSim(rig.plugin.registry_dir)
    try:
        kubelet.register(rig.driver_name)
        stream = kubelet.watch_health("v1alpha1.DRAResourceHealth")
        first = next(stream)
        sick = [(d.device.device_name, d.message) for d in first.devices if d.health == 2]
        report.check(
            [name for name, _ in sick] == ["gpu-0"],
            f"the kubelet's health stream (v1alpha1, what 1.36 kubelets read) says: {sick}",
        )
        stream.cancel()
    finally:
        kubelet.close()


def _fake_event(report: Report, rig: rigging.Rig, *args: str) -> None:
    out = _run(rig, "fake-event", *args, "--kubelet-plugins-dir", str(rig.plugin.plugins_dir))
    report.block(f"$ dra-driver fake-event {' '.join(args)} --kubelet-plugins-dir ...\n{out}")


def _run(rig: rigging.Rig, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "dra_driver", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.stdout + done.stderr


def _status(rig: rigging.Rig) -> dict[str, dict[str, Any]]:
    """The agent's health view over its health socket, by device name."""
    answer = healthcontrol.request(rig.plugin.settings.health_socket, {"op": "status"})
    return {d["device"]: d for d in answer["devices"]}


def _discover(rig: rigging.Rig, *args: str) -> str:
    where = str(rig.plugin.plugins_dir)
    return _run(rig, "discover", "--fake", PROFILE, "--kubelet-plugins-dir", where, *args)


def _wait(probe: Any, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.02)
    return None


def _devices(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}


def _tainted(slices: list[dict[str, Any]]) -> set[str]:
    return {name for name, d in _devices(slices).items() if d.get("taints")}


def _generation(slices: list[dict[str, Any]]) -> int:
    return int(slices[0]["spec"]["pool"]["generation"]) if slices else 0


def _claim(rig: rigging.Rig, name: str, docs: list[dict[str, Any]]) -> dict[str, Any]:
    return rig.api.create_resource_claim(rigging.claim_from(docs, name=name))


def _allocate(
    rig: rigging.Rig, obj: dict[str, Any], slices: list[dict[str, Any]]
) -> list[str] | None:
    outcome = allocator.allocate(
        obj,
        slices=slices,
        classes=simulator.builtin_classes(driver_name=rig.driver_name),
        node_name=rig.node_name,
    )
    if outcome.allocation is None:
        return None
    return [r["device"] for r in outcome.allocation["devices"]["results"]]


def _eight_gpus() -> dict[str, Any]:
    return {
        "kind": "ResourceClaim",
        "spec": {
            "devices": {
                "requests": [
                    {"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 8}}
                ]
            }
        },
    }


def _allocated_claim(
    rig: rigging.Rig, name: str, device: str, tolerations: list[dict[str, Any]] | None = None
) -> claims.ClaimRef:
    """A claim the scheduler allocated to ``device`` (before it failed)."""
    request: dict[str, Any] = {"deviceClassName": "gpu.nvidia.com"}
    result: dict[str, Any] = {
        "request": "gpu",
        "driver": rig.driver_name,
        "pool": rig.node_name,
        "device": device,
    }
    if tolerations:
        request["tolerations"] = tolerations
        result["tolerations"] = tolerations
    created = rig.api.create_resource_claim(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": rigging.NAMESPACE},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}},
        }
    )
    status = {
        "allocation": {"devices": {"results": [result]}},
        "reservedFor": [{"resource": "pods", "name": name, "uid": str(uuid.uuid4())}],
    }
    rig.api.put_resource_claim({**created, "status": status})
    meta = created["metadata"]
    return claims.ClaimRef(uid=meta["uid"], namespace=meta["namespace"], name=meta["name"])
