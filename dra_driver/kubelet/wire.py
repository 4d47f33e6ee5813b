"""The kubelet's gRPC messages for the node agent, read and written by hand (issue 46).

Why it exists: the agent serves three small APIs to the kubelet — DRA (v1, v1beta1), the DRA
health stream (v1, v1alpha1) and plugin registration — whose messages are a few strings, a bool
and two integers. Serving them through the generated ``*_pb2`` modules loads the protobuf
runtime (``google.protobuf``'s descriptor pool, ``python_message``, ``text_format``, the upb
extension): ~1.9 MiB of every agent's RSS, on every GPU node of a fleet, for messages this
module encodes in a page. The ``.proto`` files under ``proto/`` stay the contract, and the
generated modules stay for the test kit's kubelet and the device-plugin mode;
``tests/kubelet/test_wire.py`` checks this codec against them both ways (random messages,
unknown fields, malformed bytes).

Decoding follows protobuf: fields in any order, unknown fields skipped (so is a known field of
an unexpected wire type: protobuf keeps it as an unknown field), the last value of a singular
field kept, strings checked as UTF-8; malformed bytes raise :class:`ValueError`
(gRPC then fails the call, as it does when a generated parser raises). Encoding writes fields in
field-number order and leaves out proto3 defaults (empty strings, 0, false), as protobuf does.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

import grpc

from dra_driver import records

# Wire types (protobuf encoding): varint, 64-bit, length-delimited, 32-bit.
VARINT, I64, LEN, I32 = 0, 1, 2, 5

HEALTH_UNKNOWN, HEALTHY, UNHEALTHY = 0, 1, 2  # HealthStatus (dra_health v1 and v1alpha1)


# ---------------------------------------------------------------- decoding


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise ValueError("varint longer than 10 bytes")


def fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """``(field number, wire type, value)`` for each field of a message: an ``int`` for varint
    and fixed-width fields, the payload ``bytes`` for length-delimited ones."""
    pos, end = 0, len(data)
    while pos < end:
        key, pos = _varint(data, pos)
        number, kind = key >> 3, key & 7
        if number == 0:
            raise ValueError("field number 0")
        value: int | bytes
        if kind == VARINT:
            value, pos = _varint(data, pos)
        elif kind == LEN:
            size, pos = _varint(data, pos)
            if pos + size > end:
                raise ValueError("truncated length-delimited field")
            value, pos = data[pos : pos + size], pos + size
        elif kind in (I64, I32):
            width = 8 if kind == I64 else 4
            if pos + width > end:
                raise ValueError("truncated fixed-width field")
            value, pos = int.from_bytes(data[pos : pos + width], "little"), pos + width
        else:  # groups (3, 4) are proto2 only; 6 and 7 do not exist
            raise ValueError(f"unsupported wire type {kind}")
        yield number, kind, value


def _payload(kind: int, value: int | bytes) -> bytes | None:
    """A length-delimited field's bytes; None for another wire type (an unknown field)."""
    return value if kind == LEN and isinstance(value, bytes) else None


@records.record
class Claim:
    """``Claim`` of the DRA API (both versions)."""

    namespace: str = ""
    uid: str = ""
    name: str = ""


@records.record
class ClaimsRequest:
    """``NodePrepareResourcesRequest`` / ``NodeUnprepareResourcesRequest``: the claims."""

    claims: tuple[Claim, ...] = ()


def decode_claim(data: bytes) -> Claim:
    got = {1: "", 2: "", 3: ""}
    for number, kind, value in fields(data):
        if number in got and (payload := _payload(kind, value)) is not None:
            got[number] = payload.decode("utf-8")
    return Claim(namespace=got[1], uid=got[2], name=got[3])


def decode_claims_request(data: bytes) -> ClaimsRequest:
    """A prepare or unprepare request (the two have the same fields)."""
    claims = []
    for number, kind, value in fields(data):
        if number == 1 and (payload := _payload(kind, value)) is not None:
            claims.append(decode_claim(payload))
    return ClaimsRequest(claims=tuple(claims))


@records.record
class RegistrationStatus:
    """``pluginregistration.RegistrationStatus``: the kubelet's verdict."""

    plugin_registered: bool = False
    error: str = ""


def decode_registration_status(data: bytes) -> RegistrationStatus:
    registered, error = False, ""
    for number, kind, value in fields(data):
        if number == 1 and kind == VARINT:
            registered = bool(value)
        elif number == 2 and (payload := _payload(kind, value)) is not None:
            error = payload.decode("utf-8")
    return RegistrationStatus(plugin_registered=registered, error=error)


@records.record
class Empty:
    """A message without fields (``InfoRequest``, ``NodeWatchResourcesRequest``,
    ``RegistrationStatusResponse``)."""


EMPTY = Empty()


