"""The DevicePlugin service as the kubelet uses it: real unix sockets, a test kubelet."""

from __future__ import annotations

import json
import queue
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from dra_driver.deviceplugin import allocate, cdi, inventory
from dra_driver.devices import topology
from dra_driver.driver import inventory as preparable
from dra_driver.pb.deviceplugin.v1beta1 import deviceplugin_pb2 as pb
from dra_driver.pb.deviceplugin.v1beta1 import deviceplugin_pb2_grpc as pb_grpc

from .conftest import StartPlugin, Stream
from .test_cdi import A100_MIG_MINORS, validate
from .testkubelet import FakeKubelet

OpenStream = Callable[[pb_grpc.DevicePluginStub], Stream]


def preferred(
    stub: pb_grpc.DevicePluginStub,
    available: list[str],
    size: int,
    must: list[str] | tuple[str, ...] = (),
) -> list[str]:
    req = pb.PreferredAllocationRequest()
    req.container_requests.add(
        available_deviceIDs=available, must_include_deviceIDs=list(must), allocation_size=size
    )
    resp = stub.GetPreferredAllocation(req, timeout=5)
    assert len(resp.container_responses) == 1
    return list(resp.container_responses[0].deviceIDs)


def allocate_ids(stub: pb_grpc.DevicePluginStub, *containers: list[str]) -> pb.AllocateResponse:
    req = pb.AllocateRequest()
    for ids in containers:
        req.container_requests.add(devices_ids=ids)
    return stub.Allocate(req, timeout=5)


def test_registration_carries_version_endpoint_resource_and_options(
    start_plugin: StartPlugin, kubelet: FakeKubelet, plugin_dir: Path
) -> None:
    running = start_plugin("h100-nvl-pairs")
    [req] = kubelet.wait_requests(1)
    assert req.version == "v1beta1"
    assert req.resource_name == "nvidia.com/gpu"
    assert "/" not in req.endpoint
    assert (plugin_dir / req.endpoint).is_socket()
    assert req.options.get_preferred_allocation_available is True
    assert req.options.pre_start_required is False
    opts = running.stub().GetDevicePluginOptions(pb.Empty(), timeout=5)
    assert opts.get_preferred_allocation_available and not opts.pre_start_required
    assert (
        running.stub().PreStartContainer(
            pb.PreStartContainerRequest(devices_ids=running.uuids()[:1]), timeout=5
        )
        is not None
    )


def test_list_and_watch_lists_every_gpu_with_numa_then_follows_health_both_ways(
    start_plugin: StartPlugin, open_stream: OpenStream
) -> None:
    running = start_plugin("dgx-1-v100")
    stream = open_stream(running.stub())
    first = stream.next()
    assert [d.ID for d in first.devices] == running.uuids()
    assert all(d.health == "Healthy" for d in first.devices)
    assert [[n.ID for n in d.topology.nodes] for d in first.devices] == [[0]] * 4 + [[1]] * 4

    sick = running.uuids()[3]
    running.board.mark_unhealthy(sick, "XID 79")
    update = stream.next()
    assert {d.ID: d.health for d in update.devices if d.health != "Healthy"} == {sick: "Unhealthy"}
    assert len(update.devices) == 8  # always the full list

    running.board.mark_healthy(sick)
    assert all(d.health == "Healthy" for d in stream.next().devices)
    running.board.mark_healthy(sick)  # no change: nothing is sent
    with pytest.raises(queue.Empty):
        stream.items.get(timeout=0.5)


def test_a_second_stream_starts_from_the_current_health(
    start_plugin: StartPlugin, open_stream: OpenStream
) -> None:
    running = start_plugin("h100-nvl-pairs")
    running.board.mark_unhealthy(running.uuids()[0])
    first = open_stream(running.stub()).next()
    assert [d.health for d in first.devices] == ["Unhealthy", "Healthy", "Healthy", "Healthy"]


def test_preferred_allocation_of_four_on_dgx1_is_a_fully_connected_quad(
    start_plugin: StartPlugin,
) -> None:
    running = start_plugin("dgx-1-v100")
    topo = topology.build(running.devices)
    index = {g.uuid: g.index for g in running.devices.gpus}
    uuids = running.uuids()
    # Offer the GPUs in a scrambled order, including a partial quad first.
    offered = [uuids[i] for i in (0, 5, 6, 1, 7, 2, 4, 3)]
    chosen = sorted(index[u] for u in preferred(running.stub(), offered, 4))
    assert all(topo.links(a, b) > 0 for a in chosen for b in chosen if a != b), chosen
    # Without GPU 3 no quad on the first board is complete: the other board is chosen.
    without = [u for u in offered if u != uuids[3]]
    assert sorted(index[u] for u in preferred(running.stub(), without, 4)) == [4, 5, 6, 7]


