"""Claim metadata files (docs/metadata.md): content, mounts in the spec, lifecycle, recovery."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from dra_driver.driver import atomicfile, devicemeta

from . import sharekit
from .conftest import DRIVER, Node, claim_obj, new_uid

KEP_ROOT = "/var/run/kubernetes.io/dra-device-attributes"


def meta_root(node: Node) -> Path:
    return node.settings.plugin_dir / "claim-metadata"


def claim_path(node: Node, uid: str) -> Path:
    return meta_root(node) / f"{uid}.claim.json"


def kep_path(node: Node, uid: str, request: str = "gpu") -> Path:
    return meta_root(node) / f"{uid}.{request}.metadata.json"


def claim_file(node: Node, uid: str) -> dict[str, Any]:
    return json.loads(claim_path(node, uid).read_text())  # type: ignore[no-any-return]


def spec(node: Node, uid: str) -> dict[str, Any]:
    return node.driver.state.specs.read(uid)  # type: ignore[no-any-return]


def prepare(node: Node, obj: dict[str, Any]) -> str:
    ref = node.add(obj)
    result = node.driver.prepare([ref])[ref.uid]
    assert result.error == ""
    return ref.uid


def gpu_facts(node: Node, name: str) -> dict[str, Any]:
    gpu = next(g for g in node.driver.state.devices.node.gpus if g.name == name)  # type: ignore[union-attr]
    return {
        "uuid": gpu.uuid,
        "minor": gpu.minor,
        "index": gpu.index,
        "pciBusID": gpu.pci_bus_id,
        "numaNode": gpu.numa_node,
    }


def test_single_gpu_file_and_its_read_only_mounts(
    node: Node, cdi_validator: jsonschema.protocols.Validator
) -> None:
    uid = prepare(node, claim_obj(name="one", uid=new_uid(), devices=["gpu-3"]))
    assert claim_file(node, uid) == {
        "apiVersion": "gpu.nvidia.com/v1alpha1",
        "kind": "ClaimMetadata",
        "driver": DRIVER,
        "claim": {"namespace": "default", "name": "one", "uid": uid},
        "devices": [
            {
                "name": "gpu-3",
                "requests": ["gpu"],
                "type": "gpu",
                "gpus": [gpu_facts(node, "gpu-3")],
            }
        ],
        "nvlinks": [],
    }
    s = spec(node, uid)
    cdi_validator.validate(s)
    host = str(claim_path(node, uid))
    assert {
        "hostPath": host,
        "containerPath": f"/var/run/nvidia-dra/claims/{uid}.json",
        "options": ["ro", "nosuid", "nodev", "bind"],
    } in s["containerEdits"]["mounts"]
    # KEP-5304: the request's DeviceMetadata, mounted by the request's devices only.
    (device,) = s["devices"]
    (kep_mount,) = device["containerEdits"]["mounts"]
    assert kep_mount == {
        "hostPath": str(kep_path(node, uid)),
        "containerPath": f"{KEP_ROOT}/resourceclaims/one/gpu/{DRIVER}-metadata.json",
        "options": ["ro", "nosuid", "nodev", "bind"],
    }
    facts = gpu_facts(node, "gpu-3")
    assert json.loads(Path(kep_mount["hostPath"]).read_text()) == {
        "apiVersion": "metadata.resource.k8s.io/v1alpha1",
        "kind": "DeviceMetadata",
        "metadata": {"name": "one", "namespace": "default", "uid": uid, "generation": 1},
        "requests": [
            {
                "name": "gpu",
                "devices": [
                    {
                        "name": "gpu-3",
                        "driver": DRIVER,
                        "pool": "n1",
                        "attributes": {
                            "resource.kubernetes.io/numaNode": {"int": facts["numaNode"]},
                            "resource.kubernetes.io/pciBusID": {"string": facts["pciBusID"]},
                            "type": {"string": "gpu"},
                            "uuid": {"string": facts["uuid"]},
                        },
                    }
                ],
            }
        ],
    }


def test_several_gpus_list_their_nvlink_pairs(node: Node) -> None:
    uid = prepare(node, claim_obj(name="three", uid=new_uid(), devices=["gpu-0", "gpu-1", "gpu-5"]))
    got = claim_file(node, uid)
    assert [d["gpus"] for d in got["devices"]] == [
        [gpu_facts(node, n)] for n in ("gpu-0", "gpu-1", "gpu-5")
    ]
    uuid = {n: gpu_facts(node, n)["uuid"] for n in ("gpu-0", "gpu-1", "gpu-5")}
    assert got["nvlinks"] == [  # dgx-h100: 18 links through the NVSwitches between any two
        {"minors": [0, 1], "uuids": [uuid["gpu-0"], uuid["gpu-1"]], "links": 18},
        {"minors": [0, 5], "uuids": [uuid["gpu-0"], uuid["gpu-5"]], "links": 18},
        {"minors": [1, 5], "uuids": [uuid["gpu-1"], uuid["gpu-5"]], "links": 18},
    ]


def test_mig_device_has_its_uuid_profile_and_parent(node_factory: Callable[..., Node]) -> None:
    node = node_factory("a100-mig")
    uid = prepare(node, claim_obj(name="mig", uid=new_uid(), devices=["gpu-0-mig-1g-5gb-2"]))
    (dev,) = claim_file(node, uid)["devices"]
    mig_uuid = node.driver.state.devices.devices["gpu-0-mig-1g-5gb-2"].uuid
    assert dev["type"] == "mig"
    assert dev["mig"] == {"uuid": mig_uuid, "profile": "1g.5gb"}
    assert dev["gpus"] == [gpu_facts(node, "gpu-0")]  # the parent
    assert claim_file(node, uid)["nvlinks"] == []  # MIG devices have no NVLink
    kep = json.loads(kep_path(node, uid).read_text())
    attrs = kep["requests"][0]["devices"][0]["attributes"]
    assert attrs["uuid"] == {"string": mig_uuid}
    assert attrs["profile"] == {"string": "1g.5gb"}
    assert attrs["parentUUID"] == {"string": gpu_facts(node, "gpu-0")["uuid"]}


def test_share_has_its_capacity(node: Node) -> None:
    result = sharekit.share("gpu-2", memory="20Gi", compute="25")
    uid = prepare(node, sharekit.share_claim("share", result))
    (dev,) = claim_file(node, uid)["devices"]
    assert dev["share"] == {
        "id": result["shareID"],
        "capacity": {"computeShare": "25", "memory": "20Gi"},
    }
    assert node.driver.unprepare([node.driver.state.prepared_claims()[0]]) == {uid: ""}


def test_claim_from_a_template_uses_the_pod_claim_name(node: Node) -> None:
    obj = claim_obj(name="pod-gpu-x7k2p", uid=new_uid(), devices=["gpu-1"])
    obj["metadata"]["annotations"] = {"resource.kubernetes.io/pod-claim-name": "gpu"}
    uid = prepare(node, obj)
    (device,) = spec(node, uid)["devices"]
    (mount,) = device["containerEdits"]["mounts"]
    path = f"{KEP_ROOT}/resourceclaimtemplates/gpu/gpu/{DRIVER}-metadata.json"
    assert mount["containerPath"] == path


def test_removed_on_unprepare(node: Node) -> None:
    ref = node.add(claim_obj(name="gone", uid=new_uid(), devices=["gpu-0"]))
    assert node.driver.prepare([ref])[ref.uid].error == ""
    assert claim_path(node, ref.uid).is_file() and kep_path(node, ref.uid).is_file()
    assert node.driver.unprepare([ref]) == {ref.uid: ""}
    assert list(meta_root(node).iterdir()) == []  # flat: no directory left behind either
    assert node.spec_files() == []


def test_restored_on_recovery_and_orphans_removed(node: Node) -> None:
    uid = prepare(node, claim_obj(name="kept", uid=new_uid(), devices=["gpu-0", "gpu-1"]))
    want = claim_file(node, uid)
    kep = kep_path(node, uid)
    kep_want = kep.read_text()
    claim_path(node, uid).unlink()
    kep.write_text('{"tampered": true}\n')
    (meta_root(node) / f"{atomicfile.TMP_PREFIX}{uid}.claim.json.0badf00d").write_text("half")
    stray = meta_root(node) / f"{uid}.other.metadata.json"  # carries its UID, not its record's
    stray.write_text("{}")
    orphan = new_uid()
    (meta_root(node) / f"{orphan}.claim.json").write_text("{}")
    legacy_orphan = meta_root(node) / new_uid() / "requests" / "gpu"  # an earlier version's
    legacy_orphan.mkdir(parents=True)
    (legacy_orphan / "metadata.json").write_text("{}")
    node.restart()
    assert claim_file(node, uid) == want
    assert kep.read_text() == kep_want
    assert sorted(p.name for p in meta_root(node).iterdir()) == sorted(
        [claim_path(node, uid).name, kep.name]
    )


def test_metadata_write_failure_fails_the_claim_and_leaves_nothing(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = atomicfile.write_new

    def full(path: Any, data: bytes, **kwargs: Any) -> None:
        if str(path).endswith(".metadata.json"):  # the second file: claim.json is written
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, data, **kwargs)

    monkeypatch.setattr(devicemeta.atomicfile, "write_new", full)
    ref = node.add(claim_obj(name="full", uid=new_uid(), devices=["gpu-0"]))
    error = node.driver.prepare([ref])[ref.uid].error
    assert "cannot write metadata file" in error and "(ENOSPC)" in error
    assert node.spec_files() == []
    assert list(meta_root(node).iterdir()) == []
    assert list(node.claims_dir.glob("*.json")) == []


def test_a_claim_an_earlier_version_prepared_keeps_its_directory_until_unprepared(
    node: Node,
) -> None:
    """Before issue 37 the files sat in a directory per claim, and the claim's spec (and its
    record) still mounts them there: recovery restores them there, unprepare removes it all."""
    uid = prepare(node, claim_obj(name="old", uid=new_uid(), devices=["gpu-0"]))
    old = meta_root(node) / uid
    old_claim, old_kep = old / "claim.json", old / "requests" / "gpu" / "metadata.json"
    # Rewrite the record and spec as the earlier version left them (its paths in the mounts).
    record_path = node.claims_dir / f"{uid}.json"
    text = record_path.read_text()
    text = text.replace(str(claim_path(node, uid)), str(old_claim))
    text = text.replace(str(kep_path(node, uid)), str(old_kep))
    record_path.write_text(text)
    spec_path = node.driver.state.specs.spec_path(uid)
    spec_path.write_text(json.dumps(json.loads(text)["cdiSpec"]))
    want = claim_file(node, uid)
    claim_path(node, uid).unlink()
    kep_path(node, uid).unlink()
    node.restart()
    assert json.loads(old_claim.read_text()) == want
    assert json.loads(old_kep.read_text())["requests"][0]["name"] == "gpu"
    assert [p.name for p in meta_root(node).iterdir()] == [uid]  # no flat files for it
    ref = node.driver.state.prepared_claims()[0]
    assert node.driver.unprepare([ref]) == {uid: ""}
    assert list(meta_root(node).iterdir()) == []


def test_the_paths_unprepare_removes_are_the_files_prepare_wrote(node: Node) -> None:
    """``paths`` (unprepare's list, built without the content) names exactly the keys of
    ``files`` (prepare's) and the files on disk (the legacy layout: the test after this)."""
    meta = node.driver.state.metadata
    two = prepare(node, claim_obj(name="two", uid=new_uid(), devices=["gpu-0", "gpu-1"]))
    record = node.driver.state.store.get(two)
    assert record is not None
    assert meta.paths(record) == list(meta.files(record))
    assert sorted(os.path.basename(p) for p in meta.paths(record)) == sorted(
        p.name for p in meta_root(node).iterdir() if p.name.startswith(two)
    )
