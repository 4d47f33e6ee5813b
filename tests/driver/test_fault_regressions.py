"""Regressions of issue 16, driver core: what fault injection found in prepare, unprepare and
start-up recovery (defects 1, 2, 4, 6 and 11). Each test failed before its fix."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from dra_driver import app, logs
from dra_driver.devices import control, fake
from dra_driver.driver import claims
from dra_driver.driver import driver as driver_mod
from dra_driver.testing import faultinject

from .conftest import Node, claim_obj, gpu_config, new_uid, opaque


def time_sliced(interval: str) -> dict[str, Any]:
    return opaque(
        gpu_config(sharing={"strategy": "TimeSlicing", "timeSlicing": {"interval": interval}})
    )


def spec_name(uid: str) -> str:
    return f"k8s.gpu.nvidia.com-claim_{uid}.json"


def with_gpu_control(node: Node, gpu: control.GpuControl, **changes: Any) -> driver_mod.Driver:
    """Restart ``node``'s driver with ``gpu`` as its GPU control (and settings ``changes``)."""
    node.driver.close()
    node.settings = dataclasses.replace(node.settings, **changes)
    node.driver = app.build_driver(
        node.settings,
        devices=fake.FakeBackend.from_name("dgx-h100").discover(),
        api=node.api,
        log=logs.get("test"),
        gpu_control=gpu,
    )
    return node.driver


def fake_gpu(state_file: Path) -> control.FakeGpuControl:
    return control.FakeGpuControl.for_devices(
        fake.FakeBackend.from_name("dgx-h100").discover(), state_file=state_file
    )


def gpu_uuid(node: Node, device: str) -> str:
    found = node.driver.state.devices.get(device)
    assert found is not None
    return found.uuid


# ---- defect 1: a failed prepare must release everything it can, and say why it failed -------


def test_prepare_failing_on_a_read_only_cdi_dir_releases_the_gpu_and_reports_the_cause(
    node: Node,
) -> None:
    first = node.add(claim_obj(name="first", uid=new_uid(), devices=["gpu-0"]))
    second = node.add(claim_obj(name="second", uid=new_uid(), devices=["gpu-0"]))
    node.cdi_root.mkdir(parents=True, exist_ok=True)
    with faultinject.failing_files(node.cdi_root, errno=errno.EROFS):
        error = node.driver.prepare([first])[first.uid].error
    assert "ResourceClaim default/first" in error
    assert f"cannot write CDI spec {node.cdi_root / spec_name(first.uid)}" in error
    assert "Read-only file system (EROFS)" in error
    assert "internal error" not in error and "rolling back" not in error
    assert not (node.claims_dir / f"{first.uid}.json").exists()
    # The failed claim holds nothing: the GPU goes to the next claim.
    assert node.driver.prepare([second])[second.uid].error == ""


def test_a_rollback_that_cannot_finish_keeps_the_original_cause_first(node: Node) -> None:
    ref = node.add(claim_obj(name="c", uid=new_uid(), devices=["gpu-1"]))
    other = node.add(claim_obj(name="d", uid=new_uid(), devices=["gpu-1"]))
    real_write = node.driver.state.specs.write
    with contextlib.ExitStack() as read_only:

        def write_then_fail(uid: str, spec: Any, text: str | None = None) -> Any:
            real_write(uid, spec, text=text)  # the spec lands, then both directories turn read-only
            read_only.enter_context(
                faultinject.failing_files(node.cdi_root, node.claims_dir, errno=errno.EROFS)
            )
            raise OSError(errno.ENOSPC, "No space left on device", str(node.cdi_root))

        node.driver.state.specs.write = write_then_fail  # type: ignore[method-assign]
        error = node.driver.prepare([ref])[ref.uid].error
    node.driver.state.specs.write = real_write  # type: ignore[method-assign]
    assert error.startswith(f"ResourceClaim default/c (uid {ref.uid}): cannot write CDI spec")
    assert error.index("No space left on device") < error.index("; rolling back left: ")
    assert "cannot remove CDI spec" in error and "cannot remove checkpoint" in error
    left = error.split("; rolling back left: ", 1)[1]
    assert left.startswith(f"{ref}: cannot remove CDI spec ")
    assert f"(EROFS); cannot remove checkpoint of claim {ref.uid}: " in left  # one after another
    # The device was released all the same; the next start-up finishes the rest.
    assert node.driver.prepare([other])[other.uid].error == ""
    node.restart()
    assert node.spec_files() == [spec_name(other.uid)]
    assert not (node.claims_dir / f"{ref.uid}.json").exists()


def test_cleanup_releases_device_ownership_that_no_record_backs(node: Node) -> None:
    ghost = node.add(claim_obj(name="ghost", uid=new_uid(), devices=["gpu-2"]))
    later = node.add(claim_obj(name="later", uid=new_uid(), devices=["gpu-2"]))
    claim = node.api.get_resource_claim("default", "ghost")
    node.driver.state.ownership.reserve(  # what a rollback that stopped half-way left
        ghost, claims.allocated_devices(claim, ref=ghost, driver="gpu.nvidia.com", pool="n1")
    )
    assert "already prepared for claim" in node.driver.prepare([later])[later.uid].error
    node.driver.cleanup()
    assert node.driver.prepare([later])[later.uid].error == ""


