"""The CDI specs of the ComputeDomain driver's claims: channels for workloads, the IMEX
directory for daemons.

Why it exists: a prepared claim reaches its container only through the CDI spec the kubelet
hands to the runtime. A channel claim's spec adds ``/dev/nvidia-caps-imex-channels/channel<N>``
(one channel, or every channel of the IMEX domain in ``All`` mode) as a character device of the
major ``/proc/devices`` lists for ``nvidia-caps-imex-channels`` and minor N, so the runtime
creates it in the container whether or not the host has that node. With fake GPUs the channel
is backed by a harmless host node (``/dev/null``), as every fake device node is
(:data:`dra_driver.driver.cdi.FAKE_DEVICE_NODE`). A daemon claim's spec mounts the domain's
directory of this node at ``/imexd`` and tells the daemon who it is (environment).
File naming, atomic writes and the checks are :mod:`dra_driver.driver.cdi`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dra_driver import computedomain as cd
from dra_driver.computedomain import api as cdapi
from dra_driver.driver import cdi, claims


def channel_nodes(channels: Sequence[int], *, major: int | None) -> list[dict[str, Any]]:
    """Device node entries; ``major`` None: fake mode (backed by the fake host node)."""
    if major is None:
        return [{"path": cd.channel_path(c), "hostPath": cdi.FAKE_DEVICE_NODE} for c in channels]
    return [
        {"path": cd.channel_path(c), "type": "c", "major": major, "minor": c, "permissions": "rw"}
        for c in channels
    ]


def channel_spec(
    specs: cdi.CdiSpecs,
    ref: claims.ClaimRef,
    *,
    device: str,
    channels: Sequence[int],
    major: int | None,
    domain: cdapi.Domain,
) -> dict[str, Any]:
    edits = {
        "deviceNodes": channel_nodes(channels, major=major),
        "env": [f"NVIDIA_COMPUTE_DOMAIN={domain.namespace}/{domain.name}"],
    }
    return _spec(specs, ref, device, edits)


def daemon_spec(
    specs: cdi.CdiSpecs,
    ref: claims.ClaimRef,
    *,
    device: str,
    directory: Path,
    domain: cdapi.Domain,
    clique: str,
    node_name: str,
    node_ip: str,
) -> dict[str, Any]:
    edits = {
        "env": [
            f"COMPUTE_DOMAIN_UUID={domain.uid}",
            f"COMPUTE_DOMAIN_NAME={domain.name}",
            f"COMPUTE_DOMAIN_NAMESPACE={domain.namespace}",
            f"CLIQUE_ID={clique}",
            f"NODE_NAME={node_name}",
            f"IMEX_NODE_IP={node_ip}",
        ],
        "mounts": [
            {
                "hostPath": str(directory),
                "containerPath": cd.DAEMON_DIR,
                "options": ["rw", "nosuid", "nodev", "bind"],
            }
        ],
    }
    return _spec(specs, ref, device, edits)


def _spec(
    specs: cdi.CdiSpecs, ref: claims.ClaimRef, device: str, edits: dict[str, Any]
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "cdiVersion": "",
        "kind": specs.kind,
        "devices": [{"name": specs.device_name(ref.uid, device), "containerEdits": edits}],
    }
    spec["cdiVersion"] = required = cdi.minimum_version(spec)
    problems = cdi.check(spec, required=required)
    if problems:  # a bug of ours: never write a spec runtimes reject
        raise cdi.CdiError(f"{ref}: generated CDI spec is invalid: {'; '.join(problems)}")
    return spec