def test_preferred_allocation_on_nvl_pairs_takes_a_bridged_pair_and_honours_must_include(
    start_plugin: StartPlugin,
) -> None:
    running = start_plugin("h100-nvl-pairs")
    u = running.uuids()
    stub = running.stub()
    assert sorted(preferred(stub, u, 2)) == sorted(u[0:2])
    assert sorted(preferred(stub, [u[1], u[2], u[3]], 2)) == sorted(u[2:4])
    assert sorted(preferred(stub, u, 2, must=[u[3]])) == sorted(u[2:4])
    assert sorted(preferred(stub, u, 2, must=[u[1], u[2]])) == sorted([u[1], u[2]])


def test_preferred_allocation_answers_each_container_request(start_plugin: StartPlugin) -> None:
    running = start_plugin("h100-nvl-pairs")
    u = running.uuids()
    req = pb.PreferredAllocationRequest()
    req.container_requests.add(available_deviceIDs=u, allocation_size=2)
    req.container_requests.add(
        available_deviceIDs=u[1:], allocation_size=1, must_include_deviceIDs=[u[2]]
    )
    resp = running.stub().GetPreferredAllocation(req, timeout=5)
    assert [sorted(r.deviceIDs) for r in resp.container_responses] == [sorted(u[:2]), [u[2]]]


def test_allocate_with_cdi_strategy_names_cdi_devices_and_keeps_the_spec(
    start_plugin: StartPlugin, cdi_root: Path
) -> None:
    running = start_plugin("h100-nvl-pairs", strategy=allocate.Strategy.CDI)
    u = running.uuids()
    spec_file = cdi_root / "k8s.device-plugin.nvidia.com-gpu.json"
    assert {d["name"] for d in json.loads(spec_file.read_text())["devices"]} == set(u)
    spec_file.unlink()
    resp = allocate_ids(running.stub(), [u[0], u[1]], [u[3]])
    first, second = resp.container_responses
    assert [c.name for c in first.cdi_devices] == [
        f"k8s.device-plugin.nvidia.com/gpu={u[0]}",
        f"k8s.device-plugin.nvidia.com/gpu={u[1]}",
    ]
    assert dict(first.envs) == {"NVIDIA_VISIBLE_DEVICES": f"{u[0]},{u[1]}"}
    assert not first.devices
    assert [c.name for c in second.cdi_devices] == [f"k8s.device-plugin.nvidia.com/gpu={u[3]}"]
    assert spec_file.is_file(), "Allocate must put the static CDI spec back"


@pytest.mark.parametrize("fake_node", [None, "/dev/null"])
def test_allocate_with_envvar_strategy_passes_env_and_device_nodes(
    start_plugin: StartPlugin, fake_node: str | None
) -> None:
    running = start_plugin("dgx-1-v100", strategy=allocate.Strategy.ENVVAR, fake_node=fake_node)
    u = running.uuids()
    [resp] = allocate_ids(running.stub(), [u[6], u[2]]).container_responses
    assert dict(resp.envs) == {"NVIDIA_VISIBLE_DEVICES": f"{u[6]},{u[2]}"}
    assert not resp.cdi_devices
    paths = [(d.container_path, d.host_path, d.permissions) for d in resp.devices]
    expected = ("/dev/nvidia6", "/dev/nvidia2", *cdi.CONTROL_NODES)
    assert paths == [(p, fake_node or p, "rw") for p in expected]


