"""The sharing scene: three pods share one H100 (20Gi, 30Gi, 30Gi), a fourth does not fit.

Steps: the agent publishes the node's only GPU as shareable (``--shareable H100``: consumable
``memory`` and ``computeShare`` capacity) → four claims ask for shares and the allocator, playing
kube-scheduler, hands out three (capacity left per GPU, a ``shareID`` each) and explains why the
fourth does not fit → the kubelet prepares the three: one MPS control daemon serves the GPU, in
a Pod of its own that the agent creates through the API server (``--mps-daemon-image``; the
test kit's :class:`~dra_driver.testing.podrunner.PodKubelet` plays the kubelet that runs it),
the GPU's compute mode switched to ExclusiveProcess, and each share's CDI spec carries its own
limits → the pods finish one by one; the daemon's Pod is deleted with the last share and the
GPU is put back.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import yaml

from dra_driver.allocation import allocator, capacity, simulator
from dra_driver.demo import report as reporting
from dra_driver.demo import rig as rigging
from dra_driver.devices import fake
from dra_driver.devices.fake import profiles
from dra_driver.driver import claims
from dra_driver.driver.mps import mpspodspec
from dra_driver.kube.objects import PODS
from dra_driver.testing import kubeletsim as sim
from dra_driver.testing.podrunner import PodKubelet

ONE_H100 = """\
name: one-h100
description: one NVIDIA H100 80GB HBM3 (PCIe slot, no NVLink)
driverVersion: "580.95.05"
cudaDriverVersion: "13.0"
defaults: {productName: NVIDIA H100 80GB HBM3, brand: Nvidia, architecture: Hopper,
           cudaComputeCapability: "9.0", memory: 80Gi}
gpus:
  - {pciBusId: "0000:18:00.0", pcieRoot: pci0000:15, numaNode: 0}
