"""Driver upgrades and GPU hot-plug on a running agent (docs/lifecycle.md): the real agent on the
fake backend, ``dra-driver fake-event`` over its health socket, slices in the fake API server on
loopback, prepares over the real DRA socket.

The bounds asserted are the documented ones (5 s); the measured latencies are recorded
(``record_property``) and printed by ``benchmarks/lifecycle.py``.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.devices.fake import FakeBackend, profiles
from dra_driver.testing.fakeapi import fakeserver
from dra_driver.testing.kubeletsim import KubeletSim, PluginProcess

from .claimkit import put_claim

Obj = dict[str, Any]
BOUND_S = 5.0
TAINT = "gpu.nvidia.com/driver-unavailable"
GONE = "the NVIDIA driver is not loaded on this node (upgrade in progress?)"


class Node:
    def __init__(self, proc: PluginProcess, server: fakeserver.FakeApiServer) -> None:
        self.proc, self.server = proc, server
        self.kubelet = KubeletSim(proc.registry_dir)
        self.kubelet.register("gpu.nvidia.com")

    def slices(self) -> list[Obj]:
        found, _ = self.server.api.list_resource_slices(driver="gpu.nvidia.com", node_name="n1")
        return sorted(found, key=lambda s: s["metadata"]["name"])

    def devices(self) -> dict[str, Obj]:
        return {d["name"]: d for s in self.slices() for d in s["spec"].get("devices", [])}

    def gpus(self) -> dict[str, Obj]:
        found = self.devices().items()
        return {n: d for n, d in found if n.startswith("gpu-") and n[4:].isdigit()}

    def whole_pool(self) -> bool:
        found = self.slices()
        pools = {
            (s["spec"]["pool"]["resourceSliceCount"], s["spec"]["pool"]["generation"])
            for s in found
        }
        return len(pools) == 1 and next(iter(pools))[0] == len(found)

    def unschedulable(self) -> bool:
        """Every GPU device carries the driver taint (or none is published)."""
        gpus = self.gpus()
        return self.whole_pool() and all(
            any(t["key"] == TAINT for t in d.get("taints", [])) for d in gpus.values()
        )

    def schedulable(self, version: str) -> bool:
        gpus = self.gpus()
        return (
            self.whole_pool()
            and bool(gpus)
            and all(
                not d.get("taints") and d["attributes"]["driverVersion"]["version"] == version
                for d in gpus.values()
            )
        )

    def fake_event(self, *args: str) -> str:
        where = str(self.proc.plugins_dir)
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "dra_driver",
                "fake-event",
                *args,
                "--kubelet-plugins-dir",
                where,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def wait(self, what: Callable[[], Any], timeout_s: float = 30.0) -> float:
        began = time.monotonic()
        while not what():
            assert time.monotonic() - began < timeout_s, f"not within {timeout_s}s: {what}"
            time.sleep(0.005)
        return time.monotonic() - began

    def checkpoint(self) -> dict[str, bytes]:
        root = self.proc.plugins_dir / "gpu.nvidia.com"
        return {
            p.name: p.read_bytes()
            for p in sorted(root.rglob("*.json"))
            if "claim" in p.name or p.parent.name == "claims"
        }

    def cdi(self) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in sorted(self.proc.cdi_root.glob("*"))}

    def event_on(self, uid: str) -> Obj:
        """The one Warning GpuVanished Event regarding the claim ``uid`` (waited for)."""
        selector = f"regarding.uid={uid},reason=GpuVanished"
        self.wait(lambda: self.server.api.list_events("team", field_selector=selector))
        (event,) = self.server.api.list_events("team", field_selector=selector)
        assert event["type"] == "Warning" and event["reportingController"] == "gpu.nvidia.com"
        assert event["regarding"]["kind"] == "ResourceClaim"
        return event

    def readyz(self) -> tuple[int, Obj]:
        status, body = self.proc.http_get("/readyz")
        return status, json.loads(body)

    def metric(self, name: str) -> float:
        _, body = self.proc.http_get("/metrics")
        for line in body.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError(f"no metric {name}")


def node_label(node: Node) -> str | None:
    labels = node.server.api.get_node("n1")["metadata"].get("labels", {})
    return labels.get("nvidia.com/cuda.driver-version.full")


def start(base: Path, server: fakeserver.FakeApiServer, *flags: str) -> Node:
    server.api.put_node("n1", uid=str(uuid.uuid4()))
    proc = PluginProcess(
        base=base,
        kubeconfig=server.write_kubeconfig(base / "kubeconfig"),
        publish=True,
        extra=("--health-min-hold", "0", *flags),
    )
    proc.start()
    proc.wait_ready()
    node = Node(proc, server)
    node.wait(node.whole_pool)
    return node


@pytest.fixture
def node(short_dir: Path, apiserver: fakeserver.FakeApiServer) -> Iterator[Node]:
    n = start(short_dir, apiserver)
    yield n
    n.kubelet.close()
    n.proc.kill()


def test_driver_upgrade_without_drain(
    node: Node, record_property: Callable[[str, object], None]
) -> None:
    running = put_claim(node.server, "running", ["gpu-0"])
    assert node.kubelet.prepare([running]).claims[running.uid].error == ""
    checkpoint, cdi = node.checkpoint(), node.cdi()
    assert checkpoint and cdi
    old = node.gpus()["gpu-0"]["attributes"]["driverVersion"]["version"]

    # The driver goes away: every GPU unschedulable within the bound, the agent still serves.
    began = time.monotonic()
    node.fake_event("--driver-unload")
    took = node.wait(node.unschedulable, timeout_s=BOUND_S)
    record_property("seconds_to_unschedulable", round(time.monotonic() - began, 3))
    assert took < BOUND_S
    status, ready = node.readyz()
    assert status == 503 and ready["conditions"]["nvidia_driver"] is False
    assert GONE in ready["reasons"]["nvidia_driver"]
    assert node.metric("dra_driver_nvidia_driver_available") == 0

    # A prepare for a new claim: one retryable error; the prepared claim still answers.
    waiting = put_claim(node.server, "waiting", ["gpu-1"])
    answer = node.kubelet.prepare([waiting, running]).claims
    assert GONE in answer[waiting.uid].error and "\n" not in answer[waiting.uid].error
    assert answer[running.uid].error == ""
    assert node.checkpoint() == checkpoint and node.cdi() == cdi

    # The driver returns, upgraded: republished within the bound, one write per slice.
    slices = len(node.slices())
    writes = node.server.api.writes
    began = time.monotonic()
    node.fake_event("--driver-load", "--driver-version", "590.10.01")
    took = node.wait(lambda: node.schedulable("590.10.1"), timeout_s=BOUND_S)
    record_property("seconds_to_republished", round(time.monotonic() - began, 3))
    assert old != "590.10.1"
    assert took < BOUND_S
    node.wait(lambda: node_label(node) == "590.10.01")
    time.sleep(1.0)  # anything more would come now
    assert node.server.api.writes - writes == slices  # one write per (changed) slice
    status, ready = node.readyz()
    assert status == 200 and "reasons" not in ready
    assert node.metric("dra_driver_nvidia_driver_available") == 1

    # Claims: the prepared one still prepared, checkpoint unchanged; the waiting one prepares.
    assert node.checkpoint() == checkpoint and node.cdi() == cdi
    answer = node.kubelet.prepare([waiting, running]).claims
    assert answer[waiting.uid].error == "" and answer[running.uid].error == ""


def test_a_gpu_removed_is_withdrawn_and_its_claim_reported(node: Node) -> None:
    claim = put_claim(node.server, "on-gpu-3", ["gpu-3"])
    assert node.kubelet.prepare([claim]).claims[claim.uid].error == ""
    writes = node.server.api.writes
    out = node.fake_event("--gpu-remove", "3")
    assert "removed from the bus" in out
    node.wait(lambda: "gpu-3" not in node.gpus() and node.whole_pool(), timeout_s=BOUND_S)
    assert sorted(node.gpus()) == [f"gpu-{i}" for i in (0, 1, 2, 4, 5, 6, 7)]
    assert node.server.api.writes > writes
    node.wait(lambda: "\"a prepared claim's GPU vanished" in node.proc.log())

    def reported() -> bool:
        stored = node.server.api.get_resource_claim("team", "on-gpu-3")
        conditions = [c for d in stored["status"].get("devices", []) for c in d["conditions"]]
        return [(c["type"], c["status"], c.get("reason")) for c in conditions] == [
            ("Ready", "False", "GpuVanished")
        ]

    node.wait(reported)  # the status writer's queue: the prepare's Ready=True comes first
    time.sleep(0.5)
    assert reported()  # and is never written after the report
    # A Warning Event on the claim (kubectl get events), written once.
    event = node.event_on(claim.uid)
    assert "gpu-3" in event["note"] and event["reportingInstance"] == "n1"
    # Never re-prepared elsewhere: a new claim for the vanished GPU is refused with why.
    again = put_claim(node.server, "again", ["gpu-3"])
    error = node.kubelet.prepare([again]).claims[again.uid].error
    assert "vanished" in error
    # Its own claim still unprepares cleanly.
    assert node.kubelet.unprepare([claim]).claims[claim.uid].error == ""
    assert len(node.server.api.list_events("team")) == 1


def test_a_gpu_added_is_published_and_preparable(node: Node) -> None:
    out = node.fake_event("--gpu-add")
    assert "added to the bus" in out
    node.wait(lambda: "gpu-8" in node.gpus() and node.whole_pool(), timeout_s=BOUND_S)
    claim = put_claim(node.server, "hot", ["gpu-8"])
    assert node.kubelet.prepare([claim]).claims[claim.uid].error == ""
    assert node.kubelet.unprepare([claim]).claims[claim.uid].error == ""


def test_nothing_changed_means_no_slice_churn(node: Node) -> None:
    node.fake_event("--driver-unload", "uninitialized")
    node.wait(node.unschedulable, timeout_s=BOUND_S)
    version = node.gpus()["gpu-0"]["attributes"]["driverVersion"]["version"]
    before = json.dumps(node.slices())
    node.fake_event("--driver-load")
    node.wait(lambda: node.schedulable(version), timeout_s=BOUND_S)
    node.wait(lambda: '"NVIDIA driver is back' in node.proc.log())
    writes = node.server.api.writes
    time.sleep(1.5)  # rescans find nothing new: nothing is written
    assert node.server.api.writes == writes
    assert before != json.dumps(node.slices())  # (the taints are gone)


def test_a_restart_without_a_claims_gpu_cleans_it_up_and_reports_it(
    short_dir: Path, apiserver: fakeserver.FakeApiServer
) -> None:
    node = start(short_dir, apiserver)
    try:
        removed = put_claim(node.server, "removed", ["gpu-3"])
        replaced = put_claim(node.server, "replaced", ["gpu-5"])
        kept = put_claim(node.server, "kept", ["gpu-6"])
        answer = node.kubelet.prepare([removed, replaced, kept]).claims
        assert {a.error for a in answer.values()} == {""}
        assert len(list(node.proc.cdi_root.glob("*.json"))) == 3
    finally:
        node.kubelet.close()
        node.proc.kill()  # SIGKILL: the records stay on disk
    # The node comes back with GPU 3 gone and GPU 5's card replaced (same slot and minor).
    fake = FakeBackend.from_name("dgx-h100").nvml
    fake.remove_gpu(3)
    gpus = list(fake.profile.gpus)
    slot = next(i for i, g in enumerate(gpus) if g.minor == 5)
    gpus[slot] = dataclasses.replace(gpus[slot], uuid="GPU-0e5e0e5e-0000-4000-8000-000000000005")
    path = short_dir / "after.yaml"
    path.write_text(yaml.safe_dump(profiles.dump(dataclasses.replace(fake.profile, gpus=gpus))))
    proc = PluginProcess(
        base=short_dir,
        kubeconfig=short_dir / "kubeconfig",
        publish=True,
        fake_file=path,
        extra=("--health-min-hold", "0"),
    )
    proc.start()
    try:
        proc.wait_ready()
        log = proc.log()
        assert log.count("a prepared claim's GPU is gone since the last start") == 2
        for claim, device in ((removed, "gpu-3"), (replaced, "gpu-5")):
            stored = apiserver.api.get_resource_claim("team", claim.name)
            (entry,) = stored["status"]["devices"]
            assert entry["device"] == device
            assert entry["conditions"][0]["reason"] == "GpuVanished"
            (event,) = apiserver.api.list_events(
                "team", field_selector=f"regarding.uid={claim.uid}"
            )
            assert event["reason"] == "GpuVanished" and event["action"] == "Recover"
            assert device in event["note"]
        assert len(apiserver.api.list_events("team")) == 2  # none for the kept claim
        specs = {p.read_text() for p in proc.cdi_root.glob("*.json")}
        assert len(specs) == 1 and kept.uid in next(iter(specs))
        kubelet = KubeletSim(proc.registry_dir)
        kubelet.register("gpu.nvidia.com")
        try:
            answer = kubelet.prepare([kept, removed]).claims
            assert answer[kept.uid].error == ""
            assert "gpu-3" in answer[removed.uid].error  # not re-prepared on another GPU
        finally:
            kubelet.close()
    finally:
        proc.kill()


def test_a_mig_device_destroyed_behind_the_drivers_back_is_withdrawn(
    short_dir: Path, apiserver: fakeserver.FakeApiServer
) -> None:
    node = start(short_dir, apiserver, "--fake", "a100-mig")
    try:
        assert "gpu-1-mig-7g-40gb-0" in node.devices()
        held = put_claim(
            node.server, "held", ["gpu-0-mig-3g-20gb-4"], device_class="mig.nvidia.com"
        )
        assert node.kubelet.prepare([held]).claims[held.uid].error == ""
        out = node.fake_event("--mig-destroy", "1:1")
        assert "GPU instance 1 destroyed" in out
        node.wait(lambda: "gpu-1-mig-7g-40gb-0" not in node.devices() and node.whole_pool())
        assert sorted(node.devices()) == [
            "gpu-0-mig-1g-5gb-2",
            "gpu-0-mig-1g-5gb-3",
            "gpu-0-mig-2g-10gb-0",
            "gpu-0-mig-3g-20gb-4",
        ]
        # What a claim holds is left alone: still prepared, its spec answers again.
        assert node.kubelet.prepare([held]).claims[held.uid].error == ""
        assert node.kubelet.unprepare([held]).claims[held.uid].error == ""
    finally:
        node.kubelet.close()
        node.proc.kill()


def test_a_claims_static_mig_device_destroyed_behind_the_drivers_back_is_reported(
    short_dir: Path, apiserver: fakeserver.FakeApiServer
) -> None:
    node = start(short_dir, apiserver, "--fake", "a100-mig")
    try:
        held = put_claim(
            node.server, "held", ["gpu-0-mig-3g-20gb-4"], device_class="mig.nvidia.com"
        )
        bystander = put_claim(
            node.server, "bystander", ["gpu-0-mig-2g-10gb-0"], device_class="mig.nvidia.com"
        )
        answer = node.kubelet.prepare([held, bystander]).claims
        assert answer[held.uid].error == answer[bystander.uid].error == ""
        out = node.fake_event("--mig-destroy", "0:4")
        assert "GPU instance 4 destroyed" in out
        node.wait(lambda: "gpu-0-mig-3g-20gb-4" not in node.devices() and node.whole_pool())
        # Reported: the log line, the claim's condition, the Event naming the MIG device.
        node.wait(lambda: "MIG device was destroyed behind the driver's back" in node.proc.log())

        def reported() -> bool:
            stored = node.server.api.get_resource_claim("team", "held")
            conditions = [c for d in stored["status"].get("devices", []) for c in d["conditions"]]
            return [(c["status"], c.get("reason")) for c in conditions] == [
                ("False", "GpuVanished")
            ]

        node.wait(reported)
        event = node.event_on(held.uid)
        assert "MIG device gpu-0-mig-3g-20gb-4" in event["note"] and "MIG-" in event["note"]
        # Only that claim: the one on another MIG device of the same GPU is not reported.
        time.sleep(0.5)
        assert [e["regarding"]["uid"] for e in node.server.api.list_events("team")] == [held.uid]
        assert "Ready" in str(node.server.api.get_resource_claim("team", "bystander")["status"])
        assert "GpuVanished" not in str(node.server.api.get_resource_claim("team", "bystander"))
        # A new claim for the destroyed device is refused, naming why; never prepared elsewhere.
        again = put_claim(
            node.server, "again", ["gpu-0-mig-3g-20gb-4"], device_class="mig.nvidia.com"
        )
        error = node.kubelet.prepare([again]).claims[again.uid].error
        assert "MIG device was destroyed" in error, error
        # Its own claim still unprepares cleanly; so does the other.
        answer = node.kubelet.unprepare([held, bystander]).claims
        assert answer[held.uid].error == answer[bystander.uid].error == ""
    finally:
        node.kubelet.close()
        node.proc.kill()


def test_dynamic_migs_own_instances_coming_and_going_are_never_reported(
    short_dir: Path, apiserver: fakeserver.FakeApiServer
) -> None:
    node = start(short_dir, apiserver, "--fake", "h100-mig", "--dynamic-mig", "all")
    try:
        held = put_claim(
            node.server, "held", ["gpu-0-mig-1g-10gb-0"], device_class="mig.nvidia.com"
        )
        assert node.kubelet.prepare([held]).claims[held.uid].error == ""
        node.fake_event("--gpu-add")  # a rediscovery that sees the instance made for it
        node.wait(lambda: node.proc.log().count('"GPUs changed under the running agent') == 1)
        assert node.kubelet.unprepare([held]).claims[held.uid].error == ""  # destroyed by us
        node.fake_event("--gpu-add")  # a rediscovery that finds it gone
        node.wait(lambda: node.proc.log().count('"GPUs changed under the running agent') == 2)
        node.wait(node.whole_pool)
        time.sleep(0.5)
        log = node.proc.log()
        seen = [json.loads(x) for x in log.splitlines() if '"GPUs changed under' in x]
        # Both rediscoveries saw GPU 0's MIG devices change: the instance made, then gone.
        uuid0 = node.devices()["gpu-0"]["attributes"]["uuid"]["string"]
        assert [x["changed"] for x in seen] == [[uuid0], [uuid0]]
        assert "MIG device was destroyed" not in log and "claim's GPU vanished" not in log
        assert node.server.api.list_events("team") == []
    finally:
        node.kubelet.close()
        node.proc.kill()


def test_a_server_that_drops_taints_gets_the_gpus_withdrawn_instead(short_dir: Path) -> None:
    server = fakeserver.FakeApiServer(disabled_gates={"DRADeviceTaints"}).start()
    try:
        node = start(short_dir, server)
        try:
            assert len(node.gpus()) == 8
            node.fake_event("--driver-unload")
            took = node.wait(lambda: not node.gpus() and node.whole_pool(), timeout_s=BOUND_S)
            assert took < BOUND_S
            node.fake_event("--driver-load", "--driver-version", "590.10.01")
            node.wait(lambda: node.schedulable("590.10.1"), timeout_s=BOUND_S)
            assert len(node.gpus()) == 8
        finally:
            node.kubelet.close()
            node.proc.kill()
    finally:
        server.stop()


def test_one_write_per_changed_slice_on_a_pool_of_several(
    short_dir: Path, apiserver: fakeserver.FakeApiServer
) -> None:
    node = start(short_dir, apiserver, "--fake", "h100-mig", "--dynamic-mig", "all")
    try:
        slices = len(node.slices())
        assert slices >= 2
        held = put_claim(
            node.server, "held", ["gpu-0-mig-1g-10gb-0"], device_class="mig.nvidia.com"
        )
        assert node.kubelet.prepare([held]).claims[held.uid].error == ""
        node.fake_event("--driver-unload")
        node.wait(node.unschedulable, timeout_s=BOUND_S)
        writes = node.server.api.writes
        before = {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in node.slices()}
        node.fake_event("--driver-load", "--driver-version", "590.10.01")
        node.wait(lambda: node.schedulable("590.10.1"), timeout_s=BOUND_S)
        time.sleep(1.0)
        after = {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in node.slices()}
        changed = [n for n, v in after.items() if before.get(n) != v]
        # The devices' slice changed (driverVersion, taints), the counters' slice did not:
        # exactly one write for the one changed slice, none for the other.
        assert len(changed) == 1 < slices
        assert node.server.api.writes - writes == len(changed)
        # Dynamic MIG's instance of the prepared claim is still there and still prepared.
        assert node.kubelet.prepare([held]).claims[held.uid].error == ""
        assert node.kubelet.unprepare([held]).claims[held.uid].error == ""
    finally:
        node.kubelet.close()
        node.proc.kill()
