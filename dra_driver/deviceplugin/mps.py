"""MPS replicas in device-plugin mode: N replicas of each GPU, each 1/N of it, enforced by MPS.

Why it exists: like NVIDIA's device plugin, ``--replicas N --sharing-strategy mps`` lists every
GPU (or MIG device) N times, and a container given one replica may use 1/N of its memory
(``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``, whole MiB) and 100/N percent of its SMs
(``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``). One MPS control daemon per device runs for as long as the
plugin serves MPS replicas; the daemons, their records and the GPUs' compute mode are managed by
the same code as in DRA mode (:class:`dra_driver.driver.mps.daemons.MpsDaemons`): a restarted plugin
adopts them, a plugin started without MPS stops any it finds.

A container gets exactly one replica: its process connects to one daemon (one pipe directory),
so replicas of two GPUs cannot be combined, and two replicas of one GPU would only be a larger
share that the scheduler cannot see (NVIDIA's plugin refuses such requests too).
"""

from __future__ import annotations

from collections.abc import Sequence

from dra_driver import records
from dra_driver.deviceplugin import inventory
from dra_driver.driver.mps import daemons as mps
from dra_driver.driver.mps import mpsclaims


@records.record
class Mount:
    container_path: str
    host_path: str


@records.record
class Edits:
    envs: dict[str, str]
    mounts: tuple[Mount, ...]


def daemon_id(unit: inventory.Unit) -> str:
    """A device's daemon: by GPU minor, and MIG placement for a MIG device."""
    if unit.mig is None:
        return f"gpu-{unit.minor}"
    return f"gpu-{unit.minor}-mig-{unit.mig.placement_start}"


class MpsReplicas:
    """The daemons of every device the plugin lists, and what a replica's container gets."""

    def __init__(
        self, *, daemons: mps.MpsDaemons, units: Sequence[inventory.Unit], replicas: int
    ) -> None:
        self.daemons = daemons
        self.units = {u.uuid: u for u in units if not u.problem}
        self.replicas = replicas

    def start(self) -> list[str]:
        """Adopt or start a daemon per device, stop any other; returns the problems."""
        wanted = {
            daemon_id(u): [
                mps.DaemonDevice(
                    name=daemon_id(u), uuid=u.uuid, kind="mig" if u.mig is not None else "gpu"
                )
            ]
            for u in self.units.values()
        }
        return self.daemons.recover(wanted)

    def edits(self, devices: Sequence[inventory.PluginDevice]) -> Edits:
        """The env and mounts for one container; :class:`inventory.RequestError` unless it got
        exactly one replica."""
        if len(devices) != 1:
            raise inventory.RequestError(
                f"devices_ids: with MPS replicas a container gets exactly one replica (asked for "
                f"{len(devices)}): its processes reach one GPU's MPS daemon; ask for a bigger "
                "share with fewer replicas per GPU instead"
            )
        unit = devices[0].unit
        memory_mib = unit.memory_bytes // self.replicas >> 20
        dirs = self.daemons.dirs(daemon_id(unit))
        envs = {
            "CUDA_MPS_PIPE_DIRECTORY": mpsclaims.CONTAINER_PIPE,
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(100 // self.replicas),
        }
        if memory_mib > 0:
            envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"{unit.uuid}={memory_mib}M"
        mounts = (
            Mount(container_path=mpsclaims.CONTAINER_PIPE, host_path=str(dirs.pipe)),
            Mount(container_path=mpsclaims.CONTAINER_SHM, host_path=str(dirs.shm)),
        )
        return Edits(envs=envs, mounts=mounts)
