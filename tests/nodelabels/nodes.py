"""Nodes for the label tests: built-in profiles, or small YAML profiles, discovered the real way
(through the NVML stand-in), so the labels are computed from what discovery reports."""

from __future__ import annotations

import textwrap

from dra_driver.devices import fake, model
from dra_driver.devices.fake import profiles


def builtin(name: str) -> model.NodeDevices:
    return fake.FakeBackend.from_name(name).discover()


def node(body: str, *, head: str = "") -> model.NodeDevices:
    """A profile from YAML lines for ``gpus:`` (and optional extra top-level lines)."""
    text = textwrap.dedent(
        """\
        name: test
        driverVersion: "580.95.05"
        cudaDriverVersion: "13.0"
        defaults: {brand: Nvidia, architecture: Hopper, cudaComputeCapability: "9.0",
                   memory: 80Gi, productName: NVIDIA H100 80GB HBM3}
        """
    )
    text += textwrap.dedent(head) + "gpus:\n" + textwrap.indent(textwrap.dedent(body), "  ")
    return fake.FakeBackend(profiles.parse(text, source="test")).discover()


def bus(i: int) -> str:
    return f'"0000:{0x10 + i:02x}:00.0"'
