"""Checks the generated descriptors against the kubelet wire contract.

The kubelet only finds our services if package, service and method names are
exact, and it only understands our messages if field numbers and types match
(../shared/reference/contracts.md sections 1-4). The tables below are a
second, independent copy of that contract, not derived from our .proto files;
a last test sends one call per contract path through the generated stubs over
a real unix socket and records what arrives.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from google.protobuf import descriptor

from dra_driver.pb.deviceplugin.v1beta1 import deviceplugin_pb2, deviceplugin_pb2_grpc
from dra_driver.pb.dra.v1 import dra_pb2 as dra_v1
from dra_driver.pb.dra.v1 import dra_pb2_grpc as dra_v1_grpc
from dra_driver.pb.dra.v1beta1 import dra_pb2 as dra_v1beta1
from dra_driver.pb.dra.v1beta1 import dra_pb2_grpc as dra_v1beta1_grpc
from dra_driver.pb.dra_health.v1 import health_pb2 as health_v1
from dra_driver.pb.dra_health.v1 import health_pb2_grpc as health_v1_grpc
from dra_driver.pb.dra_health.v1alpha1 import health_pb2 as health_v1alpha1
from dra_driver.pb.dra_health.v1alpha1 import health_pb2_grpc as health_v1alpha1_grpc
from dra_driver.pb.pluginregistration.v1 import registration_pb2, registration_pb2_grpc

# message -> field -> (number, kind); kind spelled like contracts.md.
Fields = dict[str, dict[str, tuple[int, str]]]

_DRA_COMMON: Fields = {
    "Claim": {"namespace": (1, "string"), "uid": (2, "string"), "name": (3, "string")},
    "NodePrepareResourcesRequest": {"claims": (1, "rep Claim")},
    "NodePrepareResourcesResponse": {
        "claims": (1, "map<string, NodePrepareResourceResponse>"),
    },
    "NodePrepareResourceResponse": {"devices": (1, "rep Device"), "error": (2, "string")},
    "Device": {
        "request_names": (1, "rep string"),
        "pool_name": (2, "string"),
        "device_name": (3, "string"),
        "cdi_device_ids": (4, "rep string"),
    },
    "NodeUnprepareResourcesRequest": {"claims": (1, "rep Claim")},
    "NodeUnprepareResourcesResponse": {
        "claims": (1, "map<string, NodeUnprepareResourceResponse>"),
    },
    "NodeUnprepareResourceResponse": {"error": (1, "string")},
}
_DRA_V1: Fields = {
    **_DRA_COMMON,
    "Device": {**_DRA_COMMON["Device"], "share_id": (5, "opt string")},
}
_REGISTRATION: Fields = {
    "InfoRequest": {},
    "PluginInfo": {
        "type": (1, "string"),
        "name": (2, "string"),
        "endpoint": (3, "string"),
        "supported_versions": (4, "rep string"),
    },
    "RegistrationStatus": {"plugin_registered": (1, "bool"), "error": (2, "string")},
    "RegistrationStatusResponse": {},
}
_HEALTH: Fields = {
    "NodeWatchResourcesRequest": {},
    "NodeWatchResourcesResponse": {"devices": (1, "rep DeviceHealth")},
    "DeviceIdentifier": {"pool_name": (1, "string"), "device_name": (2, "string")},
    "DeviceHealth": {
        "device": (1, "DeviceIdentifier"),
        "health": (2, "HealthStatus"),
        "last_updated_time": (3, "int64"),
        "health_check_timeout_seconds": (4, "int64"),
        "message": (5, "string"),
    },
}
_DEVICE_PLUGIN: Fields = {
    "DevicePluginOptions": {
        "pre_start_required": (1, "bool"),
        "get_preferred_allocation_available": (2, "bool"),
    },
    "RegisterRequest": {
        "version": (1, "string"),
        "endpoint": (2, "string"),
        "resource_name": (3, "string"),
        "options": (4, "DevicePluginOptions"),
    },
    "Empty": {},
    "ListAndWatchResponse": {"devices": (1, "rep Device")},
    "TopologyInfo": {"nodes": (1, "rep NUMANode")},
    "NUMANode": {"ID": (1, "int64")},
    "Device": {"ID": (1, "string"), "health": (2, "string"), "topology": (3, "TopologyInfo")},
    "PreStartContainerRequest": {"devices_ids": (1, "rep string")},
    "PreStartContainerResponse": {},
    "PreferredAllocationRequest": {
        "container_requests": (1, "rep ContainerPreferredAllocationRequest"),
    },
    "ContainerPreferredAllocationRequest": {
        "available_deviceIDs": (1, "rep string"),
        "must_include_deviceIDs": (2, "rep string"),
        "allocation_size": (3, "int32"),
    },
    "PreferredAllocationResponse": {
        "container_responses": (1, "rep ContainerPreferredAllocationResponse"),
    },
    "ContainerPreferredAllocationResponse": {"deviceIDs": (1, "rep string")},
    "AllocateRequest": {"container_requests": (1, "rep ContainerAllocateRequest")},
    "ContainerAllocateRequest": {"devices_ids": (1, "rep string")},
    "CDIDevice": {"name": (1, "string")},
    "AllocateResponse": {"container_responses": (1, "rep ContainerAllocateResponse")},
    "ContainerAllocateResponse": {
        "envs": (1, "map<string, string>"),
        "mounts": (2, "rep Mount"),
        "devices": (3, "rep DeviceSpec"),
        "annotations": (4, "map<string, string>"),
        "cdi_devices": (5, "rep CDIDevice"),
    },
    "Mount": {
        "container_path": (1, "string"),
        "host_path": (2, "string"),
        "read_only": (3, "bool"),
    },
    "DeviceSpec": {
        "container_path": (1, "string"),
        "host_path": (2, "string"),
        "permissions": (3, "string"),
    },
}

MESSAGES: list[tuple[ModuleType, str, Fields]] = [
    (dra_v1, "k8s.io.kubelet.pkg.apis.dra.v1", _DRA_V1),
    (dra_v1beta1, "k8s.io.kubelet.pkg.apis.dra.v1beta1", _DRA_COMMON),
    (registration_pb2, "pluginregistration", _REGISTRATION),
    (health_v1alpha1, "v1alpha1", _HEALTH),
    (health_v1, "v1", _HEALTH),
    (deviceplugin_pb2, "v1beta1", _DEVICE_PLUGIN),
]

# module -> service full name -> method -> (request, response, server-streaming)
_DRA_METHODS = {
    "NodePrepareResources": (
        "NodePrepareResourcesRequest",
        "NodePrepareResourcesResponse",
        False,
    ),
    "NodeUnprepareResources": (
        "NodeUnprepareResourcesRequest",
        "NodeUnprepareResourcesResponse",
        False,
    ),
}
_HEALTH_METHODS = {
    "NodeWatchResources": ("NodeWatchResourcesRequest", "NodeWatchResourcesResponse", True),
}
SERVICES: list[tuple[ModuleType, dict[str, dict[str, tuple[str, str, bool]]]]] = [
    (dra_v1, {"k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin": _DRA_METHODS}),
    (dra_v1beta1, {"k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin": _DRA_METHODS}),
    (
        registration_pb2,
        {
            "pluginregistration.Registration": {
                "GetInfo": ("InfoRequest", "PluginInfo", False),
                "NotifyRegistrationStatus": (
                    "RegistrationStatus",
                    "RegistrationStatusResponse",
                    False,
                ),
            }
        },
    ),
    (health_v1alpha1, {"v1alpha1.DRAResourceHealth": _HEALTH_METHODS}),
    (health_v1, {"v1.DRAResourceHealth": _HEALTH_METHODS}),
    (
        deviceplugin_pb2,
        {
            "v1beta1.Registration": {"Register": ("RegisterRequest", "Empty", False)},
            "v1beta1.DevicePlugin": {
                "GetDevicePluginOptions": ("Empty", "DevicePluginOptions", False),
                "ListAndWatch": ("Empty", "ListAndWatchResponse", True),
                "GetPreferredAllocation": (
                    "PreferredAllocationRequest",
                    "PreferredAllocationResponse",
                    False,
                ),
                "Allocate": ("AllocateRequest", "AllocateResponse", False),
                "PreStartContainer": (
                    "PreStartContainerRequest",
                    "PreStartContainerResponse",
                    False,
                ),
            },
        },
    ),
]

# The paths the kubelet (or, for Register, our device plugin) puts on the wire.
WIRE_PATHS = [
    "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
    "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources",
    "/pluginregistration.Registration/GetInfo",
    "/v1alpha1.DRAResourceHealth/NodeWatchResources",
    "/v1.DRAResourceHealth/NodeWatchResources",
    "/v1beta1.DevicePlugin/ListAndWatch",
    "/v1beta1.Registration/Register",
]

_SCALARS = {
    descriptor.FieldDescriptor.TYPE_STRING: "string",
    descriptor.FieldDescriptor.TYPE_BOOL: "bool",
    descriptor.FieldDescriptor.TYPE_INT32: "int32",
    descriptor.FieldDescriptor.TYPE_INT64: "int64",
}


def _type_name(field: descriptor.FieldDescriptor) -> str:
    if field.message_type is not None:
        return field.message_type.name
    if field.enum_type is not None:
        return field.enum_type.name
    return _SCALARS.get(field.type, f"type#{field.type}")


def _kind(field: descriptor.FieldDescriptor) -> str:
    entry = field.message_type
    if entry is not None and entry.GetOptions().map_entry:
        key, value = entry.fields_by_name["key"], entry.fields_by_name["value"]
        return f"map<{_type_name(key)}, {_type_name(value)}>"
    if field.is_repeated:
        return f"rep {_type_name(field)}"
    # None of our messages has a real oneof, so any oneof is proto3 `optional`.
    if field.containing_oneof is not None:
        return f"opt {_type_name(field)}"
    return _type_name(field)


@pytest.mark.parametrize(
    ("module", "package", "expected"), MESSAGES, ids=[package for _, package, _ in MESSAGES]
)
def test_messages_and_field_numbers_match_the_contract(
    module: ModuleType, package: str, expected: Fields
) -> None:
    file_desc: descriptor.FileDescriptor = module.DESCRIPTOR
    assert file_desc.package == package
    assert set(file_desc.message_types_by_name) == set(expected)
    for msg_name, fields in expected.items():
        msg = file_desc.message_types_by_name[msg_name]
        actual = {f.name: (f.number, _kind(f)) for f in msg.fields}
        assert actual == fields, f"{package}.{msg_name}"


def test_share_id_is_proto3_optional_in_v1_only() -> None:
    share_id = dra_v1.Device.DESCRIPTOR.fields_by_name["share_id"]
    assert share_id.number == 5
    assert share_id.has_presence
    device = dra_v1.Device(pool_name="node-a", device_name="gpu-0")
    assert not device.HasField("share_id")
    device.share_id = ""
    assert device.HasField("share_id")  # presence is tracked even for ""
    assert "share_id" not in dra_v1beta1.Device.DESCRIPTOR.fields_by_name


@pytest.mark.parametrize("module", [health_v1alpha1, health_v1], ids=["v1alpha1", "v1"])
def test_health_status_enum_values(module: ModuleType) -> None:
    enum = module.DESCRIPTOR.enum_types_by_name["HealthStatus"]
    assert {v.name: v.number for v in enum.values} == {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}


def test_services_and_methods_match_the_contract() -> None:
    paths: set[str] = set()
    for module, services in SERVICES:
        file_desc: descriptor.FileDescriptor = module.DESCRIPTOR
        actual = {s.full_name for s in file_desc.services_by_name.values()}
        assert actual == set(services), file_desc.name
        for full_name, methods in services.items():
            service = file_desc.services_by_name[full_name.rsplit(".", 1)[1]]
            got = {
                m.name: (m.input_type.name, m.output_type.name, m.server_streaming)
                for m in service.methods
            }
            assert got == methods, full_name
            assert not any(m.client_streaming for m in service.methods), full_name
            paths.update(f"/{service.full_name}/{m.name}" for m in service.methods)
    assert set(WIRE_PATHS) <= paths


def _call_all(channel: grpc.Channel) -> Iterator[Callable[[], Any]]:
    """One zero-argument call per WIRE_PATHS entry, through the generated stubs."""
    yield lambda: dra_v1_grpc.DRAPluginStub(channel).NodePrepareResources(
        dra_v1.NodePrepareResourcesRequest()
    )
    yield lambda: dra_v1beta1_grpc.DRAPluginStub(channel).NodeUnprepareResources(
        dra_v1beta1.NodeUnprepareResourcesRequest()
    )
    yield lambda: registration_pb2_grpc.RegistrationStub(channel).GetInfo(
        registration_pb2.InfoRequest()
    )
    yield lambda: list(
        health_v1alpha1_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
            health_v1alpha1.NodeWatchResourcesRequest()
        )
    )
    yield lambda: list(
        health_v1_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
            health_v1.NodeWatchResourcesRequest()
        )
    )
    yield lambda: list(
        deviceplugin_pb2_grpc.DevicePluginStub(channel).ListAndWatch(deviceplugin_pb2.Empty())
    )
    yield lambda: deviceplugin_pb2_grpc.RegistrationStub(channel).Register(
        deviceplugin_pb2.RegisterRequest()
    )


if TYPE_CHECKING:
    _Handler = grpc.GenericRpcHandler[Any, Any]
else:  # the runtime class is not generic
    _Handler = grpc.GenericRpcHandler


class _Recorder(_Handler):
    """Records each method path that reaches the server; serves nothing."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self._lock = threading.Lock()

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> None:
        with self._lock:
            self.seen.append(handler_call_details.method)


def test_stubs_put_the_contract_paths_on_the_wire(tmp_path: Path) -> None:
    recorder = _Recorder()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=[recorder])
    address = f"unix://{tmp_path / 'wire.sock'}"
    server.add_insecure_port(address)
    server.start()
    try:
        with grpc.insecure_channel(address) as channel:
            for call in _call_all(channel):
                with pytest.raises(grpc.RpcError) as err:
                    call()
                assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        server.stop(grace=None)
    assert recorder.seen == WIRE_PATHS
