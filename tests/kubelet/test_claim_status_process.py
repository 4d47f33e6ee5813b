"""The node agent as a process writes ``status.devices`` of the claims it prepares, with server-side
apply against the fake API server: the physical GPUs of a GPU and of a GPU set, the instance UUID
of a static and a dynamic MIG device, a share's consumed capacity; a Ready condition; entries
gone after unprepare, another manager's entry untouched; a refused write never fails the
prepare, is retried and counted."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dra_driver.devices import fake
from dra_driver.driver import claims
from dra_driver.testing.fakeapi import fakeserver
from dra_driver.testing.kubeletsim import KubeletSim, PluginProcess

from .claimkit import put_claim

DRIVER = "gpu.nvidia.com"
MANAGER = f"{DRIVER}-kubelet-plugin"


def wait_for(condition: Callable[[], Any], timeout_s: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)
    return value


def entries(server: fakeserver.FakeApiServer, ref: claims.ClaimRef) -> list[dict[str, Any]]:
    got = server.api.get_resource_claim(ref.namespace, ref.name)
    return list((got.get("status") or {}).get("devices") or [])


def gpus(profile: str) -> dict[int, tuple[str, str]]:
    return {
        g.minor: (g.uuid, g.pci_bus_id) for g in fake.FakeBackend.from_name(profile).discover().gpus
    }


def start(
    base: Path, server: fakeserver.FakeApiServer, **kwargs: Any
) -> tuple[PluginProcess, KubeletSim]:
    proc = PluginProcess(
        base=base, kubeconfig=server.write_kubeconfig(base / "kubeconfig"), **kwargs
    )
    proc.start()
    proc.wait_ready()
    kubelet = KubeletSim(proc.registry_dir)
    kubelet.register(DRIVER)
    return proc, kubelet


def metric(proc: PluginProcess, result: str) -> float:
    _, body = proc.http_get("/metrics")
    line = f'dra_driver_claim_status_writes_total{{result="{result}"}} '
    found = [x for x in body.splitlines() if x.startswith(line)]
    return float(found[0].split()[-1]) if found else 0.0


def test_status_of_a_gpu_and_a_gpu_set_follows_prepare_and_unprepare(
    short_dir: Path, apiserver: fakeserver.FakeApiServer
) -> None:
    facts = gpus("dgx-h100")
    proc, kubelet = start(short_dir, apiserver)
    try:
        one = put_claim(apiserver, "one", ["gpu-3"])
        pair = put_claim(apiserver, "pair", ["gpus-0-1"])
        # Another driver's entry for a device of its own in the same claim: must survive.
        claim = apiserver.api.get_resource_claim("team", "one")
        claim["status"]["allocation"]["devices"]["results"].append(
            {"request": "gpu", "driver": "nic.example.com", "pool": "n1", "device": "eth0"}
        )
        apiserver.api.put_resource_claim(claim)
        theirs = {"driver": "nic.example.com", "pool": "n1", "device": "eth0", "data": {"x": 1}}
        apiserver.api.apply_resource_claim_status(
            "team",
            "one",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": "one"},
                "status": {"devices": [theirs]},
            },
            "nic-driver",
        )
        response = kubelet.prepare([one, pair])
        assert {c.error for c in response.claims.values()} == {""}

        got = wait_for(lambda: [e for e in entries(apiserver, one) if e["driver"] == DRIVER])
        (entry,) = got
        assert (entry["pool"], entry["device"]) == ("n1", "gpu-3") and "shareID" not in entry
        assert entry["data"]["kind"] == "gpu"
        assert entry["data"]["gpus"] == [{"minor": 3, "uuid": facts[3][0], "pciBusID": facts[3][1]}]
        (ready,) = entry["conditions"]
        assert ready["type"] == "Ready" and ready["status"] == "True"
        assert ready["reason"] == "Prepared" and ready["lastTransitionTime"]
        assert ready["message"].startswith(f"prepared on the node; CDI device k8s.{DRIVER}/")
        assert theirs in entries(apiserver, one)
        owners = apiserver.api.status_owners("team", "one")
        assert owners[(DRIVER, "gpu-3", "n1", None)] == {MANAGER}

        (set_entry,) = wait_for(lambda: entries(apiserver, pair))
        assert set_entry["device"] == "gpus-0-1" and set_entry["data"]["kind"] == "gpu-set"
        assert [g["uuid"] for g in set_entry["data"]["gpus"]] == [facts[0][0], facts[1][0]]

        response = kubelet.unprepare([one, pair])
        assert {c.error for c in response.claims.values()} == {""}
        wait_for(lambda: entries(apiserver, one) == [theirs] and entries(apiserver, pair) == [])
        claim = apiserver.api.get_resource_claim("team", "one")
        assert len(claim["status"]["allocation"]["devices"]["results"]) == 2
        # The writer counts a write once the server answered it: shortly after it is visible.
        wait_for(lambda: metric(proc, "success") >= 4)
        assert metric(proc, "failure") == 0
        kubelet.close()
    finally:
        proc.kill()


def test_dynamic_mig_instance_and_share(
    short_dir: Path, apiserver: fakeserver.FakeApiServer
) -> None:
    proc, kubelet = start(short_dir, apiserver, fake="h100-mig", extra=["--dynamic-mig", "all"])
    try:
        mig = put_claim(
            apiserver, "mig", ["gpu-0-mig-1g-10gb-0"], "mig", device_class="mig.nvidia.com"
        )
        assert kubelet.prepare([mig]).claims[mig.uid].error == ""
        (entry,) = wait_for(lambda: entries(apiserver, mig))
        record = json.loads((proc.plugins_dir / DRIVER / "claims" / f"{mig.uid}.json").read_text())
        made = record["devices"][0]["mig"]["uuid"]
        assert made and made.startswith("MIG-")
        assert entry["data"]["kind"] == "mig" and entry["data"]["migUUID"] == made
        assert entry["data"]["gpus"][0]["uuid"] == record["devices"][0]["mig"]["parentUUID"]
        assert kubelet.unprepare([mig]).claims[mig.uid].error == ""
        wait_for(lambda: entries(apiserver, mig) == [])
        kubelet.close()
    finally:
        proc.kill()

    share_id = str(uuid.uuid4())
    uid = str(uuid.uuid4())
    result = {
        "request": "gpu",
        "driver": DRIVER,
        "pool": "n1",
        "device": "gpu-1",
        "shareID": share_id,
        "consumedCapacity": {"memory": "4Gi", "computeShare": "10"},
    }
    apiserver.api.put_resource_claim(
        {
            "metadata": {"name": "share", "namespace": "team", "uid": uid},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": "gpu.nvidia.com",
                                "capacity": {"requests": {"memory": "4Gi"}},
                            },
                        }
                    ]
                }
            },
            "status": {"allocation": {"devices": {"results": [result]}}},
        }
    )
    share = claims.ClaimRef(uid=uid, namespace="team", name="share")
    base = short_dir / "s"
    base.mkdir()
    proc, kubelet = start(base, apiserver)
    try:
        assert kubelet.prepare([share]).claims[uid].error == ""
        (entry,) = wait_for(lambda: entries(apiserver, share))
        assert entry["shareID"] == share_id and entry["device"] == "gpu-1"
        assert entry["data"]["share"] == {"memory": "4Gi", "computeShare": "10"}
        assert entry["data"]["gpus"][0]["uuid"] == gpus("dgx-h100")[1][0]
        assert kubelet.unprepare([share]).claims[uid].error == ""
        wait_for(lambda: entries(apiserver, share) == [])
        kubelet.close()
    finally:
        proc.kill()


def test_static_mig_instance(short_dir: Path, apiserver: fakeserver.FakeApiServer) -> None:
    """A MIG device of a GPU already in MIG mode: its own UUID and its parent GPU's."""
    node = fake.FakeBackend.from_name("a100-mig").discover()
    gpu = next(g for g in node.gpus if g.mig_devices)
    mig = sorted(gpu.mig_devices, key=lambda m: (m.placement_start, m.uuid))[0]
    proc, kubelet = start(short_dir, apiserver, fake="a100-mig")
    try:
        name = f"{gpu.name}-mig-{mig.profile.replace('.', '-')}-{mig.placement_start}"
        ref = put_claim(apiserver, "static-mig", [name], "mig", device_class="mig.nvidia.com")
        assert kubelet.prepare([ref]).claims[ref.uid].error == ""
        (entry,) = wait_for(lambda: entries(apiserver, ref))
        assert entry["device"] == name and entry["data"]["kind"] == "mig"
        assert entry["data"]["migUUID"] == mig.uuid
        assert entry["data"]["gpus"][0]["uuid"] == gpu.uuid
        assert kubelet.unprepare([ref]).claims[ref.uid].error == ""
        wait_for(lambda: entries(apiserver, ref) == [])
        kubelet.close()
    finally:
        proc.kill()


