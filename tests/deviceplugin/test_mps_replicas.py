"""MpsReplicas without processes: which daemons it asks for and what one replica's container
gets (limits, pipe and shm mounts), down to the edge values."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from dra_driver import logs
from dra_driver.deviceplugin import inventory
from dra_driver.deviceplugin import mps as mps_replicas
from dra_driver.devices import fake
from dra_driver.driver.mps import daemons as mps

from .test_cdi import A100_MIG_MINORS


class RecordingDaemons(mps.MpsDaemons):
    """Real directory layout; ``recover`` only records what it was asked for."""

    def __init__(self, root: Path) -> None:
        super().__init__(
            root=root, command=(), gpu_control=None, boot_id="boot", log=logs.get("test")
        )
        self.wanted: Mapping[str, Sequence[mps.DaemonDevice]] = {}

    def recover(self, wanted: Mapping[str, Sequence[mps.DaemonDevice]]) -> list[str]:
        self.wanted = wanted
        return []


def _units(mig: inventory.MigStrategy) -> list[inventory.Unit]:
    devs = fake.FakeBackend.from_name("a100-mig").discover()
    resources = inventory.build(
        devs, resource_name="nvidia.com/gpu", mig_strategy=mig, mig_minors=A100_MIG_MINORS
    )
    return [d.unit for r in resources for d in r.devices]


def test_a_daemon_per_gpu_or_mig_device_with_its_kind(tmp_path: Path) -> None:
    daemons = RecordingDaemons(tmp_path)
    gpus = _units(inventory.MigStrategy.NONE)
    assert mps_replicas.MpsReplicas(daemons=daemons, units=gpus, replicas=2).start() == []
    assert {k: [d.kind for d in v] for k, v in daemons.wanted.items()} == {
        "gpu-0": ["gpu"],
        "gpu-1": ["gpu"],
    }
    migs = [u for u in _units(inventory.MigStrategy.MIXED) if u.mig is not None]
    mps_replicas.MpsReplicas(daemons=daemons, units=migs, replicas=2).start()
    assert {d.kind for v in daemons.wanted.values() for d in v} == {"mig"}
    assert {d.uuid for v in daemons.wanted.values() for d in v} == {u.uuid for u in migs}
    assert "gpu-0-mig-4" in daemons.wanted


def _edits(tmp_path: Path, unit: inventory.Unit, replicas: int) -> mps_replicas.Edits:
    replica = mps_replicas.MpsReplicas(
        daemons=RecordingDaemons(tmp_path), units=[unit], replicas=replicas
    )
    return replica.edits([inventory.PluginDevice(id=f"{unit.uuid}::0", unit=unit, replica=0)])


def test_one_replica_of_a_mig_device_gets_its_share_of_the_mig_memory(tmp_path: Path) -> None:
    mig = next(u for u in _units(inventory.MigStrategy.MIXED) if u.mig is not None)
    edits = _edits(tmp_path, mig, 2)
    assert edits.envs == {
        "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"{mig.uuid}={(mig.memory_bytes // 2) >> 20}M",
    }
    assert mig.mig is not None
    base = tmp_path / f"gpu-0-mig-{mig.mig.placement_start}"
    assert edits.mounts == (
        mps_replicas.Mount(container_path="/tmp/nvidia-mps", host_path=str(base / "pipe")),
        mps_replicas.Mount(container_path="/dev/shm", host_path=str(base / "shm")),
    )


@pytest.mark.parametrize(
    ("memory_bytes", "limit"), [(0, None), (1 << 20, "1M"), ((1 << 20) - 1, None)]
)
def test_the_memory_limit_is_whole_mib_and_left_out_below_one(
    tmp_path: Path, memory_bytes: int, limit: str | None
) -> None:
    gpu = _units(inventory.MigStrategy.NONE)[0]
    unit = dataclasses.replace(gpu, memory_bytes=memory_bytes)
    envs = _edits(tmp_path, unit, 1).envs
    assert envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"
    got = envs.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")
    assert got == (None if limit is None else f"{unit.uuid}={limit}")


def test_two_replicas_in_one_container_are_refused_with_the_reason(tmp_path: Path) -> None:
    gpu = _units(inventory.MigStrategy.NONE)[0]
    replicas = mps_replicas.MpsReplicas(daemons=RecordingDaemons(tmp_path), units=[gpu], replicas=2)
    devices = [inventory.PluginDevice(id=f"{gpu.uuid}::{n}", unit=gpu, replica=n) for n in (0, 1)]
    with pytest.raises(inventory.RequestError) as err:
        replicas.edits(devices)
    assert str(err.value) == (
        "devices_ids: with MPS replicas a container gets exactly one replica (asked for 2): "
        "its processes reach one GPU's MPS daemon; ask for a bigger share with fewer replicas "
        "per GPU instead"
    )
