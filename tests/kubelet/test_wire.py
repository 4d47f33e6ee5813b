"""The agent's hand-written kubelet messages (``dra_driver.kubelet.wire``) against the generated
protobuf code, both ways: what the kubelet's protobuf writes, we read (unknown fields and field
order included), and what we write, its protobuf reads back field for field. Malformed bytes are
refused with ValueError, as the generated parsers refuse them."""

from __future__ import annotations

import dataclasses
import random
import string

import pytest

from dra_driver.kubelet import wire
from dra_driver.pb.dra.v1 import dra_pb2 as v1
from dra_driver.pb.dra.v1beta1 import dra_pb2 as v1beta1
from dra_driver.pb.dra_health.v1 import health_pb2 as health_v1
from dra_driver.pb.dra_health.v1alpha1 import health_pb2 as health_v1alpha1
from dra_driver.pb.pluginregistration.v1 import registration_pb2

ALPHABET = string.ascii_letters + string.digits + "-./ é€😀"


def text(rng: random.Random, empty: bool = True) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0 if empty else 1, 40)))


@pytest.mark.parametrize("pb", [v1, v1beta1], ids=["v1", "v1beta1"])
@pytest.mark.parametrize("seed", range(20))
def test_prepare_and_unprepare_requests_read_as_protobuf_wrote_them(pb: object, seed: int) -> None:
    rng = random.Random(seed)
    claims = [(text(rng), text(rng), text(rng)) for _ in range(rng.randint(0, 6))]
    for kind in ("NodePrepareResourcesRequest", "NodeUnprepareResourcesRequest"):
        request = getattr(pb, kind)()
        for namespace, uid, name in claims:
            request.claims.add(namespace=namespace, uid=uid, name=name)
        got = wire.decode_claims_request(request.SerializeToString())
        assert [(c.namespace, c.uid, c.name) for c in got.claims] == claims


def test_unknown_fields_are_skipped_and_field_order_does_not_matter() -> None:
    # A field 9 of each wire type inside the claim and beside it, and the fields reversed.
    extra = b"\x48\x05" + b"\x49" + bytes(8) + b"\x4a\x02hi" + b"\x4d" + bytes(4)
    body = b"\x1a\x01c" + b"\x12\x03u-1" + extra + b"\x0a\x04team"
    data = b"\x0a" + bytes([len(body)]) + body + extra
    theirs = v1.NodePrepareResourcesRequest.FromString(data).claims  # as protobuf reads it
    assert [(c.namespace, c.uid, c.name) for c in theirs] == [("team", "u-1", "c")]
    got = wire.decode_claims_request(data)
    assert got.claims == (wire.Claim(namespace="team", uid="u-1", name="c"),)


@pytest.mark.parametrize(
    "data",
    [
        b"\x0a\x05\x12\x03ab",  # a claim longer than the message
        b"\x0a\x03\x12\x05abc",  # a uid longer than the claim
        b"\x0a\x03\x12\x01\xff",  # not UTF-8
        b"\x0b",  # a group (wire type 3)
        b"\x08\xff\xff",  # a truncated varint
        b"\x00\x01",  # field number 0
    ],
)
def test_malformed_requests_are_refused(data: bytes) -> None:
    with pytest.raises(Exception):  # noqa: B017 - protobuf raises its DecodeError
        v1.NodePrepareResourcesRequest.FromString(data)
    with pytest.raises(ValueError):
        wire.decode_claims_request(data)


@pytest.mark.parametrize("seed", range(20))
def test_prepare_responses_read_back_by_protobuf(seed: int) -> None:
    rng = random.Random(seed)
    answers: dict[str, wire.Prepared] = {}
    for _ in range(rng.randint(0, 5)):
        if rng.random() < 0.3:
            answers[text(rng, empty=False)] = wire.Prepared(error=text(rng, empty=False))
            continue
        devices = tuple(
            wire.Device(
                request_names=tuple(text(rng) for _ in range(rng.randint(0, 3))),
                pool_name=text(rng),
                device_name=text(rng),
                cdi_device_ids=tuple(text(rng) for _ in range(rng.randint(0, 3))),
                share_id=rng.choice([None, "", text(rng, empty=False)]),
            )
            for _ in range(rng.randint(0, 4))
        )
        answers[text(rng, empty=False)] = wire.Prepared(devices=devices)
    data = wire.encode_prepare_response(answers)
    parsed = v1.NodePrepareResourcesResponse.FromString(data)
    assert set(parsed.claims) == set(answers)
    for uid, answer in answers.items():
        entry = parsed.claims[uid]
        assert entry.error == answer.error
        assert len(entry.devices) == len(answer.devices)
        for out, device in zip(entry.devices, answer.devices, strict=True):
            assert list(out.request_names) == list(device.request_names)
            assert list(out.cdi_device_ids) == list(device.cdi_device_ids)
            assert (out.pool_name, out.device_name) == (device.pool_name, device.device_name)
            assert out.HasField("share_id") == (device.share_id is not None)
            assert out.share_id == (device.share_id or "")
    # Byte for byte what protobuf writes for the same message (one claim: map order aside).
    if len(answers) == 1:
        assert parsed.SerializeToString(deterministic=True) == data


