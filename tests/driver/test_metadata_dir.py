"""``--metadata-dir`` (issue 46): the claim metadata files in a configured directory (a tmpfs),
claims prepared before a change of it served where their spec mounts them, real files."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dra_driver import cli
from dra_driver.cli import common, kubelet_plugin
from dra_driver.driver import atomicfile, checkpoint, metadataroots

from .conftest import Node, claim_obj, new_uid
from .test_metadata import prepare, spec


def default_root(node: Node) -> Path:
    return node.settings.plugin_dir / "claim-metadata"


def names(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


def files_of(uid: str) -> list[str]:
    return sorted([f"{uid}.claim.json", f"{uid}.gpu.metadata.json"])


def host_paths(s: dict[str, Any]) -> list[str]:
    """Every host path the spec mounts: the claim-wide mounts and each device's."""
    mounts = list(s["containerEdits"]["mounts"])
    for device in s["devices"]:
        mounts += device["containerEdits"].get("mounts", [])
    return [m["hostPath"] for m in mounts if m["hostPath"].endswith(".json")]


def record(node: Node, uid: str) -> checkpoint.ClaimRecord:
    found = node.driver.state.store.get(uid)
    assert found is not None
    return found


def test_a_prepare_writes_under_the_metadata_dir_and_its_spec_mounts_them_there(
    node_factory: Callable[..., Node], tmp_path: Path
) -> None:
    where = tmp_path / "run" / "claim-metadata"
    node = node_factory(metadata_dir=where)
    ref = node.add(claim_obj(name="tmpfs", uid=new_uid(), devices=["gpu-0"]))
    assert node.driver.prepare([ref])[ref.uid].error == ""
    assert names(where) == files_of(ref.uid)
    assert names(default_root(node)) == []
    assert sorted(host_paths(spec(node, ref.uid))) == [
        str(where / f"{ref.uid}.claim.json"),
        str(where / f"{ref.uid}.gpu.metadata.json"),
    ]
    assert json.loads((where / f"{ref.uid}.claim.json").read_text())["claim"]["uid"] == ref.uid
    assert node.driver.unprepare([ref]) == {ref.uid: ""}
    assert names(where) == [] and node.spec_files() == []


def test_a_claim_prepared_before_the_setting_keeps_the_default_dir_until_unprepared(
    node: Node, tmp_path: Path
) -> None:
    old = prepare(node, claim_obj(name="old", uid=new_uid(), devices=["gpu-0"]))
    assert names(default_root(node)) == files_of(old)
    where = tmp_path / "run-meta"
    node.restart(metadata_dir=where)  # a restart with the new setting
    assert names(default_root(node)) == files_of(old)  # not swept as files without a record
    assert names(where) == []
    (default_root(node) / f"{old}.claim.json").unlink()
    node.restart()
    assert names(default_root(node)) == files_of(old)  # restored where its spec mounts it
    assert names(where) == []
    assert node.driver.state.metadata.root_of(record(node, old)).root == default_root(node)
    new = prepare(node, claim_obj(name="new", uid=new_uid(), devices=["gpu-1"]))
    assert names(where) == files_of(new)
    old_ref, new_ref = sorted(node.driver.state.prepared_claims(), key=lambda r: r.uid != old)
    assert node.driver.unprepare([old_ref]) == {old: ""}
    assert names(default_root(node)) == []
    assert names(where) == files_of(new)
    assert node.driver.unprepare([new_ref]) == {new: ""}
    assert names(where) == []


def test_start_up_sweeps_files_without_a_record_in_the_new_and_the_default_dir(
    node_factory: Callable[..., Node], tmp_path: Path
) -> None:
    where = tmp_path / "run-meta"
    node = node_factory(metadata_dir=where)
    kept = prepare(node, claim_obj(name="kept", uid=new_uid(), devices=["gpu-0"]))
    default_root(node).mkdir(parents=True)
    for root in (where, default_root(node)):
        orphan = new_uid()
        (root / f"{orphan}.claim.json").write_text("{}")
        (root / f"{orphan}.gpu.metadata.json").write_text("{}")
        (root / f"{atomicfile.TMP_PREFIX}{orphan}.claim.json.0badf00d").write_text("half")
    node.restart()
    assert names(where) == files_of(kept)
    assert names(default_root(node)) == []


def test_a_relative_metadata_dir_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("METADATA_DIR", "run/claim-metadata")
    assert cli.main(["kubelet-plugin", "--node-name", "n1", "--fake", "dgx-h100"]) == 2
    err = capsys.readouterr().err
    assert "--metadata-dir (or METADATA_DIR) 'run/claim-metadata': not an absolute path" in err
    argv = ["kubelet-plugin", "--node-name", "n1", "--metadata-dir", "meta"]
    with pytest.raises(common.UsageError, match=r"--metadata-dir .*'meta'"):
        kubelet_plugin.settings_from(cli.build_parser().parse_args(argv))