def decode_empty(data: bytes) -> Empty:
    """A request without fields: only checked to be well-formed, unknown fields skipped. Not
    None: gRPC takes a None from a request deserializer for a failed one."""
    for _ in fields(data):
        pass
    return EMPTY


# ---------------------------------------------------------------- encoding


def _uvarint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int64: two's complement, ten bytes
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _len(number: int, payload: bytes) -> bytes:
    return _uvarint(number << 3 | LEN) + _uvarint(len(payload)) + payload


def _string(number: int, value: str) -> bytes:
    """A singular string: left out when empty (its proto3 default)."""
    return _len(number, value.encode("utf-8")) if value else b""


def _strings(number: int, values: Iterable[str]) -> bytes:
    """A repeated string: every element, empty ones too."""
    return b"".join(_len(number, v.encode("utf-8")) for v in values)


def _number(number: int, value: int) -> bytes:
    return _uvarint(number << 3 | VARINT) + _uvarint(value) if value else b""


@records.record
class Device:
    """``Device`` of a prepared claim (``share_id``: DRA v1 only; None = not set)."""

    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None


def encode_device(device: Device) -> bytes:
    out = _strings(1, device.request_names)
    out += _string(2, device.pool_name) + _string(3, device.device_name)
    out += _strings(4, device.cdi_device_ids)
    if device.share_id is not None:  # proto3 ``optional``: present even when empty
        out += _len(5, device.share_id.encode("utf-8"))
    return out


@records.record
class Prepared:
    """``NodePrepareResourceResponse``: one claim's devices, or its error."""

    devices: tuple[Device, ...] = ()
    error: str = ""


def encode_prepare_response(claims: dict[str, Prepared]) -> bytes:
    """``NodePrepareResourcesResponse``: ``map<string, NodePrepareResourceResponse>``, each
    entry a message of key (1) and value (2)."""
    out = []
    for uid, answer in claims.items():
        value = b"".join(_len(1, encode_device(d)) for d in answer.devices)
        value += _string(2, answer.error)
        out.append(_len(1, _len(1, uid.encode("utf-8")) + _len(2, value)))
    return b"".join(out)


def encode_unprepare_response(claims: dict[str, str]) -> bytes:
    """``NodeUnprepareResourcesResponse``: claim UID → its error ("" = unprepared)."""
    return b"".join(
        _len(1, _len(1, uid.encode("utf-8")) + _len(2, _string(1, error)))
        for uid, error in claims.items()
    )


@records.record
class PluginInfo:
    """``pluginregistration.PluginInfo``."""

    type: str
    name: str
    endpoint: str
    supported_versions: tuple[str, ...]


def encode_plugin_info(info: PluginInfo) -> bytes:
    out = _string(1, info.type) + _string(2, info.name) + _string(3, info.endpoint)
    return out + _strings(4, info.supported_versions)


def encode_empty(_: Empty) -> bytes:
    """``RegistrationStatusResponse``: no fields."""
    return b""


@records.record
class DeviceHealth:
    """``DeviceHealth`` of the health stream (identical in v1 and v1alpha1)."""

    pool_name: str
    device_name: str
    health: int
    last_updated_time: int
    health_check_timeout_seconds: int
    message: str


def encode_health_list(devices: Sequence[DeviceHealth]) -> bytes:
    """``NodeWatchResourcesResponse``: every device's health."""
    out = []
    for d in devices:
        ident = _string(1, d.pool_name) + _string(2, d.device_name)
        body = _len(1, ident) + _number(2, d.health) + _number(3, d.last_updated_time)
        body += _number(4, d.health_check_timeout_seconds) + _string(5, d.message)
        out.append(_len(1, body))
    return b"".join(out)


# ---------------------------------------------------------------- serving


class Method(Protocol):
    def __call__(self, request: Any, context: grpc.ServicerContext) -> Any: ...


def unary(method: Method, decode: Any, encode: Any) -> grpc.RpcMethodHandler[Any, Any]:
    return grpc.unary_unary_rpc_method_handler(
        method, request_deserializer=decode, response_serializer=encode
    )


def streaming(method: Method, decode: Any, encode: Any) -> grpc.RpcMethodHandler[Any, Any]:
    return grpc.unary_stream_rpc_method_handler(
        method, request_deserializer=decode, response_serializer=encode
    )


def add_service(
    server: grpc.Server, name: str, methods: Iterable[tuple[str, grpc.RpcMethodHandler[Any, Any]]]
) -> None:
    """Serve ``methods`` as the service ``name`` (its full protobuf name), as the generated
    ``add_*Servicer_to_server`` functions do: a generic handler and the registered methods."""
    table = dict(methods)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, table),))
    register = getattr(server, "add_registered_method_handlers", None)  # not in grpc's stubs
    if register is not None:
        register(name, table)