def test_a_v1beta1_kubelet_reads_a_v1beta1_response() -> None:
    device = wire.Device(("gpu",), "n1", "gpu-0", ("k8s.gpu.nvidia.com/claim=x",))
    data = wire.encode_prepare_response({"u": wire.Prepared(devices=(device,))})
    got = v1beta1.NodePrepareResourcesResponse.FromString(data).claims["u"].devices[0]
    assert (got.device_name, list(got.cdi_device_ids)) == ("gpu-0", ["k8s.gpu.nvidia.com/claim=x"])


def test_unprepare_responses_read_back_by_protobuf() -> None:
    answers = {"a": "", "b": "claim team/b: busy", "c€": ""}
    parsed = v1.NodeUnprepareResourcesResponse.FromString(wire.encode_unprepare_response(answers))
    assert {uid: e.error for uid, e in parsed.claims.items()} == answers


def test_registration_messages() -> None:
    info = wire.PluginInfo("DRAPlugin", "gpu.nvidia.com", "/p/dra.sock", ("v1.DRAPlugin", "", "x"))
    parsed = registration_pb2.PluginInfo.FromString(wire.encode_plugin_info(info))
    assert parsed.type == "DRAPlugin" and parsed.name == "gpu.nvidia.com"
    assert parsed.endpoint == "/p/dra.sock"
    assert list(parsed.supported_versions) == ["v1.DRAPlugin", "", "x"]
    for registered, error in ((True, ""), (False, "driver name taken"), (False, "")):
        status = registration_pb2.RegistrationStatus(plugin_registered=registered, error=error)
        got = wire.decode_registration_status(status.SerializeToString())
        assert got == wire.RegistrationStatus(plugin_registered=registered, error=error)
    empty = registration_pb2.RegistrationStatusResponse().SerializeToString()
    assert wire.encode_empty(wire.EMPTY) == empty
    # Not None, which gRPC would take for a request that failed to decode.
    assert wire.decode_empty(registration_pb2.InfoRequest().SerializeToString()) is wire.EMPTY


def test_a_known_field_of_another_wire_type_is_skipped_as_protobuf_skips_it() -> None:
    for data in (b"\x0a\x02\x10\x01", b"\x08\x01"):  # uid as a varint, claims as a varint
        theirs = v1.NodePrepareResourcesRequest.FromString(data)
        ours = wire.decode_claims_request(data)
        assert [(c.namespace, c.uid, c.name) for c in theirs.claims] == [
            (c.namespace, c.uid, c.name) for c in ours.claims
        ]
    status = registration_pb2.RegistrationStatus.FromString(b"\x0a\x00\x10\x01")
    assert (status.plugin_registered, status.error) == (False, "")
    got = wire.decode_registration_status(b"\x0a\x00\x10\x01")  # bool as bytes, error as int
    assert got == wire.RegistrationStatus(plugin_registered=False, error="")


@pytest.mark.parametrize("pb", [health_v1, health_v1alpha1], ids=["v1", "v1alpha1"])
def test_health_lists_read_back_by_protobuf(pb: object) -> None:
    devices = [
        wire.DeviceHealth("n1", "gpu-0", wire.HEALTHY, 1_800_000_000, 60, ""),
        wire.DeviceHealth("n1", "gpu-1", wire.UNHEALTHY, 1_800_000_001, 60, "GPU-1: XID 79"),
        wire.DeviceHealth("n1", "gpu-2", wire.HEALTH_UNKNOWN, 0, 0, ""),
    ]
    data = wire.encode_health_list(devices)
    parsed = pb.NodeWatchResourcesResponse.FromString(data)  # type: ignore[attr-defined]
    got = [
        (
            d.device.pool_name,
            d.device.device_name,
            d.health,
            d.last_updated_time,
            d.health_check_timeout_seconds,
            d.message,
        )
        for d in parsed.devices
    ]
    assert got == [dataclasses.astuple(d) for d in devices]
    assert (wire.HEALTHY, wire.UNHEALTHY) == (pb.HEALTHY, pb.UNHEALTHY)  # type: ignore[attr-defined]
    assert parsed.SerializeToString(deterministic=True) == data


def test_negative_int64_is_written_as_protobuf_writes_it() -> None:
    device = wire.DeviceHealth("n1", "gpu-0", wire.HEALTHY, -5, 60, "")
    parsed = health_v1.NodeWatchResourcesResponse.FromString(wire.encode_health_list([device]))
    assert parsed.devices[0].last_updated_time == -5
