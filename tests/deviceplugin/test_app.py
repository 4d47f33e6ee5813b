"""Whole-node wiring: one registration per resource (MIG mixed), replicas over the kubelet."""

from __future__ import annotations

from pathlib import Path

from dra_driver.deviceplugin import inventory
from dra_driver.devices import model
from dra_driver.pb.deviceplugin.v1beta1 import deviceplugin_pb2 as pb

from .conftest import StartPlugin
from .testkubelet import FakeKubelet


def test_mig_mixed_registers_each_profile_as_its_own_resource(
    start_plugin: StartPlugin, kubelet: FakeKubelet
) -> None:
    running = start_plugin("a100-mig", mig_strategy=inventory.MigStrategy.MIXED)
    expected = {
        "nvidia.com/gpu",
        "nvidia.com/mig-1g.5gb",
        "nvidia.com/mig-2g.10gb",
        "nvidia.com/mig-3g.20gb",
        "nvidia.com/mig-7g.40gb",
    }
    requests = kubelet.wait_requests(len(expected))
    assert {r.resource_name for r in requests} == expected
    assert len({r.endpoint for r in requests}) == len(expected)
    stub = running.stub("nvidia.com/mig-1g.5gb")
    first = next(iter(stub.ListAndWatch(pb.Empty(), timeout=5)))
    migs = [m for m in running.devices.gpus[0].mig_devices if m.profile == "1g.5gb"]
    assert sorted(d.ID for d in first.devices) == sorted(m.uuid for m in migs)
    # A sick parent GPU makes its MIG devices unhealthy too.
    running.board.mark_unhealthy(running.devices.gpus[0].uuid, "XID 79")
    second = next(iter(stub.ListAndWatch(pb.Empty(), timeout=5)))
    assert {d.health for d in second.devices} == {"Unhealthy"}


def test_replicas_are_listed_and_allocated_as_their_gpu(
    start_plugin: StartPlugin, kubelet: FakeKubelet
) -> None:
    running = start_plugin("h100-nvl-pairs", replicas=4)
    kubelet.wait_requests(1)
    stub = running.stub()
    first = next(iter(stub.ListAndWatch(pb.Empty(), timeout=5)))
    u = running.uuids()
    assert [d.ID for d in first.devices][:4] == [f"{u[0]}::{n}" for n in range(4)]
    assert len(first.devices) == 16
    req = pb.AllocateRequest()
    req.container_requests.add(devices_ids=[f"{u[1]}::0", f"{u[1]}::3", f"{u[0]}::2"])
    [resp] = stub.Allocate(req, timeout=5).container_responses
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == f"{u[1]},{u[0]}"
    assert [c.name.split("=")[1] for c in resp.cdi_devices] == [u[1], u[0]]


def test_a_node_without_gpus_registers_an_empty_list_and_writes_no_spec(
    start_plugin: StartPlugin, kubelet: FakeKubelet, cdi_root: Path
) -> None:
    running = start_plugin(model.NodeDevices(gpus=()))
    [req] = kubelet.wait_requests(1)
    assert req.resource_name == "nvidia.com/gpu"
    first = next(iter(running.stub().ListAndWatch(pb.Empty(), timeout=5)))
    assert list(first.devices) == []
    assert not cdi_root.exists() or list(cdi_root.iterdir()) == []
