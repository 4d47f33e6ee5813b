"""CDI specs: contents, names, minimum cdiVersion, upstream schema, missing device nodes."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from dra_driver.devices import fake, migcontrol, migprofiles
from dra_driver.driver import atomicfile, cdi, checkpoint, claims, config, driverfiles, inventory

from .conftest import REFERENCE, make_driver_root

REF = claims.ClaimRef(uid="0b5e2c1a-77aa-4c1e-9d9e-2b7b1c9f0a11", namespace="ns", name="c")


def planned(
    names: list[str],
    profile: str = "dgx-h100",
    request: str = "gpu",
    env: dict[str, str] | None = None,
) -> list[cdi.Planned]:
    inv = inventory.build(fake.FakeBackend.from_name(profile).discover(), mig_minors=None)
    cfg = dataclasses.replace(config.DEFAULT, env=env or {})
    out = []
    for n in names:
        dev = inv.get(n)
        assert dev is not None, n
        out.append(cdi.Planned(device=dev, request=request, config=cfg))
    return out


def specs(
    tmp_path: Path,
    *,
    fake_node: str | None = "/dev/null",
    dev_root: Path = Path("/"),
    files: bool = True,
) -> cdi.CdiSpecs:
    mounts = driverfiles.discover(make_driver_root(tmp_path / "root")) if files else ()
    return cdi.CdiSpecs(
        root=tmp_path / "cdi",
        driver_name="gpu.nvidia.com",
        host=cdi.HostDevices(fake_node=fake_node, dev_root=dev_root),
        driver_files=mounts,
    )


def test_fake_spec_passes_the_cdi_schema(
    tmp_path: Path, cdi_validator: jsonschema.protocols.Validator
) -> None:
    cdi_validator.validate(specs(tmp_path).build(REF, planned(["gpu-0", "gpu-3"], env={"X": "1"})))


def test_fake_spec_contents(tmp_path: Path) -> None:
    s = specs(tmp_path)
    spec = s.build(REF, planned(["gpu-0", "gpu-3"], env={"X": "1"}))
    assert cdi.check(spec) == []
    assert spec["kind"] == "k8s.gpu.nvidia.com/claim"
    assert spec["cdiVersion"] == "0.5.0"  # hostPath (and a name starting with a digit)
    assert [d["name"] for d in spec["devices"]] == [f"{REF.uid}-gpu-0", f"{REF.uid}-gpu-3"]
    assert spec["devices"][1]["containerEdits"] == {
        "deviceNodes": [{"path": "/dev/nvidia3", "hostPath": "/dev/null"}],
        "env": ["X=1"],
    }
    assert spec["devices"][0]["containerEdits"] == {
        "deviceNodes": [{"path": "/dev/nvidia0", "hostPath": "/dev/null"}],
        "env": ["X=1"],
    }
    common = spec["containerEdits"]
    assert [n["path"] for n in common["deviceNodes"]] == list(cdi.CONTROL_NODES)
    uuids = ",".join(p.device.uuid for p in planned(["gpu-0", "gpu-3"]))
    assert common["env"] == [f"NVIDIA_VISIBLE_DEVICES={uuids}", "NVIDIA_DRA_CLAIM=ns/c"]
    mounts = {m["containerPath"]: m for m in common["mounts"]}
    assert sorted(mounts) == [
        "/usr/bin/nvidia-smi",
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05",
        "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05",
    ]
    # Links resolve inside the driver root, absolute ones included.
    assert mounts["/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"]["hostPath"] == str(
        tmp_path / "root/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05"
    )
    assert all(m["options"] == ["ro", "nosuid", "nodev", "bind"] for m in mounts.values())


def test_two_requests_make_visible_devices_void(tmp_path: Path) -> None:
    s = specs(tmp_path)
    both = planned(["gpu-0"], request="a") + planned(["gpu-1"], request="b")
    assert "NVIDIA_VISIBLE_DEVICES=void" in s.build(REF, both)["containerEdits"]["env"]


def test_mig_device_gets_its_capability_nodes(tmp_path: Path) -> None:
    devs = fake.FakeBackend.from_name("a100-mig").discover()
    minors = {"gpu0/gi1/access": 21, "gpu0/gi1/ci0/access": 22}
    inv = inventory.build(devs, mig_minors=minors)
    names = sorted(n for n, d in inv.devices.items() if d.kind == "mig")
    first = next(d for d in inv.devices.values() if d.kind == "mig" and not d.problem)
    assert first.device_nodes == (
        "/dev/nvidia0",
        "/dev/nvidia-caps/nvidia-cap21",
        "/dev/nvidia-caps/nvidia-cap22",
    )
    broken = [inv.devices[n] for n in names if inv.devices[n].problem]
    assert broken and "no capability minor for gpu" in broken[0].problem
    table = inventory.parse_mig_minors("config 1\nmonitor 2\ngpu0/gi1/access 21\nbogus\n")
    assert table == {"config": 1, "monitor": 2, "gpu0/gi1/access": 21}


def test_capability_nodes_of_dynamic_instances_fake_and_real() -> None:
    # Fake mode: made-up but stable and distinct numbers per GPU minor, GI and CI.
    assert inventory.mig_nodes(1, 2, 3, None) == (
        ("/dev/nvidia-caps/nvidia-cap223", "/dev/nvidia-caps/nvidia-cap227"),
        "",
    )
    table = {"gpu0/gi1/access": 30, "gpu0/gi1/ci0/access": 31}
    assert inventory.mig_nodes(0, 1, 0, table) == (
        ("/dev/nvidia-caps/nvidia-cap30", "/dev/nvidia-caps/nvidia-cap31"),
        "",
    )
    assert inventory.mig_nodes(0, 2, 0, table) == (
        (),
        "no capability minor for gpu0/gi2/access, gpu0/gi2/ci0/access in "
        "/proc/driver/nvidia-caps/mig-minors (is the MIG device still there?)",
    )
    devs = fake.FakeBackend.from_name("h100-mig").discover()
    inv = inventory.build(devs, mig_minors=table, dynamic=migprofiles.DynamicMig.parse("all"))
    planned = inv.devices["gpu-0-mig-1g-10gb-0"]
    assert planned.placement is not None
    made = migcontrol.Instance(
        parent_uuid=planned.placement.parent_uuid,
        profile_id=planned.placement.profile_id,
        start=0,
        size=1,
        gpu_instance_id=7,
        compute_instance_id=0,
        uuid="MIG-made",
    )
    created = inv.created(planned, made)
    assert created.uuid == "MIG-made" and created.device_nodes == ("/dev/nvidia0",)
    assert created.problem == (
        "no capability minor for gpu0/gi7/access, gpu0/gi7/ci0/access in "
        "/proc/driver/nvidia-caps/mig-minors (is the MIG device still there?)"
    )


def test_real_mode_plain_spec_is_0_3_or_0_5_and_uses_host_nodes(tmp_path: Path) -> None:
    dev = tmp_path / "host/dev"
    dev.mkdir(parents=True)
    for name in ("nvidia0", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"):
        (dev / name).symlink_to("/dev/null")  # a real character device
    s = specs(tmp_path, fake_node=None, dev_root=tmp_path / "host", files=False)
    ref = claims.ClaimRef(uid="ab5e2c1a-77aa-4c1e-9d9e-2b7b1c9f0a11", namespace="ns", name="c")
    spec = s.build(ref, planned(["gpu-0"]))
    assert spec["cdiVersion"] == "0.3.0"  # no hostPath, name starts with a letter
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidia0"}]
    assert s.build(REF, planned(["gpu-0"]))["cdiVersion"] == "0.5.0"  # digit-leading name


def test_real_mode_missing_device_node_fails_the_claim(tmp_path: Path) -> None:
    (tmp_path / "host/dev").mkdir(parents=True)
    (tmp_path / "host/dev/nvidia0").write_text("a regular file, not a device")
    s = specs(tmp_path, fake_node=None, dev_root=tmp_path / "host")
    with pytest.raises(cdi.CdiError, match=r"device node /dev/nvidia3 needed by gpu-3 does not"):
        s.build(REF, planned(["gpu-3"]))
    with pytest.raises(cdi.CdiError, match="not a character device"):
        s.build(REF, planned(["gpu-0"]))
    assert not (tmp_path / "cdi").exists()


def test_write_is_atomic_and_remove_idempotent(tmp_path: Path) -> None:
    s = specs(tmp_path)
    spec = s.build(REF, planned(["gpu-0"]))
    path = s.write(REF.uid, spec)
    assert path.name == f"k8s.gpu.nvidia.com-claim_{REF.uid}.json"
    assert json.loads(path.read_text()) == spec
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp files left
    assert s.claim_uids_on_disk() == [REF.uid]
    assert s.remove(REF.uid) is True
    assert s.remove(REF.uid) is False


@pytest.mark.parametrize("env", [{"X": "1"}, {"X": "ä"}, {"X": "\x7f"}, {"X": "\x00\n"}])
def test_a_spec_encoded_for_the_record_is_written_as_it_is_where_the_bytes_agree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str]
) -> None:
    s = specs(tmp_path)
    spec = s.build(REF, planned(["gpu-0", "gpu-1"], env=env))
    plain = s.write(REF.uid, spec).read_bytes()
    assert plain == (json.dumps(spec, separators=(",", ":")) + "\n").encode()
    encoded: list[object] = []
    real = atomicfile.write_json
    monkeypatch.setattr(
        atomicfile, "write_json", lambda *a, **k: (encoded.append(a), real(*a, **k))
    )
    text = checkpoint.encode_json(spec)
    assert s.write(REF.uid, spec, text=text).read_bytes() == plain  # the same bytes either way
    # ASCII without DEL: written as given; otherwise json.dumps escapes it, so it is encoded again
    assert len(encoded) == (0 if text.isascii() and "\x7f" not in text else 1)


@pytest.mark.parametrize(
    ("change", "version"),
    [
        ({}, "0.3.0"),
        ({"mount_type": True}, "0.4.0"),
        ({"host_path": True}, "0.5.0"),
        ({"digit_name": True}, "0.5.0"),
        ({"annotations": True}, "0.6.0"),
        ({"dotted_class": True}, "0.6.0"),
        ({"gids": True}, "0.7.0"),
        ({"net": True}, "1.1.0"),
        ({"rdt": True}, "0.7.0"),
        ({"rdt_schemata": True}, "1.1.0"),
        ({"rdt_monitoring": True}, "1.1.0"),
    ],
)
def test_minimum_version(change: dict[str, bool], version: str) -> None:
    spec: dict[str, Any] = {
        "cdiVersion": "0.3.0",
        "kind": "vendor.com/class.x" if change.get("dotted_class") else "vendor.com/class",
        "devices": [
            {
                "name": "0dev" if change.get("digit_name") else "dev",
                "containerEdits": {
                    "deviceNodes": [
                        {
                            "path": "/dev/x",
                            **({"hostPath": "/dev/null"} if change.get("host_path") else {}),
                        }
                    ],
                    "mounts": [
                        {
                            "hostPath": "/a",
                            "containerPath": "/b",
                            **({"type": "bind"} if change.get("mount_type") else {}),
                        }
                    ],
                    **({"additionalGids": [5]} if change.get("gids") else {}),
                    **({"intelRdt": {"closID": "c"}} if change.get("rdt") else {}),
                    **(
                        {"intelRdt": {"schemata": ["L3:0=f"]}} if change.get("rdt_schemata") else {}
                    ),
                    **(
                        {"intelRdt": {"enableMonitoring": True}}
                        if change.get("rdt_monitoring")
                        else {}
                    ),
                    **(
                        {"netDevices": [{"hostInterfaceName": "a", "name": "b"}]}
                        if change.get("net")
                        else {}
                    ),
                },
            }
        ],
    }
    if change.get("annotations"):
        spec["annotations"] = {"a": "b"}
    assert cdi.minimum_version(spec) == version


STRICTER_BAD: dict[str, Any] = {
    "cdiVersion": "0.3.0",
    "kind": "-vendor/cl.ass",
    "devices": [
        {"name": "-x", "containerEdits": {}},
        {"name": "-x", "containerEdits": {"env": ["=1"], "deviceNodes": [{"path": "dev"}]}},
    ],
    "containerEdits": {"env": ["NOVALUE"], "deviceNodes": [{"path": "dev/nvidiactl"}]},
}


def test_what_our_checks_refuse_is_named_exactly() -> None:
    assert cdi.check(STRICTER_BAD) == [
        "cdiVersion 0.3.0 is below the required 0.6.0",
        "kind '-vendor/cl.ass' is not a valid vendor/class",
        "devices[0].name '-x' is not a valid CDI device name",
        "devices[0] (-x) has empty containerEdits",
        "devices[1].name '-x' is not a valid CDI device name",
        "devices[1].name '-x' is not unique",
        "containerEdits.env entry 'NOVALUE' is not NAME=VALUE",
        "containerEdits.deviceNodes path 'dev/nvidiactl' is not absolute",
        "devices[1].containerEdits.env entry '=1' is not NAME=VALUE",
        "devices[1].containerEdits.deviceNodes path 'dev' is not absolute",
    ]
    good: dict[str, Any] = {
        "cdiVersion": "0.3.0",
        "kind": "vendor.com/" + "c" * 63,
        "devices": [{"name": "d", "containerEdits": {"env": ["A=1"]}}],
    }
    assert cdi.check(good) == []
    good["kind"] += "c"  # a class name is 63 characters at most
    assert cdi.check(good) == [f"kind {good['kind']!r} is not a valid vendor/class"]


def test_stricter_checks_than_the_schema(cdi_validator: jsonschema.protocols.Validator) -> None:
    bad = STRICTER_BAD
    cdi_validator.validate(bad)  # the schema is happy ...
    problems = "; ".join(cdi.check(bad))  # ... we are not
    for expect in (
        "is below the required 0.6.0",
        "not a valid vendor/class",
        "'-x' is not a valid CDI device name",
        "is not unique",
        "has empty containerEdits",
        "'=1' is not NAME=VALUE",
        "is not absolute",
    ):
        assert expect in problems
    assert "not a known CDI version" in "; ".join(cdi.check({**bad, "cdiVersion": "9.9.9"}))


def test_upstream_fixtures_pass_and_fail_the_schema(
    cdi_validator: jsonschema.protocols.Validator,
) -> None:
    for good in sorted((REFERENCE / "cdi/testdata/good").glob("*.json")):
        spec = json.loads(good.read_text())
        cdi_validator.validate(spec)
        assert cdi.check(spec) == [], good.name
    assert not cdi_validator.is_valid({})
