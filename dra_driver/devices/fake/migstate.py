"""The MIG state of fake GPUs — mode, GPU and compute instances, processes — kept like a card's.

Why it exists: on a real GPU, MIG instances outlive the process that created them. Dynamic MIG
prepares claims by creating instances and recovers after a crash by destroying the ones nobody
owns, so the NVML stand-in must keep its MIG state where a restarted (or SIGKILLed) agent finds
it again: a JSON file (``state_file``), rewritten atomically under an ``flock`` for every change,
read afresh by every call. Without a file the state lives in memory (one process, tests).

The initial state comes from the fake profile: a GPU with a ``mig`` list is in MIG mode with
those instances, one with only ``migProfiles`` is MIG-capable with MIG mode off. Tests and the
demo make a GPU busy with :meth:`MigState.add_process` (the stand-in then answers
``nvmlDeviceGetComputeRunningProcesses`` with it and refuses mode changes, as a card does).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import fcntl
import json
import os
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Literal

from dra_driver import records
from dra_driver.devices import migtables, nvml
from dra_driver.devices.fake import profiles, strict

_GI_SLOT_BY_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}  # NVML_GPU_INSTANCE_PROFILE_*

# Plain dataclasses, not frozen (MigState.edit changes them in place), read strictly from the
# state file by dra_driver.devices.fake.strict.


@dataclasses.dataclass(slots=True, kw_only=True)
class ComputeInstance:
    id: int
    profileId: int
    slices: int
    uuid: str  # the MIG device's UUID (a new one each time an instance is created)


@dataclasses.dataclass(slots=True, kw_only=True)
class GpuInstance:
    id: int
    profileId: int
    slot: int
    name: str
    start: int
    size: int
    computeInstances: list[ComputeInstance] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(slots=True, kw_only=True)
class Process:
    pid: int
    usedGpuMemory: int = 0
    gpuInstanceId: int | None = None
    computeInstanceId: int | None = None


@dataclasses.dataclass(slots=True, kw_only=True)
class GpuMig:
    """One MIG-capable GPU: current and pending MIG mode (NVML values), its instances."""

    mode: int
    pending: int
    instances: list[GpuInstance] = dataclasses.field(default_factory=list)
    processes: list[Process] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(slots=True, kw_only=True)
class Document:
    """The state file (JSON): field names as NVML's, unknown fields refused."""

    version: Literal[1] = 1
    kind: Literal["FakeMigState"] = "FakeMigState"
    gpus: dict[str, GpuMig]  # by GPU UUID


class MigStateError(Exception):
    """The state file cannot be read or written (the message names it)."""


