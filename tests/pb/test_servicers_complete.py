"""Every method of every kubelet API we serve is answered by our own code.

The device plugin's servicer subclasses the generated ``*_pb2_grpc.py`` base, whose methods
answer ``NotImplementedError``; this test makes sure none of ours falls back to one of those
defaults. The node agent's services (DRA v1 and v1beta1, the health stream in both versions,
registration) are served without the protobuf runtime (``dra_driver.kubelet.wire``): for them,
the services and methods our code registers on a server must be exactly those the generated
``add_*Servicer_to_server`` functions register, each with the same streaming shape.
"""

from __future__ import annotations

import inspect
from typing import Any
from unittest import mock

import pytest

from dra_driver import logs
from dra_driver.deviceplugin import service
from dra_driver.kubelet import dra_service, health_service, registration
from dra_driver.pb.dra.v1 import dra_pb2_grpc as dra_v1_grpc
from dra_driver.pb.dra.v1beta1 import dra_pb2_grpc as dra_v1beta1_grpc
from dra_driver.pb.dra_health.v1 import health_pb2_grpc as health_v1_grpc
from dra_driver.pb.dra_health.v1alpha1 import health_pb2_grpc as health_v1alpha1_grpc
from dra_driver.pb.pluginregistration.v1 import registration_pb2_grpc

OURS = [
    cls
    for _, cls in inspect.getmembers(service, inspect.isclass)
    if cls.__module__ == service.__name__
    and any(b.__module__.startswith("dra_driver.pb") for b in cls.__mro__[1:])
]


def test_the_device_plugin_has_a_servicer() -> None:
    assert [c.__name__ for c in OURS] == ["DevicePluginService"]


@pytest.mark.parametrize("cls", OURS, ids=lambda c: c.__name__)
def test_no_method_falls_back_to_the_generated_default(cls: type) -> None:
    for base in cls.__mro__[1:]:
        if not base.__module__.startswith("dra_driver.pb"):
            continue
        missing = [
            name
            for name, member in vars(base).items()
            if callable(member) and not name.startswith("_") and getattr(cls, name) is member
        ]
        assert missing == [], f"{cls.__name__} leaves {missing} to {base.__name__}"


class Recorder:
    """A ``grpc.Server`` stand-in that keeps what is registered on it."""

    def __init__(self) -> None:
        self.generic: dict[str, dict[str, tuple[bool, bool]]] = {}
        self.registered: dict[str, dict[str, tuple[bool, bool]]] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        for handler in handlers:
            self.generic[handler.service_name()] = shapes(handler._method_handlers)

    def add_registered_method_handlers(self, name: str, table: Any) -> None:
        self.registered[name] = shapes(table)


def shapes(table: Any) -> dict[str, tuple[bool, bool]]:
    return {m: (h.request_streaming, h.response_streaming) for m, h in table.items()}


def generated() -> Recorder:
    rec = Recorder()
    for add in (
        dra_v1_grpc.add_DRAPluginServicer_to_server,
        dra_v1beta1_grpc.add_DRAPluginServicer_to_server,
        health_v1_grpc.add_DRAResourceHealthServicer_to_server,
        health_v1alpha1_grpc.add_DRAResourceHealthServicer_to_server,
        registration_pb2_grpc.add_RegistrationServicer_to_server,
    ):
        add(mock.Mock(), rec)  # type: ignore[arg-type]
    return rec


def test_the_agent_registers_exactly_the_generated_services_and_methods() -> None:
    ours = Recorder()
    log = logs.get("test")
    dra_service.add_services(ours, plugin=mock.Mock(), log=log)  # type: ignore[arg-type]
    health_service.add_services(ours, streams=mock.Mock())  # type: ignore[arg-type]
    registration.RegistrationService(driver_name="d", endpoint="/e", log=log).add_to(
        ours  # type: ignore[arg-type]
    )
    want = generated()
    assert len(want.generic) == 5
    assert ours.generic == want.generic
    assert ours.registered == want.registered
