"""The servicer's answers as the kubelet reads them: exact error text per container request,
its log lines, ListAndWatch's resends and waits, and the worker pool under open streams."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from dra_driver import grpcstreams
from dra_driver.deviceplugin import allocate, registrar
from dra_driver.devices import health
from dra_driver.pb.deviceplugin.v1beta1 import deviceplugin_pb2 as pb
from dra_driver.pb.deviceplugin.v1beta1 import deviceplugin_pb2_grpc as pb_grpc

from .conftest import Events, StartPlugin, Stream, events_named
from .test_service import allocate_ids

OpenStream = Callable[[pb_grpc.DevicePluginStub], Stream]
SPEC = "k8s.device-plugin.nvidia.com-gpu.json"


def rpc_error(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value


def test_preferred_allocation_errors_name_the_container_and_are_logged(
    start_plugin: StartPlugin, logged: Events
) -> None:
    running = start_plugin("pcie-l4")
    u = running.uuids()
    req = pb.PreferredAllocationRequest()
    req.container_requests.add(available_deviceIDs=u, allocation_size=1)
    req.container_requests.add(available_deviceIDs=u, allocation_size=5)
    err = rpc_error(lambda: running.stub().GetPreferredAllocation(req, timeout=5))
    want = (
        "nvidia.com/gpu: container_requests[1]: allocation_size 5 is larger than the 4 "
        "available devices of resource nvidia.com/gpu"
    )
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == want
    [warning] = events_named(logged, "GetPreferredAllocation rejected")
    assert warning["error"] == want and warning["log_level"] == "warning"
    assert warning["resource"] == "nvidia.com/gpu"
    [answered] = events_named(logged, "preferred allocation")  # the first container's answer
    assert answered["container"] == 0 and answered["size"] == 1
    # One GPU: gpu-2 (NUMA node 1, its own PCIe root), which keeps the best pair gpu-0/gpu-1
    # (one switch) whole.
    assert answered["devices"] == [u[2]] and answered["resource"] == "nvidia.com/gpu"

    must = pb.PreferredAllocationRequest()
    must.container_requests.add(
        available_deviceIDs=u, must_include_deviceIDs=["bogus"], allocation_size=1
    )
    err = rpc_error(lambda: running.stub().GetPreferredAllocation(must, timeout=5))
    assert err.details() == (
        "nvidia.com/gpu: container_requests[0]: must_include_deviceIDs: unknown device ID "
        "'bogus' for resource nvidia.com/gpu (this node lists 4 devices)"
    )


def test_allocate_errors_name_the_container_and_are_logged(
    start_plugin: StartPlugin, logged: Events
) -> None:
    running = start_plugin("pcie-l4")
    u = running.uuids()
    stub = running.stub()
    running.board.mark_unhealthy(u[1], "XID 79")
    running.board.mark_unhealthy(u[2], "XID 48")
    err = rpc_error(lambda: allocate_ids(stub, [u[0]], [u[2], u[3], u[1]]))
    want = (
        f"nvidia.com/gpu: container_requests[1]: devices_ids: unhealthy device(s) "
        f"{u[2]} ({u[2]}: XID 48), {u[1]} ({u[1]}: XID 79)"
    )
    assert err.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert err.details() == want
    err = rpc_error(lambda: allocate_ids(stub, [u[0]], [u[3]], []))
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == "nvidia.com/gpu: container_requests[2]: devices_ids is empty"
    rejected = events_named(logged, "Allocate rejected")
    assert [e["error"] for e in rejected] == [
        want,
        "nvidia.com/gpu: container_requests[2]: devices_ids is empty",
    ]
    assert {e["log_level"] for e in rejected} == {"warning"}


def test_allocate_logs_each_container(start_plugin: StartPlugin, logged: Events) -> None:
    running = start_plugin("pcie-l4", strategy=allocate.Strategy.CDI)
    u = running.uuids()
    allocate_ids(running.stub(), [u[2], u[0]], [u[3]])
    allocated = events_named(logged, "allocated")
    assert [(e["container"], e["devices"], e["cdi_devices"]) for e in allocated] == [
        (0, [u[2], u[0]], [f"k8s.device-plugin.nvidia.com/gpu={x}" for x in (u[2], u[0])]),
        (1, [u[3]], [f"k8s.device-plugin.nvidia.com/gpu={u[3]}"]),
    ]
    assert {e["resource"] for e in allocated} == {"nvidia.com/gpu"}


@pytest.mark.parametrize("extra", [0, 1])
def test_long_error_details_are_cut_at_2048_characters(
    start_plugin: StartPlugin, extra: int, logged: Events
) -> None:
    running = start_plugin("pcie-l4")
    u = running.uuids()
    head = (
        f"nvidia.com/gpu: container_requests[0]: devices_ids: unhealthy device(s) {u[0]} ({u[0]}: "
    )
    reason = "r" * (2048 + extra - len(head) - 1)
    running.board.mark_unhealthy(u[0], reason)
    full = f"{head}{reason})"
    assert len(full) == 2048 + extra
    err = rpc_error(lambda: allocate_ids(running.stub(), [u[0]]))
    want = full if not extra else full[:2048] + "..."
    assert err.details() == want
    [warning] = events_named(logged, "Allocate rejected")
    assert warning["error"] == want


def test_envvar_allocate_never_writes_the_cdi_spec(
    start_plugin: StartPlugin, cdi_root: Path
) -> None:
    running = start_plugin("pcie-l4", strategy=allocate.Strategy.ENVVAR)
    allocate_ids(running.stub(), running.uuids()[:1])
    assert not (cdi_root / SPEC).exists()


def test_a_cdi_spec_that_cannot_be_written_fails_allocate_with_internal(
    start_plugin: StartPlugin, cdi_root: Path, logged: Events
) -> None:
    running = start_plugin("pcie-l4", strategy=allocate.Strategy.CDI)
    (cdi_root / SPEC).unlink()
    cdi_root.rmdir()
    cdi_root.write_text("not a directory")
    err = rpc_error(lambda: allocate_ids(running.stub(), running.uuids()[:1]))
    want = f"cannot write CDI spec {cdi_root / SPEC}: File exists"  # mkdir of cdi_root
    assert err.code() is grpc.StatusCode.INTERNAL
    assert err.details() == want
    [event] = events_named(logged, "CDI spec missing and cannot be written")
    assert event["error"] == want and event["log_level"] == "error"


def test_list_and_watch_logs_its_start_changes_and_end(
    start_plugin: StartPlugin, open_stream: OpenStream, logged: Events
) -> None:
    running = start_plugin("pcie-l4")
    u = running.uuids()
    running.board.mark_unhealthy(u[3], "XID 79")
    stream = open_stream(running.stub())
    stream.next()
    running.board.mark_unhealthy(u[1], "XID 48")
    stream.next()
    running.app.endpoints["nvidia.com/gpu"].service.stop()  # ends the stream from our side
    ended = threading.Event()

    def wait_end() -> None:
        while not events_named(logged, "ListAndWatch ended"):
            if ended.wait(0.02):
                return

    waiter = threading.Thread(target=wait_end)
    waiter.start()
    waiter.join(timeout=10)
    ended.set()
    [started] = events_named(logged, "ListAndWatch started")
    assert (started["devices"], started["unhealthy"]) == (4, 1)
    assert started["resource"] == "nvidia.com/gpu"
    [changed] = events_named(logged, "device health changed, sending list")
    assert changed["unhealthy"] == [u[1], u[3]]
    [end] = events_named(logged, "ListAndWatch ended")
    assert end["resource"] == "nvidia.com/gpu" and end["log_level"] == "info"


class RecordingHealth:
    """A HealthBoard that records the versions ListAndWatch waits on."""

    def __init__(self) -> None:
        self.board = health.HealthBoard()
        self.waited: list[object] = []

    def snapshot(self) -> health.Snapshot:
        return self.board.snapshot()

    def wait_changed(self, version: int, timeout: float) -> health.Snapshot:
        self.waited.append(version)
        return self.board.wait_changed(version, timeout)


def test_list_and_watch_waits_for_a_change_after_the_version_it_sent(
    start_plugin: StartPlugin, open_stream: OpenStream
) -> None:
    running = start_plugin("pcie-l4")
    recording = RecordingHealth()
    svc = running.app.endpoints["nvidia.com/gpu"].service
    svc._health = recording  # the stream below reads this source
    stream = open_stream(running.stub())
    stream.next()
    recording.board.mark_unhealthy(running.uuids()[0])
    assert stream.next().devices[0].health == "Unhealthy"
    stream.cancel()
    assert recording.waited[0] == 0  # the version of the list it sent first
    recording.board.close()


def test_a_refused_stream_names_the_resource(
    start_plugin: StartPlugin, open_stream: OpenStream
) -> None:
    running = start_plugin("pcie-l4")
    streams = [open_stream(running.stub()) for _ in range(grpcstreams.STREAM_SLOTS)]
    for stream in streams:
        stream.next()
    extra = open_stream(running.stub())
    item = extra.items.get(timeout=10)
    assert isinstance(item, grpc.RpcError)
    assert item.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert item.details() == (
        "nvidia.com/gpu ListAndWatch: 4 streams are open already; try again later"
    )


class GatedHealth(RecordingHealth):
    """``snapshot`` (Allocate calls it once) waits, once armed, until ``parties`` callers are
    inside at the same time; it records which threads served them."""

    def __init__(self, parties: int) -> None:
        super().__init__()
        self.barrier = threading.Barrier(parties, timeout=10)
        self.armed = False
        self.threads: list[str] = []

    def snapshot(self) -> health.Snapshot:
        if self.armed:
            self.threads.append(threading.current_thread().name)
            self.barrier.wait()
        return self.board.snapshot()


def test_unary_calls_run_side_by_side_while_every_stream_slot_is_taken(
    start_plugin: StartPlugin, open_stream: OpenStream
) -> None:
    running = start_plugin("pcie-l4")
    gated = GatedHealth(registrar.UNARY_WORKERS)
    running.app.endpoints["nvidia.com/gpu"].service._health = gated
    streams = [open_stream(running.stub()) for _ in range(grpcstreams.STREAM_SLOTS)]
    for stream in streams:
        stream.next()
    gated.armed = True
    stub = running.stub()
    u = running.uuids()
    results: list[object] = []

    def call() -> None:
        try:
            results.append(allocate_ids(stub, [u[0]]))
        except grpc.RpcError as exc:
            results.append(exc)

    callers = [threading.Thread(target=call) for _ in range(registrar.UNARY_WORKERS)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(timeout=30)
    assert all(isinstance(r, pb.AllocateResponse) for r in results), results
    assert len(results) == registrar.UNARY_WORKERS
    assert all(name.startswith("dp-nvidia.com/gpu") for name in gated.threads), gated.threads
    gated.board.close()


def test_the_spec_on_disk_is_the_one_allocate_names(
    start_plugin: StartPlugin, cdi_root: Path
) -> None:
    running = start_plugin("pcie-l4", strategy=allocate.Strategy.CDI, fake_node="/dev/null")
    spec = json.loads((cdi_root / SPEC).read_text())
    [resp] = allocate_ids(running.stub(), running.uuids()[:1]).container_responses
    [name] = [c.name for c in resp.cdi_devices]
    kind, _, device = name.partition("=")
    assert spec["kind"] == kind
    [entry] = [d for d in spec["devices"] if d["name"] == device]
    assert entry["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia0", "hostPath": "/dev/null"}
    ]