class MigState:
    """The MIG state of a fake node's GPUs, by GPU UUID; safe across threads and processes."""

    def __init__(self, initial: Mapping[str, GpuMig], *, state_file: Path | None = None) -> None:
        self._initial = {uuid: copy.deepcopy(gpu) for uuid, gpu in initial.items()}
        self._memory = {uuid: copy.deepcopy(gpu) for uuid, gpu in initial.items()}
        self.state_file = state_file
        self._lock = threading.RLock()

    def use_file(self, path: Path) -> None:
        """Keep the state in ``path`` from now on; written from the current state if absent
        (a card has a MIG layout from the start)."""
        with self._lock:
            current = self._load()
            self.state_file = path
            with self._file_lock(shared=False):
                if not path.exists():
                    self._store(current)

    def read(self) -> dict[str, GpuMig]:
        """A copy of the current state."""
        with self._lock, self._file_lock(shared=True):
            return self._load()

    @contextlib.contextmanager
    def edit(self) -> Iterator[dict[str, GpuMig]]:
        """The state to change in place; written back when the block ends without an error."""
        with self._lock, self._file_lock(shared=False):
            state = self._load()
            yield state
            self._store(state)

    def add_process(
        self, gpu_uuid: str, pid: int, *, gpu_instance: int | None = None, used_bytes: int = 0
    ) -> None:
        """Make a process run on a GPU (or on one of its GPU instances)."""
        with self.edit() as state:
            gpu = state[gpu_uuid]
            ci = 0 if gpu_instance is not None else None
            gpu.processes.append(
                Process(
                    pid=pid,
                    usedGpuMemory=used_bytes,
                    gpuInstanceId=gpu_instance,
                    computeInstanceId=ci,
                )
            )

    def end_process(self, gpu_uuid: str, pid: int) -> None:
        with self.edit() as state:
            gpu = state[gpu_uuid]
            gpu.processes = [p for p in gpu.processes if p.pid != pid]

    # ---- storage -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _file_lock(self, *, shared: bool) -> Iterator[None]:
        if self.state_file is None:
            yield
            return
        lock_path = self.state_file.with_name(f".{self.state_file.name}.lock")
        try:
            lock_path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise MigStateError(f"cannot open {lock_path}: {exc.strerror or exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _load(self) -> dict[str, GpuMig]:
        if self.state_file is None:
            return {uuid: copy.deepcopy(gpu) for uuid, gpu in self._memory.items()}
        try:
            raw = self.state_file.read_bytes()
        except FileNotFoundError:
            return {uuid: copy.deepcopy(gpu) for uuid, gpu in self._initial.items()}
        except OSError as exc:
            raise MigStateError(f"cannot read {self.state_file}: {exc.strerror or exc}") from exc
        try:
            return strict.decode(Document, json.loads(raw)).gpus
        except ValueError as exc:  # not JSON (or not UTF-8), or not the format
            raise MigStateError(f"fake MIG state {self.state_file} is unreadable: {exc}") from exc

    def _store(self, state: dict[str, GpuMig]) -> None:
        if self.state_file is None:
            self._memory = state
            return
        data = json.dumps(strict.encode(Document(gpus=state)), indent=1).encode()
        temporary = self.state_file.with_name(f".{self.state_file.name}.tmp")
        try:
            temporary.write_bytes(data)
            temporary.replace(self.state_file)
        except OSError as exc:
            raise MigStateError(f"cannot write {self.state_file}: {exc.strerror or exc}") from exc


# ---- the state a fake profile starts with -------------------------------------------------------


@records.record
class Initial:
    """Per GPU position: its profile table (None: not MIG-capable; empty: capable, profiles
    unknown) and whether the table was made up from listed instances; by GPU UUID: the MIG state
    it starts in."""

    tables: list[tuple[migtables.TableProfile, ...] | None]
    derived: list[bool]
    gpus: dict[str, GpuMig]


def initial(profile: profiles.Profile) -> Initial:
    """A GPU with a ``mig`` list is in MIG mode with those instances (GPU instance ids 1, 2, ...
    in placement order, one compute instance each); ``migProfiles`` alone means MIG mode off."""
    tables: list[tuple[migtables.TableProfile, ...] | None] = []
    derived_flags: list[bool] = []
    gpus: dict[str, GpuMig] = {}
    for pos, gpu in enumerate(profile.gpus):
        table_name = profile.resolved(pos, "mig_profiles")
        specs = sorted(gpu.mig or (), key=lambda m: m.placement_start)
        table = migtables.lookup(table_name) if table_name else None
        derived = table is None and gpu.mig is not None
        if derived:
            table = _derived_table(specs)
        elif table is None and profile.mig_capable(pos):
            table = ()  # MIG-capable, profiles unknown (``migCapable`` alone)
        tables.append(table)
        derived_flags.append(derived)
        if table is None:
            continue
        rows = {r.name: r for r in table}
        instances = []
        for gi_id, spec in enumerate(specs, start=1):
            row = rows[spec.profile]
            ci = ComputeInstance(
                id=0,
                profileId=nvml.CI_PROFILE_BY_SLICES.get(row.slices, 0),
                slices=row.slices,
                uuid=profile.mig_uuid(pos, spec),
            )
            instances.append(
                GpuInstance(
                    id=gi_id, profileId=row.id, slot=row.slot, name=row.name,
                    start=spec.placement_start, size=spec.placement_size, computeInstances=[ci],
                )
            )  # fmt: skip
        mode = nvml.NVML_DEVICE_MIG_ENABLE if gpu.mig is not None else nvml.NVML_DEVICE_MIG_DISABLE
        gpus[profile.gpu_uuid(pos)] = GpuMig(mode=mode, pending=mode, instances=instances)
    return Initial(tables=tables, derived=derived_flags, gpus=gpus)


def _derived_table(specs: list[profiles.MigSpec]) -> tuple[migtables.TableProfile, ...]:
    """A profile table made up from the listed instances (profiles without ``migProfiles``)."""
    rows: list[migtables.TableProfile] = []
    for name in sorted({m.profile for m in specs}):
        taken = {r.slot for r in rows}
        slices = int(name.split("g.", 1)[0])
        slot = _GI_SLOT_BY_SLICES.get(slices, -1)
        if "+" in name or slot in taken or slot < 0:
            slot = min(
                s
                for s in range(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT)
                if s not in taken and s not in _GI_SLOT_BY_SLICES.values()
            )
        same = [m for m in specs if m.profile == name]
        m = same[0]
        rows.append(
            migtables.TableProfile(
                slot, 100 + slot, name, slices, len(same), m.memory >> 20, m.multiprocessors,
                m.copy_engines, m.decoders, m.encoders, m.jpeg_engines, m.ofa_engines,
                tuple(s.placement_start for s in same), m.placement_size,
            )
        )  # fmt: skip
    return tuple(rows)