"""
# (pod, memory, compute share in percent); the last one does not fit any more.
SHARES = (("share-a", "20Gi", "25"), ("share-b", "30Gi", "35"), ("share-c", "30Gi", "40"))
LATE = ("share-d", "20Gi", "0")
NAMESPACE = rigging.NAMESPACE
DRIVER_NAMESPACE = "dra-driver"  # the agent's own namespace: its daemon Pods go there
DAEMON_IMAGE = "dra-driver:demo"
Report = reporting.Report


def scene(
    report: Report, *, base: Path, backend: fake.FakeBackend, node_name: str, driver_name: str
) -> None:
    """Share one H100 among three pods through consumable capacity and MPS."""
    del backend  # this story needs a node with one H100
    one = fake.FakeBackend(profiles.parse(ONE_H100, source="sharing scene"))
    report.section("A node with one H100, published as shareable (--shareable H100)")
    with rigging.node(
        report,
        base=base,
        backend=one,
        node_name=node_name,
        driver_name=driver_name,
        extra=(
            "--shareable",
            "H100",
            "--mps-daemon-image",
            DAEMON_IMAGE,
            "--pod-namespace",
            DRIVER_NAMESPACE,
        ),
    ) as rig:
        slices = rig.slices()
        (gpu,) = [d for s in slices for d in s["spec"].get("devices", [])]
        report.block(yaml.safe_dump({"name": gpu["name"], "capacity": gpu["capacity"]}))
        report.check(
            gpu.get("allowMultipleAllocations") is True,
            f"{gpu['name']} is published with allowMultipleAllocations: true",
        )
        allocated = _allocate(report, rig, slices)
        rig.api.put_namespace(DRIVER_NAMESPACE)
        kubelet = sim.KubeletSim(rig.plugin.registry_dir)
        pods = PodKubelet(rig.api.objects, node_name=node_name, base=base / "pods").start()
        try:
            kubelet.register(driver_name)
            _prepare(report, rig, kubelet, allocated, pods)
            _finish(report, rig, kubelet, allocated, pods)
        finally:
            kubelet.close()
            pods.stop(kill=True)


def _claim(name: str, memory: str, compute: str) -> dict[str, Any]:
    capacity_requests = {"memory": memory, "computeShare": compute}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "gpu.nvidia.com",
                            "capacity": {"requests": capacity_requests},
                        },
                    }
                ]
            }
        },
    }


def _allocate(
    report: Report, rig: rigging.Rig, slices: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    report.section("Four pods ask for shares: 20Gi, 30Gi, 30Gi, then 20Gi (the scheduler's part)")
    classes = simulator.builtin_classes(driver_name=rig.driver_name)
    ledger = capacity.Ledger()
    done: list[dict[str, Any]] = []
    for name, memory, compute in (*SHARES, LATE):
        created = rig.api.create_resource_claim(_claim(name, memory, compute))
        outcome = allocator.allocate(
            created, slices=slices, classes=classes, node_name=rig.node_name, consumed=ledger
        )
        report.say(f"\n  -- pod {name}: capacity.requests memory {memory}, computeShare {compute}")
        if outcome.allocation is None:
            report.block(simulator.render(outcome, node_name=rig.node_name), indent="     ")
            report.check(
                any("0 of memory left, 20Gi requested" in line for line in outcome.explanation),
                f"{name} does not fit: the GPU's memory is all handed out",
            )
            continue
        (result,) = outcome.allocation["devices"]["results"]
        report.say(
            f"     allocated: {result['device']}, shareID {result['shareID']}, "
            f"consumedCapacity {result['consumedCapacity']}"
        )
        for device, used in capacity.Ledger.from_allocated(
            [outcome.allocation["devices"]]
        ).used.items():
            ledger.add(device, used)
        status = {
            "allocation": outcome.allocation,
            "reservedFor": [{"resource": "pods", "name": name, "uid": str(uuid.uuid4())}],
        }
        done.append(rig.api.put_resource_claim({**created, "status": status}))
    report.check(
        len(done) == len(SHARES)
        and len({c["status"]["allocation"]["devices"]["results"][0]["shareID"] for c in done})
        == len(SHARES),
        "three shares of one GPU, each with its own shareID",
    )
    return done


def _ref(obj: dict[str, Any]) -> claims.ClaimRef:
    meta = obj["metadata"]
    return claims.ClaimRef(uid=meta["uid"], namespace=meta["namespace"], name=meta["name"])


def _daemon(rig: rigging.Rig) -> dict[str, Any] | None:
    path = rig.plugin.plugins_dir / rig.driver_name / "mps" / "daemons" / "gpu-0.json"
    return json.loads(path.read_text()) if path.exists() else None


def _daemon_pods(rig: rigging.Rig) -> list[dict[str, Any]]:
    return rig.api.objects.all(PODS)


def _compute_mode(rig: rigging.Rig) -> str:
    path = rig.plugin.plugins_dir / rig.driver_name / "fake-gpu-control.json"
    modes = json.loads(path.read_text()) if path.exists() else {}
    return ", ".join(sorted({str(s.get("computeMode")) for s in modes.values()})) or "Default"


def _prepare(
    report: Report,
    rig: rigging.Rig,
    kubelet: sim.KubeletSim,
    allocated: list[dict[str, Any]],
    pods: PodKubelet,
) -> None:
    report.section("Kubelet prepares the three shares: one MPS daemon Pod, each share's limits")
    uids = set()
    for obj in allocated:
        ref = _ref(obj)
        answer = kubelet.prepare([ref]).claims[ref.uid]
        if not report.check(
            not answer.error,
            f"{ref.name}: prepared" + (f" — {answer.error}" if answer.error else ""),
        ):
            continue
        (device,) = answer.devices
        cdi_ids = list(device.cdi_device_ids)
        report.say(f"      {device.device_name}: share_id {device.share_id}, CDI {cdi_ids}")
        uids |= {p["metadata"]["uid"] for p in _daemon_pods(rig)}
        spec_path = rig.spec_file(ref.uid)
        if spec_path is None:
            report.check(False, f"{ref.name}: CDI spec written")
            continue
        spec = json.loads(spec_path.read_text())
        edits = spec["devices"][0]["containerEdits"]
        report.say("      the container's MPS environment and mounts (CDI):")
        report.block(
            "\n".join(e for e in edits.get("env", []) if e.startswith("CUDA_MPS"))
            + "\n"
            + "\n".join(
                f"mount {m['hostPath']} -> {m['containerPath']}" for m in edits.get("mounts", [])
            ),
            indent="        ",
        )
    daemon = _daemon(rig)
    found = _daemon_pods(rig)
    name = mpspodspec.pod_name(rig.driver_name, rig.node_name, "gpu-0")
    running = pods.running().get(name)
    report.check(
        daemon is not None
        and daemon["state"] == "Running"
        and len(uids) == 1
        and [p["metadata"]["name"] for p in found] == [name]
        and running is not None,
        f"one MPS control daemon serves gpu-0 for all three: Pod {DRIVER_NAMESPACE}/{name} "
        f"(pid {running.pid if running else None} under the test kubelet)",
    )
    if found:
        pod = found[0]
        (container,) = pod["spec"]["containers"]
        owner = pod["metadata"]["ownerReferences"][0]
        report.say("      the daemon's Pod, as the agent created it (abridged):")
        report.block(
            yaml.safe_dump(
                {
                    "metadata": {
                        "name": pod["metadata"]["name"],
                        "namespace": pod["metadata"]["namespace"],
                        "labels": pod["metadata"]["labels"],
                        "ownerReferences": [f"{owner['kind']}/{owner['name']}"],
                    },
                    "spec": {
                        "nodeName": pod["spec"]["nodeName"],
                        "restartPolicy": pod["spec"]["restartPolicy"],
                        "image": container["image"],
                        "command": container["command"][-3:],
                        "readinessProbe": container["readinessProbe"]["exec"]["command"][2],
                        "volumeMounts": [m["mountPath"] for m in container["volumeMounts"]],
                    },
                    "status": {
                        "phase": pod["status"]["phase"],
                        "ready": mpspodspec.state(pod).ready,
                    },
                },
                sort_keys=False,
                width=100,
            ),
            indent="        ",
        )
        report.check(
            pod["spec"]["nodeName"] == rig.node_name
            and owner["kind"] == "Node"
            and container["image"] == DAEMON_IMAGE
            and mpspodspec.state(pod).ready,
            f"the daemon Pod is pinned to {rig.node_name}, runs {DAEMON_IMAGE} and is Ready; it "
            "is owned by the Node, so upgrades of the agent leave it (and the shares) running",
        )
    report.check(
        _compute_mode(rig) == "ExclusiveProcess", "gpu-0 runs in compute mode ExclusiveProcess"
    )


def _finish(
    report: Report,
    rig: rigging.Rig,
    kubelet: sim.KubeletSim,
    allocated: list[dict[str, Any]],
    pods: PodKubelet,
) -> None:
    report.section("The pods finish one by one: the daemon's Pod goes with the last share")
    for i, obj in enumerate(allocated):
        ref = _ref(obj)
        error = kubelet.unprepare([ref]).claims[ref.uid].error
        last = i == len(allocated) - 1
        found = _daemon_pods(rig)
        state = "gone" if not found else f"running (Pod {found[0]['metadata']['name']})"
        report.check(
            not error and (not found and _daemon(rig) is None) == last,
            f"{ref.name}: unprepared; MPS daemon {state}" + (f" — {error}" if error else ""),
        )
    report.check(
        pods.wait(lambda: pods.running() == {}, timeout_s=15),
        "the test kubelet ended the deleted Pod's daemon",
    )
    report.check(_compute_mode(rig) == "Default", "gpu-0 back in compute mode Default")
