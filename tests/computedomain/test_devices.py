"""The compute-domain devices: published only on nodes in an NVLink clique, and selected by
the shipped DeviceClasses exactly as NVIDIA's classes select them."""

from __future__ import annotations

import dataclasses

import kubernetes_validate
import pytest

from dra_driver.allocation import cel
from dra_driver.computedomain import cdslices, deviceclasses
from dra_driver.devices.fake import FakeBackend
from dra_driver.testing import cdalloc
from dra_driver.testing.fakeapi import memory


def test_the_clique_is_the_fabric_ones_and_only_when_all_gpus_agree() -> None:
    devices = FakeBackend(cdalloc.nvl_profile(41)).discover()
    assert cdslices.clique_of(devices) == cdalloc.clique_label(41)
    assert cdslices.clique_of(FakeBackend.from_name("dgx-h100").discover()) == ""  # no fabric
    split = dataclasses.replace(
        devices,
        gpus=(
            devices.gpus[0],
            dataclasses.replace(
                devices.gpus[1],
                fabric=dataclasses.replace(devices.gpus[1].fabric, clique_id=7),  # type: ignore[type-var]
            ),
        ),
    )
    assert cdslices.clique_of(split) == ""
    pending = dataclasses.replace(
        devices,
        gpus=tuple(
            dataclasses.replace(g, fabric=dataclasses.replace(g.fabric, state="in-progress"))  # type: ignore[type-var]
            for g in devices.gpus
        ),
    )
    assert cdslices.clique_of(pending) == ""


def test_nodes_publish_a_channel_and_the_daemon_only_in_a_clique() -> None:
    assert cdslices.desired("n1", "") == []
    (obj,) = cdslices.desired("n1", cdalloc.clique_label(41))
    assert obj["spec"]["driver"] == "compute-domain.nvidia.com"
    assert obj["spec"]["pool"]["name"] == "n1" and obj["spec"]["nodeName"] == "n1"
    assert [d["name"] for d in obj["spec"]["devices"]] == ["channel-0", "daemon-0"]
    assert kubernetes_validate.validate(obj, "1.36.0", strict=True)
    memory.InMemoryApi().create_resource_slice(obj)


@pytest.mark.parametrize(
    ("name", "wanted"),
    [
        ("compute-domain-default-channel.nvidia.com", ["channel-0"]),
        ("compute-domain-daemon.nvidia.com", ["daemon-0"]),
    ],
)
def test_the_device_classes_select_exactly_their_devices(name: str, wanted: list[str]) -> None:
    (cls,) = [c for c in deviceclasses.load_all() if c["metadata"]["name"] == name]
    assert kubernetes_validate.validate(cls, "1.36.0", strict=True)
    memory.InMemoryApi().create_device_class(cls)
    (selector,) = cls["spec"]["selectors"]
    compiled = cel.compile_selector(selector["cel"]["expression"])
    (obj,) = cdslices.desired("n1", "c.1")
    more = [
        *obj["spec"]["devices"],
        {"name": "channel-1", "attributes": {"type": {"string": "channel"}, "id": {"int": 1}}},
    ]
    assert [d["name"] for d in more if compiled.matches(d, "compute-domain.nvidia.com")] == wanted
    assert not any(compiled.matches(d, "gpu.nvidia.com") for d in more)
