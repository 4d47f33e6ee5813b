"""The fake API server with DRA feature gates off drops gated ResourceSlice fields as a real
one does: silently, before validation, 201/200 all the same, and not on an update of a slice
that already uses them. Held to every case a real v1.36.2 server with one gate off answered
(``../shared/reference/apiserver-verdicts/gates-off``), and gate by gate without that data."""

from __future__ import annotations

import copy
import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import refdata

from dra_driver.kube import api
from dra_driver.testing.fakeapi import fakeserver, featuregates, memory

Obj = dict[str, Any]
GATES_OFF = ("apiserver-verdicts", "gates-off")
_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


# --- the recordings -------------------------------------------------------------------------
def _recorded() -> list[Any]:
    """``pytest.param(gates off, case)`` for every case of every file in ``gates-off/``."""
    if not refdata.available():
        return refdata.placeholder(argnames=2)
    params = []
    for file in sorted(refdata.path(*GATES_OFF).glob("*.json")):
        data = refdata.load_json(*GATES_OFF, file.name)
        off = sorted(gate for gate, on in data["featureGates"].items() if not on)
        for case in data["cases"]:
            params.append(pytest.param(off, case, id=f"{file.stem}-{case['case']}"))
    return params


RECORDED = _recorded()


def _server_times(stored: Obj, sent: Obj) -> Obj:
    """``stored`` with each ``timeAdded`` the server filled in (absent from ``sent``) checked
    and replaced by a marker: the recording's clock is not ours."""
    out = copy.deepcopy(stored)
    sent_devices = {d["name"]: d for d in sent.get("devices") or ()}
    for device in out.get("devices") or ():
        sent_taints = sent_devices.get(device["name"], {}).get("taints") or ()
        for taint, mine in zip(device.get("taints") or (), sent_taints, strict=False):
            if "timeAdded" not in mine:
                assert _TIME.match(taint["timeAdded"]), taint
                taint["timeAdded"] = "<set by the server>"
    return out


def _post(server: fakeserver.FakeApiServer, obj: Obj) -> tuple[int, Obj]:
    request = urllib.request.Request(
        f"{server.url}/apis/resource.k8s.io/v1/resourceslices",
        data=json.dumps(obj).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return answer.status, json.loads(answer.read())


@refdata.MARK
def test_every_gate_recorded_off_is_one_the_fake_turns_off() -> None:
    files = sorted(refdata.path(*GATES_OFF).glob("*.json"))
    assert {f.stem for f in files} >= {
        "DRAPartitionableDevices",
        "DRAConsumableCapacity",
        "DRADeviceTaints",
    }
    for file in files:
        data = refdata.load_json(*GATES_OFF, file.name)
        assert data["cases"] and data["featureGates"][file.stem] is False
        featuregates.checked(gate for gate, on in data["featureGates"].items() if not on)


@refdata.MARK
@pytest.mark.parametrize(("off", "case"), RECORDED)
def test_fake_stores_what_the_real_server_stored_with_the_gate_off(
    off: list[str], case: Obj
) -> None:
    sent = case["object"]
    mem = memory.InMemoryApi(disabled_gates=off)
    stored = mem.create_resource_slice(copy.deepcopy(sent))
    assert mem.calls[-1].status == case["httpStatus"] == 201 and case["accepted"]
    expected = _server_times(case["storedSpec"], sent["spec"])
    assert _server_times(stored["spec"], sent["spec"]) == expected
    assert mem.get_resource_slice(sent["metadata"]["name"])["spec"] == stored["spec"]
    # On update (nothing of the gate in use in the stored slice) the same fields go.
    again = copy.deepcopy(sent)
    again["spec"]["pool"]["generation"] += 1
    updated = mem.update_resource_slice(again)
    expected["pool"]["generation"] += 1
    assert _server_times(updated["spec"], sent["spec"]) == expected


@refdata.MARK
@pytest.mark.parametrize(("off", "case"), RECORDED)
def test_fake_http_front_answers_as_the_real_server_with_the_gate_off(
    off: list[str], case: Obj
) -> None:
    with fakeserver.FakeApiServer(disabled_gates=off) as server:
        status, body = _post(server, case["object"])
    assert status == case["httpStatus"]
    sent = case["object"]["spec"]
    assert _server_times(body["spec"], sent) == _server_times(case["storedSpec"], sent)


# --- gate by gate, no reference data needed --------------------------------------------------
def slice_(*devices: Obj, **spec: Any) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "s"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
            "nodeName": "n1",
            **({"devices": list(devices)} if devices else {}),
            **spec,
        },
    }


