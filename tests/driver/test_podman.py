"""A real container runtime consumes our CDI spec: podman + runc run busybox with ``--device``
set to the CDI IDs the plugin returned, and the container sees the env, device nodes and driver
mounts the spec promises.

Set-up that works as root in a CI container without systemd or networking:
runtime runc, cgroup manager cgroupfs, storage driver vfs (no overlay-on-overlay), file events,
``--network=none``, low ``nofile``/``nproc`` ulimits (podman's default nofile exceeds the hard
limit such sandboxes give), private ``--root``/``--runroot`` in a temp dir, and a busybox rootfs
made from the static busybox binary with ``podman import``. Podman 4.x reads CDI specs only from
/etc/cdi and /var/run/cdi, so it runs in a private mount namespace (``unshare -m``) in which our
temp CDI directory is bind-mounted over /var/run/cdi; the host's directory is not touched.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import Node, claim_obj, gpu_config, new_uid, opaque, ref_of

PODMAN = shutil.which("podman")
# Outside CI a missing podman skips with the reason; in CI (CI=true) it is a failure, so the
# container test can never silently stop running there.
pytestmark = pytest.mark.skipif(
    PODMAN is None and os.environ.get("CI") != "true",
    reason="podman is not installed (`make system-deps` installs podman, runc, busybox-static)",
)
IMAGE = "localhost/dra-busybox:test"


@pytest.fixture(scope="module")
def podman() -> Iterator[list[str]]:
    """The podman command line with isolated storage, and the busybox image imported."""
    base = Path(tempfile.mkdtemp(prefix="dra-pm-", dir="/tmp"))
    cmd = [
        str(PODMAN),
        "--root",
        str(base / "root"),
        "--runroot",
        str(base / "run"),
        "--storage-driver",
        "vfs",
        "--cgroup-manager",
        "cgroupfs",
        "--runtime",
        "runc",
        "--events-backend",
        "file",
    ]
    busybox = shutil.which("busybox")
    assert busybox, "busybox-static is needed to build the test image"
    tar_path = base / "rootfs.tar"
    with tarfile.open(tar_path, "w") as tar:
        tar.add(busybox, arcname="bin/busybox")
        for applet in ("sh", "env", "ls", "cat", "grep", "stat"):
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
    subprocess.run(
        [*cmd, "import", str(tar_path), IMAGE], check=True, capture_output=True, timeout=120
    )
    yield cmd
    subprocess.run([*cmd, "rm", "--all", "--force"], capture_output=True, timeout=60)
    subprocess.run([*cmd, "rmi", "--all", "--force"], capture_output=True, timeout=60)
    shutil.rmtree(base, ignore_errors=True)


def run_with_cdi(podman: list[str], cdi_dir: Path, devices: list[str], script: str) -> str:
    run = [
        *podman,
        "run",
        "--rm",
        "--network=none",
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=512:512",
    ]
    for dev in devices:
        run += ["--device", dev]
    run += [IMAGE, "/bin/sh", "-c", script]
    inner = (
        f"mkdir -p /var/run/cdi && mount --bind {shlex.quote(str(cdi_dir))} /var/run/cdi "
        f"&& exec {shlex.join(run)}"
    )
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", inner], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"podman failed ({done.returncode}):\n{done.stderr}"
    return done.stdout


def test_container_gets_env_device_nodes_and_driver_mounts(podman: list[str], node: Node) -> None:
    ref = node.add(
        claim_obj(
            name="pm",
            uid=new_uid(),
            devices=["gpu-0", "gpu-1"],
            config=[opaque(gpu_config(env={"MY_SETTING": "from-config"}))],
        )
    )
    result = node.driver.prepare([ref])[ref.uid]
    assert result.error == ""
    ids = [cdi_id for d in result.devices for cdi_id in d.cdi_device_ids]
    uuids = [node.driver.state.devices.devices[n].uuid for n in ("gpu-0", "gpu-1")]
    out = run_with_cdi(
        podman,
        node.cdi_root,
        ids,
        (
            "env | sort; echo ---; "
            "for d in /dev/nvidia*; do stat -c '%n %F %t:%T' $d; done; echo ---; "
            "cat /usr/lib/x86_64-linux-gnu/libcuda.so.1; echo; "
            "grep -E 'libcuda|nvidia-smi' /proc/mounts"
        ),
    )
    env_part, dev_part, mount_part = out.split("---\n")
    env = dict(line.split("=", 1) for line in env_part.splitlines() if "=" in line)
    assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(uuids)
    assert env["MY_SETTING"] == "from-config"
    assert env["NVIDIA_DRA_CLAIM"] == "default/pm"
    nodes = {line.split()[0]: line.split(" ", 1)[1] for line in dev_part.splitlines()}
    assert set(nodes) == {
        "/dev/nvidia0",
        "/dev/nvidia1",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    }  # not /dev/nvidia2..7
    assert all(v == "character special file 1:3" for v in nodes.values())  # /dev/null behind
    assert mount_part.splitlines()[0] == "cuda"
    mounts = [line.split() for line in mount_part.splitlines()[1:]]
    by_target = {m[1]: m[3].split(",") for m in mounts}
    for target in ("/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/bin/nvidia-smi"):
        assert "ro" in by_target[target], by_target

    # Only the devices asked for: one CDI device of the claim gives one GPU node.
    out = run_with_cdi(podman, node.cdi_root, ids[1:], "ls /dev/ | grep '^nvidia[0-9]'")
    assert out.split() == ["nvidia1"]

    # The claim's metadata files (docs/metadata.md), read-only: ours and KEP-5304's.
    ours = f"/var/run/nvidia-dra/claims/{ref.uid}.json"
    kep = "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/pm/gpu"
    out = run_with_cdi(
        podman,
        node.cdi_root,
        ids,
        f"cat {ours}; echo ---; cat {kep}/gpu.nvidia.com-metadata.json; echo ---; "
        f"grep -E '{ours}|{kep}' /proc/mounts; echo ---; echo x > {ours} || echo read-only",
    )
    claim_part, kep_part, mount_part, write_part = out.split("---\n")
    claim = json.loads(claim_part)
    assert claim["claim"] == {"namespace": "default", "name": "pm", "uid": ref.uid}
    assert [g["uuid"] for d in claim["devices"] for g in d["gpus"]] == uuids
    assert claim["nvlinks"] == [{"minors": [0, 1], "uuids": uuids, "links": 18}]
    kep_devices = json.loads(kep_part)["requests"][0]["devices"]
    assert [d["attributes"]["uuid"]["string"] for d in kep_devices] == uuids
    mounts = [line.split() for line in mount_part.splitlines()]
    assert len(mounts) == 2 and all("ro" in m[3].split(",") for m in mounts), mounts
    assert write_part.strip().endswith("read-only")
    assert node.driver.unprepare([ref]) == {ref.uid: ""}


def test_container_of_a_gpu_share_gets_the_mps_env_and_pipe_mount(
    podman: list[str], node: Node
) -> None:
    from . import sharekit

    ref = node.add(
        sharekit.share_claim("share", sharekit.share("gpu-2", memory="20Gi", compute="25"))
    )
    result = node.driver.prepare([ref])[ref.uid]
    assert result.error == ""
    (device,) = result.devices
    assert device.share_id is not None
    gpu2 = node.driver.state.devices.devices["gpu-2"].uuid
    out = run_with_cdi(
        podman,
        node.cdi_root,
        list(device.cdi_device_ids),
        (
            "env | grep -E '^(CUDA_MPS|NVIDIA_VISIBLE)' | sort; echo ---; "
            "ls $CUDA_MPS_PIPE_DIRECTORY; echo ---; "
            "grep -E ' /tmp/nvidia-mps | /dev/shm ' /proc/mounts | cut -d' ' -f2"
        ),
    )
    env_part, pipe_part, mount_part = out.split("---\n")
    env = dict(line.split("=", 1) for line in env_part.splitlines())
    assert env == {
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"{gpu2}=20480M",
        "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps",
        "NVIDIA_VISIBLE_DEVICES": gpu2,
    }
    assert pipe_part.split() == ["control"]  # the stand-in daemon's socket, seen from inside
    assert sorted(mount_part.split()) == ["/dev/shm", "/tmp/nvidia-mps"]
    assert node.driver.unprepare([ref]) == {ref.uid: ""}
    assert sharekit.daemon_records(node) == {}


def test_container_of_a_vm_claim_sees_exactly_its_vfio_nodes(
    podman: list[str], tmp_path: Path
) -> None:
    """A passthrough claim on the fake kernel (docs/passthrough.md): the container sees its GPU's
    /dev/vfio/<group> and /dev/vfio/vfio, no other group's node, no /dev/nvidia*, and the VM env."""
    from dra_driver import app, logs
    from dra_driver.devices import fake, passthrough
    from dra_driver.testing import fakesysfs
    from dra_driver.testing.fakeapi import memory

    from .conftest import DRIVER, NODE

    devices = passthrough.mark(
        fake.FakeBackend.from_name("dgx-h100").discover(), passthrough.Passthrough.parse("all")
    )
    (tmp_path / "boot_id").write_text("boot-1\n")
    settings = app.PluginSettings(
        node_name=NODE, driver_name=DRIVER, registry_dir=tmp_path / "registry",
        plugins_dir=tmp_path / "plugins", cdi_root=tmp_path / "cdi", driver_root=tmp_path / "x",
        fake=True, boot_id_file=tmp_path / "boot_id", cleanup_interval_s=0, publish=False,
        passthrough="all", vfio_root=tmp_path / "host",
    )  # fmt: skip
    api = memory.InMemoryApi(use_default_cel=False)
    with fakesysfs.running(tmp_path / "host", fakesysfs.groups_of(devices)):
        driver = app.build_driver(settings, devices=devices, api=api, log=logs.get("test"))
        try:
            obj = claim_obj(name="vm", uid=new_uid(), devices=["gpu-vfio-3"])
            api.put_resource_claim(obj)
            ref = ref_of(obj)
            result = driver.prepare([ref])[ref.uid]
            assert result.error == ""
            ids = [i for d in result.devices for i in d.cdi_device_ids]
            out = run_with_cdi(
                podman,
                settings.cdi_root,
                ids,
                "ls -1 /dev/vfio; echo ---; ls /dev | grep nvidia; "
                "echo ---; env | grep ^NVIDIA_VISIBLE",
            )
            vfio_part, nvidia_part, env_part = out.split("---\n")
            group = devices.gpus[3].iommu_group
            assert sorted(vfio_part.split()) == sorted([str(group), "vfio"])
            assert nvidia_part.strip() == ""
            assert env_part.strip() == "NVIDIA_VISIBLE_DEVICES=void"
            assert driver.unprepare([ref]) == {ref.uid: ""}
        finally:
            driver.close()