# ---- defect 6: I/O errors are per-claim errors naming the file; no spec outlives its record --


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EACCES])
def test_cdi_directory_io_errors_are_clear_and_unprepare_keeps_the_record(
    node: Node, code: int
) -> None:
    ref = node.add(claim_obj(name="io", uid=new_uid(), devices=["gpu-3"]))
    node.cdi_root.mkdir(parents=True, exist_ok=True)
    spec = node.cdi_root / spec_name(ref.uid)
    with faultinject.failing_files(node.cdi_root, errno=code):
        error = node.driver.prepare([ref])[ref.uid].error
    assert error == (
        f"ResourceClaim default/io (uid {ref.uid}): cannot write CDI spec {spec}: "
        f"{os.strerror(code)} ({errno.errorcode[code]})"
    )
    assert node.driver.prepare([ref])[ref.uid].error == ""
    record = node.claims_dir / f"{ref.uid}.json"
    with faultinject.failing_files(node.cdi_root, errno=code):
        error = node.driver.unprepare([ref])[ref.uid]
    assert error.startswith(f"ResourceClaim default/io (uid {ref.uid}): cannot remove CDI spec")
    assert str(spec) in error and "internal error" not in error
    assert spec.exists() and record.exists()  # still prepared: the kubelet retries
    node.restart()  # and a restart in between changes nothing
    assert spec.exists() and record.exists()
    assert node.driver.unprepare([ref]) == {ref.uid: ""}
    assert not spec.exists() and not record.exists()


# ---- defect 4: any unreadable checkpoint file is moved aside, never a crash loop -------------


@pytest.mark.parametrize(
    "content",
    [b"[" * 100_000, b'{"a":' * 50_000, b" " * (5 << 20)],
    ids=["deep-list", "deep-object", "huge"],
)
def test_a_pathological_checkpoint_file_is_moved_aside_at_start_up(
    node: Node, content: bytes
) -> None:
    keep = node.add(claim_obj(name="keep", uid=new_uid(), devices=["gpu-4"]))
    assert node.driver.prepare([keep])[keep.uid].error == ""
    bad_uid = new_uid()
    (node.claims_dir / f"{bad_uid}.json").write_bytes(content)
    node.restart()
    aside = list((node.settings.plugin_dir / "claims-aside").iterdir())
    assert [p.name.split(".json.")[0] for p in aside] == [bad_uid]
    assert node.driver.state.store.get(keep.uid) is not None
    assert node.spec_files() == [spec_name(keep.uid)]


# ---- defect 2: a GPU whose record is unreadable is not left time-sliced ----------------------


def test_an_unreadable_record_does_not_leave_its_gpu_time_sliced(node: Node) -> None:
    gpu = fake_gpu(node.settings.plugin_dir.parent / "gpu-state.json")
    with_gpu_control(node, gpu)
    sliced = node.add(
        claim_obj(name="sliced", uid=new_uid(), devices=["gpu-5"], config=[time_sliced("Long")])
    )
    held = node.add(
        claim_obj(name="held", uid=new_uid(), devices=["gpu-6"], config=[time_sliced("Short")])
    )
    assert {r.error for r in node.driver.prepare([sliced, held]).values()} == {""}
    settings = gpu.settings()
    assert settings[gpu_uuid(node, "gpu-5")]["timeslice"] == 3
    (node.claims_dir / f"{sliced.uid}.json").write_bytes(b'{"version": 1, "uid": ')  # torn
    gpu = fake_gpu(gpu.state_file or Path())
    with_gpu_control(node, gpu)
    settings = gpu.settings()
    assert settings[gpu_uuid(node, "gpu-5")]["timeslice"] == 0  # back to its default
    assert settings[gpu_uuid(node, "gpu-6")]["timeslice"] == 1  # a readable record holds it
    exclusive = node.add(claim_obj(name="excl", uid=new_uid(), devices=["gpu-5"]))
    assert node.driver.prepare([exclusive])[exclusive.uid].error == ""


# ---- defect 11: time-slicing holders are shared by the two instances of a node --------------


def test_one_instance_releasing_a_claim_keeps_a_gpu_the_other_instance_time_slices(
    node: Node,
) -> None:
    gpu = fake_gpu(node.settings.plugin_dir.parent / "gpu-state.json")
    a = with_gpu_control(node, gpu, pod_uid=str(uuid.uuid4()))
    b = app.build_driver(
        dataclasses.replace(node.settings, pod_uid=str(uuid.uuid4())),
        devices=fake.FakeBackend.from_name("dgx-h100").discover(),
        api=node.api,
        log=logs.get("test"),
        gpu_control=gpu,
    )
    try:

        def on_gpu7(name: str, interval: str, admin: bool) -> Any:
            result: dict[str, Any] = {
                "request": "gpu",
                "driver": "gpu.nvidia.com",
                "pool": "n1",
                "device": "gpu-7",
            }
            if admin:
                result["adminAccess"] = True
            return node.add(
                claim_obj(
                    name=name, uid=new_uid(), results=[result], config=[time_sliced(interval)]
                )
            )

        x = on_gpu7("x", "Medium", admin=False)
        y = on_gpu7("y", "Medium", admin=True)
        z = on_gpu7("z", "Long", admin=True)
        gpu7 = gpu_uuid(node, "gpu-7")
        assert a.prepare([x])[x.uid].error == ""
        # B knows X only from disk, and refuses an interval that disagrees with it.
        error = b.prepare([z])[z.uid].error
        assert "already time-sliced with interval Medium" in error and x.uid in error
        assert gpu.settings()[gpu7]["timeslice"] == 2
        assert b.prepare([y])[y.uid].error == ""
        assert b.unprepare([y]) == {y.uid: ""}
        assert gpu.settings()[gpu7]["timeslice"] == 2  # X (held through A) still wants it
        assert b.unprepare([x]) == {x.uid: ""}  # the other instance may unprepare it too
        assert gpu.settings()[gpu7]["timeslice"] == 0
    finally:
        b.close()