def device(name: str = "gpu-0", **fields: Any) -> Obj:
    return {"name": name, "attributes": {"type": {"string": "gpu"}}, **fields}


COUNTERS = [{"name": "gpu-0-counters", "counters": {"memory": {"value": "80Gi"}}}]
CONSUMES = [{"counterSet": "gpu-0-counters", "counters": {"memory": {"value": "10Gi"}}}]
TAINT = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoExecute"}
POLICY = {"default": "1Gi", "validRange": {"min": "1Gi", "max": "80Gi", "step": "1Gi"}}
SHAREABLE = device(
    allowMultipleAllocations=True, capacity={"memory": {"value": "80Gi", "requestPolicy": POLICY}}
)


def create(off: set[str], obj: Obj) -> Obj:
    return memory.InMemoryApi(disabled_gates=off).create_resource_slice(obj)


def test_partitionable_devices_off_drops_counters_and_per_device_node_selection() -> None:
    off = {"DRAPartitionableDevices"}
    counters = create(off, slice_(sharedCounters=COUNTERS))["spec"]
    assert "sharedCounters" not in counters and "devices" not in counters
    consuming = create(off, slice_(device(consumesCounters=CONSUMES)))["spec"]
    assert consuming["devices"] == [device()]
    # Dropped before validation: nothing left to say which nodes the devices are on.
    per_device = slice_(device(nodeName="n1"), perDeviceNodeSelection=True)
    del per_device["spec"]["nodeName"]
    with pytest.raises(api.Invalid, match="exactly one of `nodeName`"):
        create(off, per_device)
    assert create(set(), copy.deepcopy(per_device))["spec"]["perDeviceNodeSelection"] is True


def test_device_taints_off_drops_taints_and_their_device_limit() -> None:
    off = {"DRADeviceTaints", "DRADeviceTaintRules"}
    stored = create(off, slice_(device(taints=[TAINT])))["spec"]
    assert stored["devices"] == [device()]
    # Taints lower the device limit to 64; dropped first, the limit is 128 again.
    many = slice_(*(device(f"gpu-{i}", taints=[TAINT]) for i in range(100)))
    with pytest.raises(api.Invalid, match="Too many"):
        create(set(), copy.deepcopy(many))
    assert len(create(off, many)["spec"]["devices"]) == 100


def test_consumable_capacity_off_drops_sharing_and_request_policies_not_capacity() -> None:
    stored = create({"DRAConsumableCapacity"}, slice_(copy.deepcopy(SHAREABLE)))["spec"]
    assert stored["devices"] == [device(capacity={"memory": {"value": "80Gi"}})]
    assert create(set(), slice_(copy.deepcopy(SHAREABLE)))["spec"]["devices"] == [SHAREABLE]


@pytest.mark.parametrize("gate", ["DRADeviceBindingConditions", "DRAResourceClaimDeviceStatus"])
def test_binding_conditions_need_both_gates(gate: str) -> None:
    bound = device(bindsToNode=True, bindingConditions=["a"], bindingFailureConditions=["b"])
    assert create({gate}, slice_(bound))["spec"]["devices"] == [device()]
    assert create(set(), slice_(copy.deepcopy(bound)))["spec"]["devices"] == [bound]


