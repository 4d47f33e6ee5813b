"""Driver files found under the driver root, or under the mount where the plugin sees it, and
always named by their host path in the CDI spec."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from dra_driver.driver import driverfiles

from .conftest import Node, claim_obj, make_driver_root, new_uid


def by_container_path(mounts: tuple[driverfiles.Mount, ...]) -> dict[str, driverfiles.Mount]:
    return {m.container_path: m for m in mounts}


def test_same_path_in_and_out_of_the_container(tmp_path: Path) -> None:
    root = make_driver_root(tmp_path / "root")
    found = by_container_path(driverfiles.discover(root))
    lib = "/usr/lib/x86_64-linux-gnu"
    assert found[f"{lib}/libcuda.so.1"].host_path == str(root / lib[1:] / "libcuda.so.580.95.05")
    assert found[f"{lib}/libcuda.so.1"].local_path == found[f"{lib}/libcuda.so.1"].host_path
    # an absolute link resolves inside the root, not on this machine's /
    assert found[f"{lib}/libnvidia-ml.so.1"].host_path == str(
        root / lib[1:] / "libnvidia-ml.so.580.95.05"
    )
    assert f"{lib}/libnvidia-broken.so.1" not in found and f"{lib}/libz.so.1" not in found
    assert found["/usr/bin/nvidia-smi"].host_path == str(root / "usr/bin/nvidia-smi")


def test_a_host_root_of_slash_seen_at_a_mount(tmp_path: Path) -> None:
    mount = make_driver_root(tmp_path / "driver-root")
    found = by_container_path(driverfiles.discover(Path("/"), mount=mount))
    lib = "/usr/lib/x86_64-linux-gnu"
    cuda = found[f"{lib}/libcuda.so.1"]
    assert cuda.host_path == f"{lib}/libcuda.so.580.95.05"  # what the runtime opens on the host
    assert cuda.local_path == str(mount / lib[1:] / "libcuda.so.580.95.05")  # what we can read
    assert found[f"{lib}/libnvidia-ml.so.1"].host_path == f"{lib}/libnvidia-ml.so.580.95.05"
    assert found["/usr/bin/nvidia-smi"].host_path == "/usr/bin/nvidia-smi"
    assert all(not m.host_path.startswith(str(tmp_path)) for m in found.values())


def test_a_driver_container_root_seen_at_a_mount(tmp_path: Path) -> None:
    mount = make_driver_root(tmp_path / "seen-here")
    found = by_container_path(driverfiles.discover(Path("/run/nvidia/driver"), mount=mount))
    assert found["/usr/bin/nvidia-smi"].host_path == "/run/nvidia/driver/usr/bin/nvidia-smi"


def test_dotdot_links_stay_inside_the_root(tmp_path: Path) -> None:
    mount = tmp_path / "m"
    lib = mount / "usr/lib64"
    lib.mkdir(parents=True)
    (mount / "etc").mkdir()
    (mount / "etc/libcuda.so.9").write_text("inside")
    (lib / "libcuda.so.1").symlink_to("../../../../../etc/libcuda.so.9")
    (tmp_path / "outside.so").write_text("outside")
    (lib / "libcuda.so.2").symlink_to("../../../outside.so")
    found = by_container_path(driverfiles.discover(Path("/host"), mount=mount))
    assert found["/usr/lib64/libcuda.so.1"].host_path == "/host/etc/libcuda.so.9"
    assert "/usr/lib64/libcuda.so.2" not in found  # would be root/outside.so: not there


def test_nothing_under_an_empty_mount(tmp_path: Path) -> None:
    assert driverfiles.discover(Path("/"), mount=tmp_path) == ()


def test_the_agent_writes_host_paths_into_claim_specs(
    node_factory: Callable[..., Node], tmp_path: Path
) -> None:
    """DRIVER_ROOT=/ seen at DRIVER_ROOT_MOUNT: the spec mounts /usr/lib/..., not the mount."""
    mount = make_driver_root(tmp_path / "driver-root-mount")
    n = node_factory(driver_root=Path("/"), driver_root_mount=mount)
    ref = n.add(claim_obj(name="c", uid=new_uid(), devices=["gpu-0"]))
    assert n.driver.prepare([ref])[ref.uid].error == ""
    (spec_file,) = n.cdi_root.glob(f"*{ref.uid}.json")
    spec = json.loads(spec_file.read_text())
    mounts = {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}
    lib = "/usr/lib/x86_64-linux-gnu"
    assert mounts[f"{lib}/libcuda.so.1"] == f"{lib}/libcuda.so.580.95.05"
    assert mounts["/usr/bin/nvidia-smi"] == "/usr/bin/nvidia-smi"
