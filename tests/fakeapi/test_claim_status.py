"""Server-side apply of ResourceClaim ``status.devices`` in the fake API server: validation as
the server's ``validateDeviceStatus``, list-map entries owned per field manager, and the same
over HTTP through the real client adapter."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from dra_driver.kube import api
from dra_driver.kube.client import KubeClient
from dra_driver.testing.fakeapi import fakeserver, memory

UID = "0d7d8e8a-7bb8-4b0c-9f3b-2c1a6a3f0001"
SHARE = "5b3c3f5e-2a53-4f0e-8a1a-3c6f1f0c9a11"
OURS, THEIRS = "gpu.nvidia.com-kubelet-plugin", "other-driver"


def claim() -> dict[str, Any]:
    results = [
        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0"},
        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-1"},
        {
            "request": "s",
            "driver": "gpu.nvidia.com",
            "pool": "n1",
            "device": "gpu-2",
            "shareID": SHARE,
        },
        {"request": "nic", "driver": "nic.example.com", "pool": "n1", "device": "eth0"},
    ]
    return {
        "metadata": {"name": "c", "namespace": "team", "uid": UID},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "x"}}]}},
        "status": {
            "allocation": {"devices": {"results": results}},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-uid"}],
        },
    }


def entry(device: str, driver: str = "gpu.nvidia.com", **extra: Any) -> dict[str, Any]:
    return {
        "driver": driver,
        "pool": "n1",
        "device": device,
        "data": {"uuid": f"GPU-{device}"},
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Prepared",
                "message": "ok",
                "lastTransitionTime": "2025-01-01T00:00:00Z",
            }
        ],
        **extra,
    }


def patch(*entries: dict[str, Any], uid: str = UID) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "team", "uid": uid},
        "status": {"devices": list(entries)},
    }


@pytest.fixture
def mem() -> memory.InMemoryApi:
    m = memory.InMemoryApi(use_default_cel=False)
    m.put_resource_claim(claim())
    return m


def devices(m: memory.InMemoryApi) -> list[tuple[str, str]]:
    got = m.get_resource_claim("team", "c")["status"].get("devices") or []
    return [(e["driver"], e["device"]) for e in got]


def test_entries_of_two_managers_are_kept_apart(mem: memory.InMemoryApi) -> None:
    before = mem.get_resource_claim("team", "c")
    mem.apply_resource_claim_status("team", "c", patch(entry("eth0", "nic.example.com")), THEIRS)
    mem.apply_resource_claim_status("team", "c", patch(entry("gpu-0"), entry("gpu-1")), OURS)
    assert devices(mem) == [
        ("nic.example.com", "eth0"),
        ("gpu.nvidia.com", "gpu-0"),
        ("gpu.nvidia.com", "gpu-1"),
    ]
    # Fewer entries from us: our missing one goes, theirs stays.
    mem.apply_resource_claim_status("team", "c", patch(entry("gpu-1")), OURS)
    assert devices(mem) == [("nic.example.com", "eth0"), ("gpu.nvidia.com", "gpu-1")]
    # None from us: only ours go; allocation and reservedFor untouched.
    mem.apply_resource_claim_status("team", "c", patch(), OURS)
    after = mem.get_resource_claim("team", "c")
    assert devices(mem) == [("nic.example.com", "eth0")]
    assert after["status"]["allocation"] == before["status"]["allocation"]
    assert after["status"]["reservedFor"] == before["status"]["reservedFor"]
    assert mem.status_owners("team", "c") == {("nic.example.com", "eth0", "n1", None): {THEIRS}}


def test_an_apply_that_changes_nothing_keeps_the_resource_version(mem: memory.InMemoryApi) -> None:
    first = mem.apply_resource_claim_status("team", "c", patch(entry("gpu-0")), OURS)
    again = mem.apply_resource_claim_status("team", "c", patch(entry("gpu-0")), OURS)
    assert first["metadata"]["resourceVersion"] == again["metadata"]["resourceVersion"]


def test_a_share_is_keyed_by_its_share_id(mem: memory.InMemoryApi) -> None:
    mem.apply_resource_claim_status("team", "c", patch(entry("gpu-2", shareID=SHARE)), OURS)
    with pytest.raises(api.Invalid) as info:  # the same device without the share: not allocated
        mem.apply_resource_claim_status("team", "c", patch(entry("gpu-2")), OURS)
    assert "must be an allocated device in the claim" in str(info.value)


def test_an_entry_owned_by_another_manager_conflicts_unless_forced(
    mem: memory.InMemoryApi,
) -> None:
    mem.apply_resource_claim_status("team", "c", patch(entry("gpu-0")), THEIRS)
    changed = entry("gpu-0", data={"uuid": "other"})
    with pytest.raises(api.Conflict) as info:
        mem.apply_resource_claim_status("team", "c", patch(changed), OURS, force=False)
    assert f'conflict with "{THEIRS}"' in str(info.value)
    mem.apply_resource_claim_status("team", "c", patch(changed), OURS, force=True)
    assert mem.status_owners("team", "c") == {("gpu.nvidia.com", "gpu-0", "n1", None): {OURS}}


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (entry("gpu-9"), "status.devices[0]: Invalid value"),
        ({**entry("gpu-0"), "driver": ""}, "status.devices[0].driver: Required value"),
        ({**entry("gpu-0"), "pool": ""}, "status.devices[0].pool: Required value"),
        ({**entry("gpu-0"), "device": "GPU_0"}, "status.devices[0].device: Invalid value"),
        (
            {**entry("gpu-0"), "conditions": entry("gpu-0")["conditions"] * 9},
            "status.devices[0].conditions: Too many: 9: must have at most 8 items",
        ),
        (
            {**entry("gpu-0"), "conditions": entry("gpu-0")["conditions"] * 2},
            "status.devices[0].conditions[1].type: Duplicate value",
        ),
        (
            {**entry("gpu-0"), "conditions": [{"type": "Ready", "status": "Yes"}]},
            "status.devices[0].conditions[0].status: Unsupported value",
        ),
        (
            {**entry("gpu-0"), "conditions": [{"type": "Ready", "status": "True"}]},
            "status.devices[0].conditions[0].reason: Required value",
        ),
        ({**entry("gpu-0"), "data": {"x": "y" * 10240}}, "status.devices[0].data: Too long"),
        ({**entry("gpu-0"), "data": [1]}, "parameters must be a valid JSON object"),
        (
            {**entry("gpu-0"), "networkData": {"ips": ["10.0.0.1"]}},
            "status.devices[0].networkData.ips[0]: Invalid value",
        ),
    ],
)
def test_invalid_entries_are_refused_as_the_server_refuses_them(
    mem: memory.InMemoryApi, bad: dict[str, Any], message: str
) -> None:
    with pytest.raises(api.Invalid) as info:
        mem.apply_resource_claim_status("team", "c", patch(bad), OURS)
    assert info.value.status == 422 and message in str(info.value)
    assert devices(mem) == []


def test_duplicate_keys_unknown_fields_names_and_uids(mem: memory.InMemoryApi) -> None:
    with pytest.raises(api.Invalid, match="Duplicate value"):
        mem.apply_resource_claim_status("team", "c", patch(entry("gpu-0"), entry("gpu-0")), OURS)
    with pytest.raises(api.Invalid) as info:
        mem.apply_resource_claim_status("team", "c", patch({**entry("gpu-0"), "bogus": 1}), OURS)
    assert info.value.status == 400 and "unknown field" in str(info.value)
    with pytest.raises(api.Conflict, match="UID in precondition"):
        mem.apply_resource_claim_status("team", "c", patch(entry("gpu-0"), uid="x"), OURS)
    with pytest.raises(api.Invalid, match="fieldManager"):
        mem.apply_resource_claim_status("team", "c", patch(entry("gpu-0")), "")
    with pytest.raises(api.NotFound):
        mem.apply_resource_claim_status("team", "nope", patch(), OURS)
    unallocated = copy.deepcopy(claim())
    del unallocated["status"]
    mem.put_resource_claim(unallocated)
    with pytest.raises(api.Invalid, match="must be an allocated device"):
        mem.apply_resource_claim_status("team", "c", patch(entry("gpu-0")), OURS)


@pytest.mark.parametrize("lean", [True, False], ids=["lean-http", "library-http"])
def test_over_http_through_the_client(
    tmp_path: Path, mem: memory.InMemoryApi, lean: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    with fakeserver.FakeApiServer(mem) as server:
        client = KubeClient.connect(server.write_kubeconfig(tmp_path / "kubeconfig"), lean=lean)
        if lean:  # after every prepare and unprepare: never through the library's HTTP stack

            def library(*args: Any, **kwargs: Any) -> Any:
                raise AssertionError("the status apply went through the client library")

            monkeypatch.setattr(client._client, "call_api", library, raising=False)
        try:
            got = client.apply_resource_claim_status("team", "c", patch(entry("gpu-0")), OURS)
            assert [e["device"] for e in got["status"]["devices"]] == ["gpu-0"]
            assert mem.status_owners("team", "c") == {
                ("gpu.nvidia.com", "gpu-0", "n1", None): {OURS}
            }
            mem.fail_next("apply_resource_claim_status", 403)
            with pytest.raises(api.ApiError) as info:
                client.apply_resource_claim_status("team", "c", patch(), OURS)
            assert info.value.status == 403
            with pytest.raises(api.Invalid):
                client.apply_resource_claim_status("team", "c", patch(entry("gpu-9")), OURS)
            client.apply_resource_claim_status("team", "c", patch(), OURS)
            assert devices(mem) == []
        finally:
            client.close()