def test_list_type_attributes_off_empties_the_attribute_which_is_then_invalid() -> None:
    listed = device(attributes={"links": {"ints": [1, 2]}})
    with pytest.raises(api.Invalid, match=r"attributes\[links\]"):
        create({"DRAListTypeAttributes"}, slice_(listed))
    assert create(set(), slice_(copy.deepcopy(listed)))["spec"]["devices"] == [listed]


def test_node_allocatable_resources_off_drops_the_mappings() -> None:
    mapped = device(
        capacity={"memory": {"value": "80Gi"}},
        nodeAllocatableResourceMappings={"memory": {"capacityKey": "memory"}},
    )
    stored = create({"DRANodeAllocatableResources"}, slice_(copy.deepcopy(mapped)))["spec"]
    assert "nodeAllocatableResourceMappings" not in stored["devices"][0]
    assert create(set(), slice_(mapped))["spec"]["devices"] == [mapped]


def test_update_keeps_fields_the_stored_slice_already_uses() -> None:
    mem = memory.InMemoryApi()
    mem.create_resource_slice(
        slice_(device(taints=[TAINT]), copy.deepcopy(SHAREABLE | {"name": "gpu-1"}))
    )
    mem.restart_with_gates({"DRADeviceTaints", "DRAConsumableCapacity"})
    again = slice_(device(taints=[TAINT]), copy.deepcopy(SHAREABLE | {"name": "gpu-1"}))
    again["spec"]["pool"]["generation"] = 2
    stored = mem.update_resource_slice(again)["spec"]
    assert stored["devices"][0]["taints"][0]["key"] == TAINT["key"]
    assert stored["devices"][1]["allowMultipleAllocations"] is True
    assert "requestPolicy" in stored["devices"][1]["capacity"]["memory"]
    # A slice that never used them, on the same server, loses them.
    other = slice_(device(taints=[TAINT]))
    other["metadata"]["name"] = "other"
    assert mem.create_resource_slice(other)["spec"]["devices"] == [device()]


def test_update_adding_gated_fields_drops_them_and_still_writes() -> None:
    mem = memory.InMemoryApi(disabled_gates={"DRADeviceTaints"})
    first = mem.create_resource_slice(slice_(device()))
    stored = mem.update_resource_slice(slice_(device(taints=[TAINT])))
    assert stored["spec"] == first["spec"]
    # The server bumps the generation by the spec it was sent, before dropping: a write.
    assert stored["metadata"]["generation"] == 2
    assert stored["metadata"]["resourceVersion"] != first["metadata"]["resourceVersion"]
    same = mem.update_resource_slice(slice_(device()))
    assert same["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]


def test_a_malformed_gated_field_is_still_a_decode_error() -> None:
    with pytest.raises(api.Invalid) as info:
        create({"DRADeviceTaints"}, slice_(device(taints="NoExecute")))
    assert info.value.status == 400


def test_gate_names_are_checked_and_parsed_as_kube_apiserver_takes_them(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot turn off DRAAdminAccess"):
        memory.InMemoryApi(disabled_gates={"DRAAdminAccess"})
    assert featuregates.parse("DRADeviceTaints=false, DRAPartitionableDevices=true") == {
        "DRADeviceTaints"
    }
    with pytest.raises(ValueError, match=r"is not <gate>=<true\|false>"):
        featuregates.parse("DRADeviceTaints")
    with pytest.raises(SystemExit):
        fakeserver.main(["--kubeconfig", str(tmp_path / "kc"), "--feature-gates", "Nope=false"])
    with pytest.raises(ValueError, match="differ"):
        fakeserver.FakeApiServer(memory.InMemoryApi(), disabled_gates={"DRADeviceTaints"})


def test_http_front_drops_on_create_and_answers_201() -> None:
    with fakeserver.FakeApiServer(disabled_gates={"DRAPartitionableDevices"}) as server:
        status, body = _post(server, slice_(sharedCounters=COUNTERS))
        assert server.api.get_resource_slice("s")["spec"] == body["spec"]
    assert status == 201 and "sharedCounters" not in body["spec"]