def test_the_setting_from_the_flag_its_twin_or_neither(monkeypatch: pytest.MonkeyPatch) -> None:
    def parse(argv: list[str]) -> Path | None:
        args = cli.build_parser().parse_args(["kubelet-plugin", "--node-name", "n1", *argv])
        return kubelet_plugin.settings_from(args).metadata_dir

    monkeypatch.delenv("METADATA_DIR", raising=False)
    assert parse([]) is None
    monkeypatch.setenv("METADATA_DIR", "")
    assert parse([]) is None  # empty: the default
    monkeypatch.setenv("METADATA_DIR", "/run/dra-driver/claim-metadata")
    assert parse([]) == Path("/run/dra-driver/claim-metadata")
    assert parse(["--metadata-dir", "/run/x"]) == Path("/run/x")


def test_a_record_naming_a_third_dir_is_served_from_it(node: Node, tmp_path: Path) -> None:
    """Configured once, changed since: a claim of the first setting is in neither the new
    directory nor the default one; its root is made on first use."""
    first, second = tmp_path / "first", tmp_path / "second"
    node.restart(metadata_dir=first)
    uid = prepare(node, claim_obj(name="first", uid=new_uid(), devices=["gpu-0"]))
    node.restart(metadata_dir=second)
    roots = node.driver.state.metadata
    owner = roots.root_of(record(node, uid))
    assert owner.root == first and owner not in (roots.primary, roots.default)
    assert names(first) == files_of(uid)
    (first / f"{uid}.gpu.metadata.json").unlink()
    node.restart()
    assert names(first) == files_of(uid)  # restored there
    assert names(second) == [] and names(default_root(node)) == []
    (ref,) = node.driver.state.prepared_claims()
    assert node.driver.unprepare([ref]) == {uid: ""}
    assert names(first) == []


def test_an_earlier_layout_claim_is_restored_in_the_default_dir(node: Node, tmp_path: Path) -> None:
    """A claim of the layout before issue 37 (a directory per claim) under the default root
    stays there when a metadata directory is configured."""
    uid = prepare(node, claim_obj(name="older", uid=new_uid(), devices=["gpu-0"]))
    legacy = default_root(node) / uid / "claim.json"
    record_path = node.claims_dir / f"{uid}.json"
    text = record_path.read_text().replace(
        str(default_root(node) / f"{uid}.claim.json"), str(legacy)
    )
    record_path.write_text(text)
    node.driver.state.specs.spec_path(uid).write_text(json.dumps(json.loads(text)["cdiSpec"]))
    for name in files_of(uid):
        (default_root(node) / name).unlink()
    where = tmp_path / "run-meta"
    node.restart(metadata_dir=where)
    assert legacy.is_file() and names(where) == []
    (ref,) = node.driver.state.prepared_claims()
    assert node.driver.unprepare([ref]) == {uid: ""}
    assert names(default_root(node)) == []


def test_a_device_model_change_reaches_every_root(node: Node, tmp_path: Path) -> None:
    roots = metadataroots.MetadataRoots(
        default=tmp_path / "d",
        primary=tmp_path / "p",
        driver_name="gpu.nvidia.com",
        devices=node.driver.state.devices,
    )
    assert roots.local() == (roots.primary, roots.default)
    other = roots._root(str(tmp_path / "o"))
    now = dataclasses.replace(node.driver.state.devices)
    assert now is not node.driver.state.devices
    roots.devices = now
    assert all(r.devices is now for r in (roots.primary, roots.default, other))
    same = metadataroots.MetadataRoots(
        default=tmp_path / "d", primary=tmp_path / "d", driver_name="x", devices=now
    )
    assert same.local() == (same.default,)  # the same directory: one root, swept once


def test_a_record_whose_spec_names_no_mount_is_removed_from_both_dirs(
    node: Node, tmp_path: Path
) -> None:
    """An interrupted prepare's record can carry an empty spec (dynamic MIG, VFIO: built once
    the devices exist): its files may be in either directory."""
    uid = prepare(node, claim_obj(name="empty", uid=new_uid(), devices=["gpu-0"]))
    node.restart(metadata_dir=tmp_path / "run-meta")
    bare = dataclasses.replace(record(node, uid), cdiSpec={})
    (ref,) = node.driver.state.prepared_claims()
    assert node.driver.state.metadata.remove(ref, bare) is True
    assert names(default_root(node)) == []
    assert node.driver.state.metadata.remove(ref, bare) is False
