"""The static CDI spec: valid against the CDI schema, stable, and put back when it goes missing."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import referencing
import referencing.jsonschema

from dra_driver.deviceplugin import cdi, inventory
from dra_driver.devices import fake, model
from dra_driver.driver import inventory as preparable

# The kernel's table for the a100-mig profile (gpu0: GIs 1-4, gpu1: GI 1; CI 0 each).
A100_MIG_MINORS = preparable.parse_mig_minors(
    """
gpu0/gi1/access 12
gpu0/gi1/ci0/access 13
gpu0/gi2/access 21
gpu0/gi2/ci0/access 22
gpu0/gi3/access 30
gpu0/gi3/ci0/access 31
gpu0/gi4/access 39
gpu0/gi4/ci0/access 40
gpu1/gi1/access 147
gpu1/gi1/ci0/access 148
"""
)


def units(
    name: str,
    mig: inventory.MigStrategy = inventory.MigStrategy.NONE,
    mig_minors: Mapping[str, int] | None = None,
) -> list[inventory.Unit]:
    devs = fake.FakeBackend.from_name(name).discover()
    resources = inventory.build(
        devs, resource_name="nvidia.com/gpu", mig_strategy=mig, mig_minors=mig_minors
    )
    return [d.unit for r in resources for d in r.devices]


def validate(reference_dir: Path, spec: dict[str, Any]) -> None:
    folder = reference_dir / "cdi"
    schema = json.loads((folder / "schema.json").read_text())
    defs = json.loads((folder / "defs.json").read_text())
    registry: referencing.Registry[Any] = referencing.Registry().with_resource(
        "defs.json",
        referencing.Resource.from_contents(
            defs, default_specification=referencing.jsonschema.DRAFT7
        ),
    )
    jsonschema.Draft7Validator(schema, registry=registry).validate(spec)


def test_spec_is_valid_cdi_with_one_device_per_uuid(reference_dir: Path) -> None:
    us = units("dgx-1-v100")
    spec = cdi.build_spec(us, kind=cdi.DEFAULT_KIND, fake_node=None)
    validate(reference_dir, spec)
    assert spec["cdiVersion"] == "0.3.0"
    assert [d["name"] for d in spec["devices"]] == sorted(u.uuid for u in us)
    by_name = {d["name"]: d["containerEdits"] for d in spec["devices"]}
    gpu3 = us[3]
    assert by_name[gpu3.uuid] == {
        "env": [f"GPU_DEVICE_3={gpu3.uuid}"],
        "deviceNodes": [{"path": "/dev/nvidia3"}],
    }
    assert spec["containerEdits"]["deviceNodes"] == [{"path": p} for p in cdi.CONTROL_NODES]


def test_fake_spec_backs_every_node_with_dev_null(reference_dir: Path) -> None:
    us = units("h100-nvl-pairs")
    spec = cdi.build_spec(us, kind=cdi.DEFAULT_KIND, fake_node="/dev/null")
    validate(reference_dir, spec)
    assert spec["cdiVersion"] == "0.5.0"  # hostPath needs 0.5.0
    nodes = [n for d in spec["devices"] for n in d["containerEdits"]["deviceNodes"]]
    nodes += spec["containerEdits"]["deviceNodes"]
    assert {n["hostPath"] for n in nodes} == {"/dev/null"}
    per_device = {d["name"]: d["containerEdits"]["deviceNodes"][0]["path"] for d in spec["devices"]}
    assert per_device == {u.uuid: f"/dev/nvidia{u.minor}" for u in us}


def test_mig_devices_get_their_own_names_the_parent_node_and_caps(reference_dir: Path) -> None:
    us = units("a100-mig", inventory.MigStrategy.MIXED, A100_MIG_MINORS)
    spec = cdi.build_spec(us, kind=cdi.DEFAULT_KIND, fake_node=None)
    validate(reference_dir, spec)
    assert len(spec["devices"]) == 5
    mig = next(u for u in us if u.mig is not None and u.mig.placement_start == 4)
    edits = next(d["containerEdits"] for d in spec["devices"] if d["name"] == mig.uuid)
    assert edits["deviceNodes"] == [
        {"path": "/dev/nvidia0"},
        {"path": "/dev/nvidia-caps/nvidia-cap39"},  # gpu0/gi4/access
        {"path": "/dev/nvidia-caps/nvidia-cap40"},  # gpu0/gi4/ci0/access
    ]
    assert edits["env"] == [f"GPU_DEVICE_0_MIG_4={mig.uuid}"]


def test_fake_mig_caps_are_the_dra_paths_nodes_backed_by_dev_null(
    reference_dir: Path, tmp_path: Path
) -> None:
    devs = fake.FakeBackend.from_name("a100-mig").discover()
    dra = preparable.build(devs, mig_minors=None)
    us = units("a100-mig", inventory.MigStrategy.MIXED)
    static = cdi.StaticSpec(root=tmp_path, kind=cdi.DEFAULT_KIND, units=us, fake_node="/dev/null")
    assert static.ensure()
    spec = json.loads(static.path.read_text())
    validate(reference_dir, spec)
    by_name = {d["name"]: d["containerEdits"]["deviceNodes"] for d in spec["devices"]}
    for gpu in devs.gpus:
        for mig in gpu.mig_devices:
            want = dra.devices[model.mig_device_name(gpu, mig)].device_nodes
            assert len(want) == 3 and want[1].startswith("/dev/nvidia-caps/nvidia-cap")
            assert by_name[mig.uuid] == [{"path": p, "hostPath": "/dev/null"} for p in want]


def test_mig_device_without_caps_minors_is_left_out_of_the_spec(reference_dir: Path) -> None:
    minors = {k: v for k, v in A100_MIG_MINORS.items() if not k.startswith("gpu0/gi2/")}
    us = units("a100-mig", inventory.MigStrategy.MIXED, minors)
    [bad] = [u for u in us if u.problem]
    assert bad.mig is not None and bad.mig.gpu_instance_id == 2
    assert f"MIG device {bad.uuid}: no capability minor for gpu0/gi2/access" in bad.problem
    spec = cdi.build_spec(us, kind=cdi.DEFAULT_KIND, fake_node=None)
    validate(reference_dir, spec)
    assert sorted(d["name"] for d in spec["devices"]) == sorted(u.uuid for u in us if u is not bad)
    assert (
        cdi.StaticSpec(
            root=Path("/nonexistent"), kind=cdi.DEFAULT_KIND, units=[bad], fake_node=None
        ).spec
        is None
    )


@pytest.mark.parametrize("kind", ["nvidia.com", "nvidia.com/gpu.x", "-x/gpu", "a/b/c", "/gpu"])
def test_bad_kinds_are_refused(kind: str) -> None:
    with pytest.raises(cdi.CdiError, match="is not <vendor>/<class>"):
        cdi.build_spec(units("pcie-l4"), kind=kind, fake_node=None)


def test_static_spec_writes_once_and_restores_a_missing_or_edited_file(tmp_path: Path) -> None:
    spec = cdi.StaticSpec(
        root=tmp_path / "cdi",
        kind="example.com/gpu",
        units=units("pcie-l4"),
        fake_node=None,
    )
    assert spec.path == tmp_path / "cdi" / "example.com-gpu.json"
    assert spec.ensure() is True
    assert spec.ensure() is False  # unchanged: no rewrite
    spec.path.write_text("{}")
    assert spec.ensure() is True
    assert json.loads(spec.path.read_text()) == spec.spec
    spec.path.unlink()
    assert spec.ensure() is True and spec.path.is_file()
    assert [p.name for p in spec.path.parent.iterdir()] == ["example.com-gpu.json"]


def test_unwritable_cdi_root_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    spec = cdi.StaticSpec(
        root=blocker / "cdi", kind=cdi.DEFAULT_KIND, units=units("pcie-l4"), fake_node=None
    )
    with pytest.raises(cdi.CdiError, match=r"cannot write CDI spec .*not-a-dir/cdi"):
        spec.ensure()


# The spec's exact content (the schema checks above need ../shared; these do not).


def test_spec_content_for_whole_gpus() -> None:
    us = units("pcie-l4")
    spec = cdi.build_spec(us, kind=cdi.DEFAULT_KIND, fake_node=None)
    assert list(spec) == ["cdiVersion", "kind", "devices", "containerEdits"]
    assert spec == {
        "cdiVersion": "0.3.0",
        "kind": cdi.DEFAULT_KIND,
        "devices": [
            {
                "name": u.uuid,
                "containerEdits": {
                    "env": [f"GPU_DEVICE_{u.minor}={u.uuid}"],
                    "deviceNodes": [{"path": f"/dev/nvidia{u.minor}"}],
                },
            }
            for u in sorted(us, key=lambda u: u.uuid)
        ],
        "containerEdits": {"deviceNodes": [{"path": p} for p in cdi.CONTROL_NODES]},
    }


def test_spec_content_with_a_fake_node_and_mig_devices(tmp_path: Path) -> None:
    us = units("a100-mig", inventory.MigStrategy.MIXED, A100_MIG_MINORS)
    static = cdi.StaticSpec(
        root=tmp_path / "run" / "cdi", kind=cdi.DEFAULT_KIND, units=us, fake_node="/dev/null"
    )
    assert static.ensure() is True  # parents created
    spec = json.loads(static.path.read_text())
    assert spec == static.spec and spec["cdiVersion"] == "0.5.0"
    assert spec["containerEdits"] == {
        "deviceNodes": [{"path": p, "hostPath": "/dev/null"} for p in cdi.CONTROL_NODES]
    }
    mig = next(u for u in us if u.mig is not None and u.mig.placement_start == 4)
    [entry] = [d for d in spec["devices"] if d["name"] == mig.uuid]
    assert entry == {
        "name": mig.uuid,
        "containerEdits": {
            "env": [f"GPU_DEVICE_0_MIG_4={mig.uuid}"],
            "deviceNodes": [
                {"path": p, "hostPath": "/dev/null"}
                for p in (
                    "/dev/nvidia0",
                    "/dev/nvidia-caps/nvidia-cap39",
                    "/dev/nvidia-caps/nvidia-cap40",
                )
            ],
        },
    }


def test_a_spec_the_cdi_rules_refuse_is_not_built() -> None:
    first, second = units("pcie-l4")[:2]
    bad = [dataclasses.replace(first, uuid="GPU 0!"), dataclasses.replace(second, uuid="GPU 1!")]
    with pytest.raises(cdi.CdiError) as err:
        cdi.build_spec(bad, kind=cdi.DEFAULT_KIND, fake_node=None)
    assert str(err.value) == (
        f"static CDI spec {cdi.DEFAULT_KIND} would be invalid: "
        "devices[0].name 'GPU 0!' is not a valid CDI device name; "
        "devices[1].name 'GPU 1!' is not a valid CDI device name"
    )


def test_bad_kind_error_is_exact() -> None:
    with pytest.raises(cdi.CdiError) as err:
        cdi.check_kind("nvidia.com")
    assert str(err.value) == (
        "CDI kind 'nvidia.com' is not <vendor>/<class> (vendor like example.com, class of "
        "letters, digits, '_' and '-', e.g. k8s.device-plugin.nvidia.com/gpu)"
    )


def test_a_node_without_usable_devices_writes_nothing(tmp_path: Path) -> None:
    spec = cdi.StaticSpec(root=tmp_path, kind=cdi.DEFAULT_KIND, units=[], fake_node=None)
    assert spec.spec is None
    assert spec.ensure() is False
    assert list(tmp_path.iterdir()) == []
