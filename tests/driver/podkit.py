"""Helpers for tests of MPS daemons run as Pods: a node whose agent core makes daemon Pods in
the in-memory API, a test kubelet that runs them, and what the Pods look like from outside."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from dra_driver.kube.objects import PODS
from dra_driver.testing.podrunner import PodKubelet

from .conftest import NODE, Node

IMAGE = "registry.example/dra-driver:v9"
NAMESPACE = "gpu-driver"
POD_SETTINGS: dict[str, Any] = {"mps_daemon_image": IMAGE, "pod_namespace": NAMESPACE}


@dataclasses.dataclass
class PodNode:
    node: Node
    kubelet: PodKubelet
    node_uid: str

    def pods(self) -> dict[str, dict[str, Any]]:
        """The daemon Pods in the API, by name."""
        return {p["metadata"]["name"]: p for p in self.node.api.objects.all(PODS)}

    def pod_of(self, daemon: str) -> dict[str, Any]:
        (found,) = [
            p
            for p in self.pods().values()
            if p["metadata"]["annotations"]["gpu.nvidia.com/mps-daemon"] == daemon
        ]
        return found

    def calls(self, method: str) -> list[Any]:
        return [c for c in self.node.api.calls if c.method == method]


def pod_node(
    node_factory: Callable[..., Node], base: Path, profile: str = "dgx-h100", **changes: Any
) -> Iterator[PodNode]:
    """A node whose MPS daemons are Pods, with a test kubelet running them (generator: the
    caller's fixture yields from it)."""
    node = node_factory(profile, **{**POD_SETTINGS, **changes})
    node_uid = str(uuid.uuid4())
    node.api.put_node(NODE, uid=node_uid)
    node.api.put_namespace(NAMESPACE)
    kubelet = PodKubelet(node.api.objects, node_name=NODE, base=base / "pods").start()
    try:
        yield PodNode(node=node, kubelet=kubelet, node_uid=node_uid)
    finally:
        kubelet.stop(kill=True)
