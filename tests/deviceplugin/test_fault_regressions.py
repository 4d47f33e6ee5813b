"""Regressions of issue 16, device plugin: ListAndWatch streams starved Allocate (defect 5),
and a huge bad device ID was echoed back until gRPC's metadata limit failed the call (12)."""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc

from dra_driver import grpcstreams
from dra_driver.pb.deviceplugin.v1beta1 import deviceplugin_pb2 as pb
from dra_driver.pb.deviceplugin.v1beta1 import deviceplugin_pb2_grpc as pb_grpc

from .conftest import StartPlugin, Stream
from .testkubelet import FakeKubelet


def test_open_list_and_watch_streams_never_block_allocate(
    start_plugin: StartPlugin,
    kubelet: FakeKubelet,
    open_stream: Callable[[pb_grpc.DevicePluginStub], Stream],
) -> None:
    running = start_plugin()
    kubelet.wait_requests(1)
    streams = [open_stream(running.stub()) for _ in range(12)]
    opened, refused = 0, 0
    for stream in streams:
        item = stream.items.get(timeout=20)
        if isinstance(item, pb.ListAndWatchResponse):
            opened += 1
        else:
            assert isinstance(item, grpc.RpcError)
            assert item.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "streams are open already" in (item.details() or "")
            refused += 1
    assert (opened, refused) == (grpcstreams.STREAM_SLOTS, 12 - grpcstreams.STREAM_SLOTS)
    stub = running.stub()
    for _ in range(8):  # more unary calls than the pool has threads, one after the other
        req = pb.AllocateRequest()
        req.container_requests.add(devices_ids=[running.uuids()[0]])
        assert stub.Allocate(req, timeout=10).container_responses[0].envs
    for stream in streams:
        stream.cancel()
    # The slots come back once the streams are gone (each notices within its poll interval).
    slots = running.app.endpoints["nvidia.com/gpu"].service.slots
    deadline = time.monotonic() + 20
    while slots.open and time.monotonic() < deadline:
        time.sleep(0.05)
    assert slots.open == 0
    assert open_stream(running.stub()).next(timeout=20).devices


def test_a_huge_unknown_device_id_gets_a_short_clear_error(
    start_plugin: StartPlugin, kubelet: FakeKubelet
) -> None:
    running = start_plugin()
    kubelet.wait_requests(1)
    stub = running.stub()
    bad = "GPU-" + "x" * 20_000
    req = pb.AllocateRequest()
    req.container_requests.add(devices_ids=[bad, running.uuids()[0]])
    try:
        stub.Allocate(req, timeout=10)
    except grpc.RpcError as exc:
        code, details = exc.code(), exc.details() or ""
    else:
        raise AssertionError("Allocate of an unknown device ID succeeded")
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details[:200])
    assert len(details) < 1024
    assert "devices_ids: unknown device ID 'GPU-xxxx" in details
    assert "(20004 characters)" in details
    many = pb.PreferredAllocationRequest()
    many.container_requests.add(
        available_deviceIDs=[f"bogus-{i}" for i in range(500)], allocation_size=1
    )
    try:
        stub.GetPreferredAllocation(many, timeout=10)
    except grpc.RpcError as exc:
        code, details = exc.code(), exc.details() or ""
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "'bogus-0'" in details and "and 492 more" in details and len(details) < 1024
