"""The publisher's notion of "the same slice" (:mod:`dra_driver.slices.compare`) on small
objects: what the server adds is carried over, what it leaves out or spells differently is no
change, and what we set is compared."""

from __future__ import annotations

import copy
import json

from dra_driver.slices import compare

from .conftest import Obj


def obj(**spec: object) -> Obj:
    base: Obj = {
        "metadata": {"name": "s"},
        "spec": {"driver": "d", "pool": {"name": "p", "generation": 3, "resourceSliceCount": 1}},
    }
    base["spec"].update(spec)
    return base


def tainted(name: str, *taints: Obj) -> Obj:
    return {"name": name, "taints": list(taints)}


def test_nothing_to_carry_from_a_slice_the_server_does_not_have() -> None:
    ours = obj(devices=[tainted("a", {"key": "k", "effect": "NoSchedule"})])
    before = copy.deepcopy(ours)
    compare.carry_server_fields(ours, None)
    assert ours == before


def test_labels_and_annotations_of_others_are_kept_ours_win() -> None:
    ours = obj()
    ours["metadata"]["labels"] = {"b": "ours"}
    theirs = obj()
    theirs["metadata"]["labels"] = {"a": "theirs", "b": "theirs"}
    theirs["metadata"]["annotations"] = {"note": "x"}
    compare.carry_server_fields(ours, theirs)
    assert ours["metadata"]["labels"] == {"a": "theirs", "b": "ours"}
    assert ours["metadata"]["annotations"] == {"note": "x"}
    bare = obj()
    compare.carry_server_fields(bare, obj())
    assert bare["metadata"] == {"name": "s"}  # no empty maps added


def test_the_servers_taint_times_are_carried_for_the_same_device_key_and_effect() -> None:
    when = "2026-11-22T00:00:00Z"
    theirs = obj(
        devices=[
            tainted("a", {"key": "k", "effect": "NoSchedule", "timeAdded": when}),
            tainted("b", {"key": "k", "effect": "NoSchedule", "timeAdded": when}),
            {"name": "c"},
        ]
    )
    ours = obj(
        devices=[
            tainted(
                "a",
                {"key": "k", "effect": "NoSchedule"},
                {"key": "k", "effect": "NoExecute"},  # another effect: a new taint
                {"key": "j", "effect": "NoSchedule"},
            ),
            tainted("b", {"key": "k", "effect": "NoSchedule", "timeAdded": "2000-01-01T00:00:00Z"}),
            tainted("c", {"key": "k", "effect": "NoSchedule"}),  # new on this device
        ]
    )
    compare.carry_server_fields(ours, theirs)
    a, b, c = ours["spec"]["devices"]
    assert [t.get("timeAdded") for t in a["taints"]] == [when, None, None]
    assert b["taints"][0]["timeAdded"] == "2000-01-01T00:00:00Z"  # ours is kept
    assert "timeAdded" not in c["taints"][0]


def test_content_ignores_the_generation_and_what_the_server_leaves_out() -> None:
    a = obj(devices=[{"name": "x", "capacity": {"memory": {"value": "1Gi"}}, "taints": []}])
    b = obj(devices=[{"name": "x", "capacity": {"memory": {"value": "1024Mi"}}}])
    b["spec"]["pool"]["generation"] = 9
    b["spec"]["nodeSelector"] = None
    b["spec"]["sharedCounters"] = {}
    assert compare.content(a) == compare.content(b)
    assert a["spec"]["pool"]["generation"] == 3  # the object itself is left alone
    assert compare.content(a) == {
        "driver": "d",
        "pool": {"name": "p", "resourceSliceCount": 1},
        "devices": [{"name": "x", "capacity": {"memory": {"value": (1 << 30) * 10**9}}}],
    }


def test_content_compares_quantities_by_value_and_other_strings_as_written() -> None:
    def with_value(value: str, field: str = "value") -> object:
        return compare.content(obj(devices=[{"name": "x", "capacity": {"m": {field: value}}}]))

    assert with_value("1Gi") == with_value("1073741824")
    assert with_value("1Gi") != with_value("1G")
    assert with_value("lots") != with_value("more")  # not a quantity: compared as written
    assert with_value("lots") == with_value("lots")
    assert with_value("1Gi", "other") != with_value("1024Mi", "other")
    attrs = compare.content(obj(devices=[{"name": "x", "attributes": {"a": {"string": "1Gi"}}}]))
    assert attrs["devices"][0]["attributes"]["a"] == {"string": "1Gi"}
    listed = compare.content(obj(devices=[{"name": "x", "capacity": {"v": {"value": ["1k"]}}}]))
    assert listed["devices"][0]["capacity"]["v"]["value"] == [10**12]


def test_content_keys_are_by_name_and_content() -> None:
    one, two = obj(devices=[{"name": "a"}]), obj(devices=[{"name": "b"}])
    key = compare.content_key({"s1": one, "s2": two})
    assert key == compare.content_key({"s2": two, "s1": one})
    assert key == json.dumps(
        [["s1", compare.content(one)], ["s2", compare.content(two)]], sort_keys=True
    )
    assert key != compare.content_key({"s1": two, "s2": one})
    regenerated = copy.deepcopy(one)
    regenerated["spec"]["pool"]["generation"] = 7
    assert compare.content_key({"s1": regenerated, "s2": two}) == key


def test_pool_and_metadata_we_set() -> None:
    a = obj()
    assert compare.pool(a) == {"name": "p", "generation": 3, "resourceSliceCount": 1}
    assert compare.pool({}) is None
    owner = [{"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u", "controller": True}]
    a["metadata"].update(labels={"l": "1"}, annotations={"n": "2"}, ownerReferences=owner)
    assert compare.meta(a) == ({"l": "1"}, {"n": "2"}, owner)
    assert compare.meta({}) == ({}, {}, [])
    assert compare.meta({"metadata": {"labels": None, "ownerReferences": None}}) == ({}, {}, [])
