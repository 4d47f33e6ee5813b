"""The ComputeDomain CRD: NVIDIA-shaped manifests are accepted, broken ones refused with the
field at fault, by our validator and by the in-memory API server it is registered with."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from dra_driver.computedomain import api as cdapi
from dra_driver.kube import api
from dra_driver.kube.objects import COMPUTE_DOMAINS
from dra_driver.testing.fakeapi import memory

# Written from the shapes NVIDIA documents for their driver (our own YAML): the minimal
# single-node example, a multi-node job with every channel, and one as `kubectl get -o yaml`
# shows it once nodes have joined.
NVIDIA_SHAPED = """
apiVersion: resource.nvidia.com/v1beta1
kind: ComputeDomain
metadata:
  name: imex-channel-injection
spec:
  numNodes: 1
  channel:
    resourceClaimTemplate:
      name: imex-channel-0
---
apiVersion: resource.nvidia.com/v1beta1
kind: ComputeDomain
metadata:
  name: nccl-test-compute-domain
  namespace: default
spec:
  numNodes: 0
  channel:
    allocationMode: All
    resourceClaimTemplate:
      name: nccl-test-compute-domain-channel
---
apiVersion: resource.nvidia.com/v1beta1
kind: ComputeDomain
metadata:
  name: two-racks
  namespace: default
spec:
  numNodes: 2
  channel:
    allocationMode: Single
    resourceClaimTemplate:
      name: two-racks-channel
status:
  status: Ready
  nodes:
  - name: gb200-node-1
    ipAddress: 10.0.12.31
    cliqueID: 3f2a8c1e-5b7d-4e90-a1c2-6d8e9f0a1b2c.32766
    index: 0
    status: Ready
  - name: gb200-node-2
    ipAddress: 10.0.12.32
    cliqueID: 3f2a8c1e-5b7d-4e90-a1c2-6d8e9f0a1b2c.32766
    index: 1
    status: Ready
"""


def manifests() -> list[dict[str, Any]]:
    return list(yaml.safe_load_all(NVIDIA_SHAPED))


@pytest.mark.parametrize("obj", manifests(), ids=lambda o: o["metadata"]["name"])
def test_nvidia_shaped_manifests_are_valid(obj: dict[str, Any]) -> None:
    assert cdapi.validate(obj) == []


def test_typed_view_applies_the_defaults() -> None:
    first, second, third = (cdapi.Domain.from_obj(o) for o in manifests())
    assert (first.allocation_mode, first.status, first.nodes) == ("Single", "NotReady", ())
    assert (second.allocation_mode, second.num_nodes) == ("All", 0)
    assert [n.name for n in third.nodes] == ["gb200-node-1", "gb200-node-2"]
    assert third.overall_status() == "Ready"
    assert second.overall_status() == "NotReady"  # numNodes 0 and nobody joined yet


def _broken(path: str, value: Any) -> dict[str, Any]:
    obj = manifests()[2]
    *parents, last = path.split(".")
    target: Any = obj
    for key in parents:
        target = target[key] if not key.isdigit() else target[int(key)]
    if value is KeyError:
        del target[last]
    elif last.isdigit():
        target[int(last)] = value
    else:
        target[last] = value
    return obj


@pytest.mark.parametrize(
    ("path", "value", "needle"),
    [
        ("spec.numNodes", "two", "spec.numNodes: Invalid value: must be of type integer"),
        ("spec.numNodes", -1, "spec.numNodes: Invalid value: -1: should be >= 0"),
        ("spec.numNodes", True, "spec.numNodes: Invalid value: must be of type integer"),
        ("spec.channel", KeyError, "spec.channel: Required value"),
        ("spec.numNodes", KeyError, "spec.numNodes: Required value"),
        (
            "spec.channel.resourceClaimTemplate.name",
            KeyError,
            "resourceClaimTemplate.name: Required",
        ),
        ("spec.channel.allocationMode", "Some", 'Unsupported value: "Some"'),
        ("spec.nodes", 3, 'spec.nodes: unknown field "nodes"'),
        ("status.status", "Unknown", 'status.status: Unsupported value: "Unknown"'),
        ("status.nodes.1.name", "gb200-node-1", "status.nodes[1]: Duplicate value"),
        ("status.nodes.0.cliqueID", KeyError, "status.nodes[0].cliqueID: Required value"),
    ],
)
def test_broken_manifests_are_refused_naming_the_field(path: str, value: Any, needle: str) -> None:
    problems = cdapi.validate(_broken(path, value))
    assert any(needle in p for p in problems), problems


def test_the_in_memory_server_refuses_what_the_crd_refuses_and_keeps_spec_immutable() -> None:
    mem = memory.InMemoryApi()
    cdapi.register(mem.objects)
    good = manifests()[2]
    created = mem.objects.create(COMPUTE_DOMAINS, good)
    assert "status" not in created  # the status subresource: a create sets none
    with pytest.raises(api.Invalid, match=r"spec\.channel\.allocationMode: Unsupported value"):
        mem.objects.create(COMPUTE_DOMAINS, _broken("spec.channel.allocationMode", "Some"))
    changed = {**created, "spec": {**created["spec"], "numNodes": 3}}
    with pytest.raises(api.Invalid, match=r"A computeDomain\.spec is immutable"):
        mem.objects.update(COMPUTE_DOMAINS, changed)
    status = {**created, "status": good["status"]}
    written = mem.objects.update_status(COMPUTE_DOMAINS, status)
    assert written["status"]["status"] == "Ready"
    bad_status = {**written, "status": {"status": "Maybe"}}
    with pytest.raises(api.Invalid, match=r"status\.status"):
        mem.objects.update_status(COMPUTE_DOMAINS, bad_status)


def test_the_crd_carries_the_same_schema_and_nvidias_names() -> None:
    crd = cdapi.crd()
    assert crd["metadata"]["name"] == "computedomains.resource.nvidia.com"
    spec = crd["spec"]
    assert (spec["group"], spec["scope"], spec["names"]["kind"]) == (
        "resource.nvidia.com",
        "Namespaced",
        "ComputeDomain",
    )
    (version,) = spec["versions"]
    assert version["name"] == "v1beta1" and version["subresources"] == {"status": {}}
    assert version["schema"]["openAPIV3Schema"] == cdapi.SCHEMA


def test_domain_ids_that_would_escape_a_directory_or_break_a_label_are_refused() -> None:
    assert cdapi.valid_domain_id("83479f70-e292-43d6-aa67-dd4ba8adab8f")
    for bad in ("", "../x", "a/b", "x" * 64, "..", None, 3):
        assert not cdapi.valid_domain_id(bad), bad
