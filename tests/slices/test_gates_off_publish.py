"""The node publisher on a server with a DRA feature gate off (the fake API server over loopback
HTTP, the real client, the real probe): what it publishes is stored whole (no field silently
lost), and a scheduler simulation over what was stored never gives one GPU to two claims —
whole-GPU ladders and counts, GPU shares and MIG devices wherever the server keeps their fields,
with an unhealthy GPU withdrawn where it drops taints."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from dra_driver.allocation import allocator, claimgen, simulator
from dra_driver.devices import fake, health, migprofiles, model
from dra_driver.kube import client, features
from dra_driver.slices import compare, nodepublisher, republish, serverfeatures, shares
from dra_driver.testing.fakeapi import fakeserver

Obj = dict[str, Any]
DRIVER = "gpu.nvidia.com"
NODE = "n1"
XID79 = health.Condition(kind="xid", value="79", effect="NoExecute", message="XID 79")


class Server:
    def __init__(self, tmp_path: Path, gates: set[str]) -> None:
        self.fake = fakeserver.FakeApiServer(disabled_gates=gates).start()
        self.fake.api.put_node(NODE, uid="uid-n1")
        self.kube = client.KubeClient.connect(self.fake.write_kubeconfig(tmp_path / "kc"))

    def stored(self) -> list[Obj]:
        found, _ = self.fake.api.list_resource_slices(driver=DRIVER, node_name=NODE)
        return sorted(found, key=lambda s: s["metadata"]["name"])

    def close(self) -> None:
        self.kube.close()
        self.fake.stop()


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[[set[str]], Server]]:
    made: list[Server] = []

    def make(gates: set[str]) -> Server:
        made.append(Server(tmp_path, gates))
        return made[-1]

    yield make
    for each in made:
        each.close()


def wait_for(condition: Callable[[], Any], timeout_s: float = 10.0) -> None:
    done = threading.Event()
    for _ in range(int(timeout_s / 0.02)):
        if condition():
            return
        done.wait(0.02)
    raise AssertionError("condition not met in time")


def publish(
    server: Server,
    tmp_path: Path,
    devices: model.NodeDevices,
    *,
    board: health.HealthBoard | None = None,
    dynamic_mig: migprofiles.DynamicMig = migprofiles.STATIC,
    shareable: shares.Shareable = shares.NONE,
) -> tuple[list[Obj], serverfeatures.ServerFeatures]:
    """Publish as the agent does; returns the stored slices once in sync, and the features."""
    found = serverfeatures.ServerFeatures(
        probe=lambda: features.probe(server.kube, NODE, DRIVER), log=structlog.get_logger()
    )
    dropped: list[tuple[str, list[str]]] = []
    real = found.fields_dropped

    def spy(name: str, fields: list[str]) -> None:
        dropped.append((name, fields))
        real(name, fields)

    found.fields_dropped = spy  # type: ignore[method-assign,assignment]
    kept = found.start()
    assert (
        serverfeatures.refusal(
            kept, gpus=devices.gpus, dynamic_mig=dynamic_mig, shareable=shareable
        )
        == ""
    )
    node = nodepublisher.NodePublisher(
        driver_name=DRIVER,
        node_name=NODE,
        devices=devices,
        api=server.kube,
        lock_file=tmp_path / "publisher.lock",
        grace_s=60.0,
        watch_timeout_s=30.0,
        log=structlog.get_logger(),
        board=board,
        dynamic_mig=dynamic_mig,
        shareable=shareable,
        features=found,
    )
    node.start()
    try:
        wait_for(node.publisher.synced.is_set)
    finally:
        node.stop()
    wanted = republish.rebuilder(
        devices,
        node_name=NODE,
        driver_name=DRIVER,
        tainted=board is not None,
        dynamic_mig=dynamic_mig,
        shareable=shareable,
        kept=lambda: found.kept,
    )(republish.current(board, None))
    stored = server.stored()
    # What the agent wanted is what the server stored: no field silently lost.
    assert dropped == []
    assert [s["metadata"]["name"] for s in stored] == sorted(s["metadata"]["name"] for s in wanted)
    by_name = {s["metadata"]["name"]: s for s in wanted}
    for obj in stored:
        assert compare.content(obj) == compare.content(by_name[obj["metadata"]["name"]])
        assert compare.dropped(by_name[obj["metadata"]["name"]], obj) == []
    return stored, found


def request(name: str, cls: str, *, capacity: Obj | None = None, sel: str = "") -> Obj:
    exactly: Obj = {"deviceClassName": cls}
    if capacity:
        exactly["capacity"] = capacity
    if sel:
        exactly["selectors"] = [{"cel": {"expression": sel}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "t"},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": exactly}]}},
    }


def whole(name: str, count: int = 1) -> Obj:
    obj = request(name, "gpu.nvidia.com")
    obj["spec"]["devices"]["requests"][0]["exactly"].update(
        {"allocationMode": "ExactCount", "count": count}
    )
    return obj


def share(name: str, memory: str) -> Obj:
    return request(name, "gpu.nvidia.com", capacity={"requests": {"memory": memory}})


def mig(name: str, profile: str) -> Obj:
    return request(
        name, "mig.nvidia.com", sel=f'device.attributes["{DRIVER}"].profile == "{profile}"'
    )


def simulate(
    stored: list[Obj], devices: model.NodeDevices, claims: list[Obj]
) -> list[allocator.Outcome]:
    """Allocate ``claims`` one after another on the stored slices; no GPU goes to two claims
    unless both are parts of it (shares, MIG devices)."""
    outcomes = simulator.run(
        simulator.Inputs(
            claims=claims,
            classes=simulator.builtin_classes(driver_name=DRIVER),
            slices=stored,
            node_name=NODE,
            allocated=set(),
            node_devices=devices,
        ),
        share_rng=random.Random(7),
    )
    got = [(c["metadata"]["name"], o) for c, o in zip(claims, outcomes, strict=True)]
    for i, (name_a, a) in enumerate(got):
        for name_b, b in got[i + 1 :]:
            parts = name_a.startswith(("share", "mig")) and name_b.startswith(("share", "mig"))
            if not parts:  # a whole GPU is never shared with another claim
                assert not set(a.gpus) & set(b.gpus), (name_a, name_b, a.gpus, b.gpus)
    return outcomes


def ladders(n: int) -> list[Obj]:
    return [
        claimgen.claim(size, name=f"ladder-{i}-{size}", namespace="t")
        for i, size in enumerate([n] * 2)
    ]


def test_taints_off_the_unhealthy_gpu_is_withdrawn_and_nobody_gets_it(
    serve: Callable[[set[str]], Server], tmp_path: Path
) -> None:
    server = serve({"DRADeviceTaints"})
    devices = fake.FakeBackend.from_name("dgx-h100").discover()
    board = health.HealthBoard()
    board.set_conditions(devices.gpu(0).uuid, [XID79])
    stored, found = publish(
        server, tmp_path, devices, board=board, shareable=shares.Shareable.parse("H100")
    )
    assert found.kept.dropped == ("deviceTaints",)
    names = {d["name"] for s in stored for d in s["spec"].get("devices") or ()}
    assert "gpu-0" not in names and {f"gpu-{i}" for i in range(1, 8)} <= names
    assert not any("taints" in d for s in stored for d in s["spec"].get("devices") or ())
    claims = [
        *ladders(2),
        whole("count-1"),
        share("share-a", "10Gi"),
        share("share-b", "20Gi"),
        whole("count-2", 2),
        claimgen.claim(1, name="ladder-x-1", namespace="t"),
        whole("count-too-many", 8),
    ]
    outcomes = simulate(stored, devices, claims)
    allocated = {o.claim_name for o in outcomes if o.allocated}
    assert {"ladder-0-2", "ladder-1-2", "count-1", "share-a", "share-b"} <= allocated
    assert "count-too-many" not in allocated  # 8 GPUs are no longer there
    assert all(devices.gpu(0).uuid not in o.gpus for o in outcomes)


def test_taints_off_a_dynamic_mig_gpu_is_withdrawn_with_its_placements(
    serve: Callable[[set[str]], Server], tmp_path: Path
) -> None:
    server = serve({"DRADeviceTaints"})
    devices = fake.FakeBackend.from_name("h100-mig").discover()
    board = health.HealthBoard()
    sick = devices.gpus[1]
    board.set_conditions(sick.uuid, [XID79])
    stored, _ = publish(
        server, tmp_path, devices, board=board, dynamic_mig=migprofiles.DynamicMig.parse("all")
    )
    entries = [d for s in stored for d in s["spec"].get("devices") or ()]
    assert entries and not any(sick.uuid in str(d["attributes"]) for d in entries)
    claims = [mig(f"mig-{i}", "1g.10gb") for i in range(8)] + [whole("count-1")]
    outcomes = simulate(stored, devices, claims)
    assert all(sick.uuid not in o.gpus for o in outcomes)
    assert sum(o.allocated for o in outcomes) == 7  # gpu-0: seven 1g.10gb, then nothing whole


def test_counters_off_default_settings_publish_gpus_shares_and_static_mig(
    serve: Callable[[set[str]], Server], tmp_path: Path
) -> None:
    server = serve({"DRAPartitionableDevices"})
    devices = fake.FakeBackend.from_name("a100-mig").discover()
    stored, found = publish(server, tmp_path, devices)
    assert found.kept.dropped == ("sharedCounters",)
    assert not any("sharedCounters" in s["spec"] for s in stored)
    claims = [mig("mig-a", "1g.5gb"), mig("mig-b", "1g.5gb"), mig("mig-c", "1g.5gb")]
    outcomes = simulate(stored, devices, claims)
    assert [o.allocated for o in outcomes] == [True, True, False]
    devices = fake.FakeBackend.from_name("dgx-h100").discover()
    stored, _ = publish(server, tmp_path, devices, shareable=shares.Shareable.parse("all"))
    claims = [
        share("share-a", "40Gi"),
        share("share-b", "40Gi"),
        *ladders(4),
        whole("count-1"),
        whole("count-2", 2),
    ]
    outcomes = simulate(stored, devices, claims)
    allocated = {o.claim_name for o in outcomes if o.allocated}
    assert {"share-a", "share-b", "ladder-0-4", "count-1"} <= allocated
    assert "ladder-1-4" not in allocated  # shares and the first quad leave no second quad


def test_counters_off_refuses_explicit_dynamic_mig_only_where_it_selects_gpus(
    serve: Callable[[set[str]], Server],
) -> None:
    server = serve({"DRAPartitionableDevices"})
    kept = serverfeatures.Kept.of(features.probe(server.kube, NODE, DRIVER))
    gpus = fake.FakeBackend.from_name("h100-mig").discover().gpus
    said = serverfeatures.refusal(
        kept,
        gpus=gpus,
        dynamic_mig=migprofiles.DynamicMig.parse("all"),
        shareable=shares.NONE,
        server=server.kube.server,
    )
    assert "DRAPartitionableDevices" in said and "--dynamic-mig all" in said
    assert "\n" not in said and server.kube.server in said
    for selector in ("none", "A100"):  # the default, or a selector matching no GPU here
        assert not serverfeatures.refusal(
            kept,
            gpus=gpus,
            dynamic_mig=migprofiles.DynamicMig.parse(selector),
            shareable=shares.NONE,
        )


def test_capacity_off_default_settings_publish_whole_gpus_and_dynamic_mig(
    serve: Callable[[set[str]], Server], tmp_path: Path
) -> None:
    server = serve({"DRAConsumableCapacity"})
    devices = fake.FakeBackend.from_name("h100-mig").discover()
    stored, found = publish(
        server, tmp_path, devices, dynamic_mig=migprofiles.DynamicMig.parse("all")
    )
    assert found.kept.dropped == ("consumableCapacity",)
    assert not any(
        d.get("allowMultipleAllocations") for s in stored for d in s["spec"].get("devices") or ()
    )
    claims = [
        whole("count-1"),
        mig("mig-a", "3g.40gb"),
        mig("mig-b", "3g.40gb"),
        mig("mig-c", "3g.40gb"),
        whole("count-again"),
    ]
    outcomes = simulate(stored, devices, claims)
    assert [o.allocated for o in outcomes] == [True, True, True, False, False]
    said = serverfeatures.refusal(
        found.kept,
        gpus=devices.gpus,
        dynamic_mig=migprofiles.STATIC,
        shareable=shares.Shareable.parse("all"),
    )
    assert "DRAConsumableCapacity" in said and "--shareable all" in said