def test_a_refused_status_write_leaves_the_claim_prepared_and_is_retried(
    short_dir: Path, apiserver: fakeserver.FakeApiServer
) -> None:
    proc, kubelet = start(short_dir, apiserver)
    try:
        ref = put_claim(apiserver, "denied", ["gpu-2"])
        apiserver.api.fail_next(
            "apply_resource_claim_status",
            403,
            times=2,
            message='resourceclaims.resource.k8s.io "denied" is forbidden: RBAC',
        )
        response = kubelet.prepare([ref])
        assert response.claims[ref.uid].error == "" and len(response.claims[ref.uid].devices) == 1
        (entry,) = wait_for(lambda: entries(apiserver, ref), timeout_s=20.0)
        assert entry["device"] == "gpu-2"
        assert metric(proc, "failure") == 2 and metric(proc, "success") == 1
        lines = [json.loads(x) for x in proc.log().splitlines() if x.startswith("{")]
        refused = [
            x for x in lines if x["event"] == "cannot write the claim's device status; will retry"
        ]
        assert len(refused) == 2
        assert {(x["claim_uid"], x["claim_namespace"], x["claim_name"]) for x in refused} == {
            (ref.uid, "team", "denied")
        }
        assert refused[0]["status"] == 403
        kubelet.close()
    finally:
        proc.kill()


def test_a_server_that_drops_device_status_is_said_once_and_the_claim_stays_prepared(
    short_dir: Path,
) -> None:
    """DRAResourceClaimDeviceStatus off: the server answers the apply but keeps no entries."""
    server = fakeserver.FakeApiServer(disabled_gates=frozenset({"DRAResourceClaimDeviceStatus"}))
    server.start()
    proc, kubelet = start(short_dir, server)
    try:
        refs = [put_claim(server, f"c{i}", [f"gpu-{i}"]) for i in range(2)]
        answers = kubelet.prepare(refs).claims
        assert all(answers[r.uid].error == "" for r in refs)
        wait_for(lambda: metric(proc, "dropped") == 2.0)
        assert all(entries(server, r) == [] for r in refs)
        assert metric(proc, "success") == 0.0
        assert proc.log().count("did not keep the claim's device status") == 1
        kubelet.close()
    finally:
        proc.kill()
        server.stop()