def test_bad_requests_get_clear_errors_and_the_server_keeps_serving(
    start_plugin: StartPlugin,
) -> None:
    running = start_plugin("h100-nvl-pairs")
    stub = running.stub()
    u = running.uuids()
    with pytest.raises(grpc.RpcError) as err:
        allocate_ids(stub, [u[0]], [u[1], "GPU-not-here"])
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "container_requests[1]" in str(err.value.details())
    assert "'GPU-not-here'" in str(err.value.details())

    with pytest.raises(grpc.RpcError) as err:
        preferred(stub, u[:3], 4)
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "allocation_size 4 is larger than the 3 available devices" in str(err.value.details())

    with pytest.raises(grpc.RpcError) as err:
        preferred(stub, [*u[:2], "bogus"], 1)
    assert "available_deviceIDs: unknown device ID 'bogus'" in str(err.value.details())

    with pytest.raises(grpc.RpcError) as err:
        preferred(stub, u, 1, must=u[:2])
    assert "smaller than the 2 must-include devices" in str(err.value.details())

    running.board.mark_unhealthy(u[2], "XID 48")
    with pytest.raises(grpc.RpcError) as err:
        allocate_ids(stub, [u[2]])
    assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert u[2] in str(err.value.details()) and "XID 48" in str(err.value.details())

    # Still serving, and good requests still succeed.
    assert len(allocate_ids(stub, [u[0]]).container_responses) == 1
    assert len(preferred(stub, u, 2)) == 2


MIG_1G = "MIG-841614ff-b48b-50de-987d-0b7cb0c9f264"  # a100-mig: gpu0, GI 2, CI 0, 1g.5gb
MIG_1G_CAPS = ("/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap22")


@pytest.mark.parametrize("fake_node", [None, "/dev/null"])
def test_envvar_allocate_of_a_mig_device_passes_its_caps_nodes(
    start_plugin: StartPlugin, fake_node: str | None
) -> None:
    running = start_plugin(
        "a100-mig",
        # Real mode reads the kernel's table; fake mode makes minors up (the DRA path's rule).
        mig_minors=None if fake_node else A100_MIG_MINORS,
        mig_strategy=inventory.MigStrategy.MIXED,
        strategy=allocate.Strategy.ENVVAR,
        fake_node=fake_node,
    )
    [resp] = allocate_ids(running.stub("nvidia.com/mig-1g.5gb"), [MIG_1G]).container_responses
    assert dict(resp.envs) == {"NVIDIA_VISIBLE_DEVICES": MIG_1G}
    paths = [(d.container_path, d.host_path) for d in resp.devices]
    dra = preparable.build(running.devices, mig_minors=None if fake_node else A100_MIG_MINORS)
    own = dra.devices["gpu-0-mig-1g-5gb-2"].device_nodes
    if fake_node is None:
        assert own == ("/dev/nvidia0", *MIG_1G_CAPS)
    expected = (*own, *cdi.CONTROL_NODES)
    assert paths == [(p, fake_node or p) for p in expected]


def test_cdi_allocate_of_a_mig_device_names_a_spec_device_with_its_caps(
    start_plugin: StartPlugin, cdi_root: Path, reference_dir: Path
) -> None:
    running = start_plugin(
        "a100-mig",
        mig_minors=A100_MIG_MINORS,
        mig_strategy=inventory.MigStrategy.MIXED,
        strategy=allocate.Strategy.CDI,
    )
    [resp] = allocate_ids(running.stub("nvidia.com/mig-1g.5gb"), [MIG_1G]).container_responses
    assert [c.name for c in resp.cdi_devices] == [f"{cdi.DEFAULT_KIND}={MIG_1G}"]
    spec = json.loads((cdi_root / "k8s.device-plugin.nvidia.com-gpu.json").read_text())
    validate(reference_dir, spec)
    [edits] = [d["containerEdits"] for d in spec["devices"] if d["name"] == MIG_1G]
    assert edits["deviceNodes"] == [{"path": p} for p in ("/dev/nvidia0", *MIG_1G_CAPS)]


def test_mig_device_without_caps_minors_is_unhealthy_and_refused(
    start_plugin: StartPlugin, open_stream: OpenStream
) -> None:
    minors = {k: v for k, v in A100_MIG_MINORS.items() if not k.startswith("gpu0/gi2/")}
    running = start_plugin("a100-mig", mig_minors=minors, mig_strategy=inventory.MigStrategy.MIXED)
    stub = running.stub("nvidia.com/mig-1g.5gb")
    listed = {d.ID: d.health for d in open_stream(stub).next().devices}
    assert listed == {MIG_1G: "Unhealthy", "MIG-fc559fab-019b-5d5a-bf07-2550fa068ee0": "Healthy"}
    with pytest.raises(grpc.RpcError) as err:
        allocate_ids(stub, [MIG_1G])
    assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "no capability minor for gpu0/gi2/access" in str(err.value.details())
    # The other MIG device of the same profile is still given out.
    [resp] = allocate_ids(stub, ["MIG-fc559fab-019b-5d5a-bf07-2550fa068ee0"]).container_responses
    assert len(resp.cdi_devices) == 1
