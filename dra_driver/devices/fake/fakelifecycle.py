"""The driver-lifecycle half of the NVML stand-in: the driver unloaded and loaded again, GPUs
removed from and added to the bus, at run time, the way NVML shows it.

Why it exists: a node agent must survive a driver upgrade (the kernel module unloaded and a new
one loaded) and follow GPUs that fall off the bus or are hot-added (docs/lifecycle.md). Those
paths run the same code on a laptop as on a GPU node only if the fake NVML fails the way the real
library does, with pynvml's own exception classes:

* :meth:`FakeDriverLifecycle.unload` — every NVML call of a process that had initialised NVML
  raises the outage's error (``DriverNotLoaded``, ``Uninitialized``, ``LibRmVersionMismatch``
  or ``GpuIsLost``, by ``mode``), waiting event sets wake with it, and ``nvmlInit`` fails
  (``DriverNotLoaded``; ``LibRmVersionMismatch`` in the mismatch mode) until :meth:`load`.
* :meth:`FakeDriverLifecycle.load` — the driver is back, with a new version when given. Earlier
  initialisations are gone (calls raise ``Uninitialized`` until the process calls ``nvmlInit``
  again) and so are event sets made before the unload (``InvalidArgument``).
* ``unload(rmmod=True)`` — a real upgrade's ``rmmod nvidia``: refused, as the kernel refuses it
  ("Module nvidia is in use"), while the process holds any NVML initialisation
  (:attr:`FakeDriverLifecycle.open_inits`; :attr:`init_calls` counts every ``nvmlInit`` tried).
  The agent must release NVML first (:mod:`dra_driver.driverrelease`).
* The kernel module's version file: with :meth:`FakeDriverLifecycle.use_proc_dir` the stand-in
  keeps ``<dir>/version`` as ``/proc/driver/nvidia/version`` is kept: there while the driver is
  loaded (with its version), gone while it is unloaded, rewritten by a load.
* :meth:`FakeDriverLifecycle.remove_gpu` / :meth:`FakeDriverLifecycle.add_gpu` — the profile
  changes under the running process: NVML indices are renumbered as NVML does, UUIDs, PCI
  addresses and minor numbers of the other GPUs stay.

:class:`FakeDriverLifecycle` is mixed into :class:`~dra_driver.devices.fake.fakenvml.FakeNvml`,
whose ``_enter`` and ``nvmlInit`` ask :meth:`FakeDriverLifecycle._driver_check` first.
"""

from __future__ import annotations

import dataclasses
import threading
import uuid as uuidlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dra_driver.devices import nvml
from dra_driver.devices.fake import profiles

# mode → (what a call raises, what nvmlInit raises) while the driver is away
OUTAGE_MODES: dict[str, tuple[type[Exception], type[Exception]]] = {
    "not-loaded": (nvml.NVMLError_DriverNotLoaded, nvml.NVMLError_DriverNotLoaded),
    "uninitialized": (nvml.NVMLError_Uninitialized, nvml.NVMLError_DriverNotLoaded),
    "mismatch": (nvml.NVMLError_LibRmVersionMismatch, nvml.NVMLError_LibRmVersionMismatch),
    "gpu-lost": (nvml.NVMLError_GpuIsLost, nvml.NVMLError_DriverNotLoaded),
}


class LifecycleError(ValueError):
    """A lifecycle change the fake node cannot make (the message says why)."""


class FakeDriverLifecycle:
    """Mixin: the driver and the GPUs of the stand-in change at run time."""

    # Provided by FakeNvml / FakeHealth.
    profile: profiles.Profile
    _inits: int
    _pos: dict[int, int]
    _bus: list[str]
    _links: list[list[tuple[int, str]] | None]
    _brand: list[int]
    _arch: list[int]
    _faults: list[Any]
    _sets: dict[int, Any]
    _events: threading.Condition

    def _init_lifecycle(self) -> None:
        self._outage: str | None = None
        self.driver_loads = 0  # loads after an unload (tests)
        self.init_calls = 0  # every nvmlInit tried (FakeNvml.nvmlInit counts)
        self.proc_dir: Path | None = None
        self._added = 0

    @property
    def driver_loaded(self) -> bool:
        return self._outage is None

    @property
    def open_inits(self) -> int:
        """NVML initialisations the process holds now (each keeps the device files open)."""
        return max(0, self._inits)

    def use_proc_dir(self, path: Path) -> None:
        """Keep the driver's version file in ``path`` (a fake ``/proc/driver/nvidia``)."""
        self.proc_dir = path
        self._write_version()

    def _write_version(self) -> None:
        if self.proc_dir is None:
            return
        version = self.proc_dir / "version"
        if self._outage is not None:
            version.unlink(missing_ok=True)
            return
        self.proc_dir.mkdir(parents=True, exist_ok=True)
        text = f"NVRM version: NVIDIA UNIX Kernel Module  {self.profile.driver_version}  (fake)\n"
        version.write_text(text)

    def _driver_check(self, *, init: bool = False) -> None:
        """Raise what NVML raises while the driver is away (``init``: from ``nvmlInit``)."""
        mode = self._outage
        if mode is not None:
            raise OUTAGE_MODES[mode][1 if init else 0]()

    # --- the driver -----------------------------------------------------------------------------
    def unload(self, mode: str = "not-loaded", *, rmmod: bool = False) -> None:
        """The kernel driver goes away (``mode``: one of :data:`OUTAGE_MODES`); ``rmmod``: as
        a real unload, refused while any NVML initialisation is open."""
        if mode not in OUTAGE_MODES:
            raise LifecycleError(f"unknown outage mode {mode!r}: one of {', '.join(OUTAGE_MODES)}")
        if rmmod and self.open_inits:
            raise LifecycleError(
                f"rmmod: ERROR: Module nvidia is in use ({self.open_inits} NVML "
                "initialisation(s) open in the node agent: release NVML first)"
            )
        with self._events:
            self._outage = mode
            self._inits = 0
            error = OUTAGE_MODES[mode][0]
            for event_set in self._sets.values():
                if event_set.registered:
                    event_set.queue.append(error)
            self._events.notify_all()
        self._write_version()

    def load(self, driver_version: str | None = None, cuda_version: str | None = None) -> None:
        """The driver is loaded again (``driver_version``: a new one, e.g. after an upgrade)."""
        changes: dict[str, Any] = {}
        if driver_version is not None:
            changes["driver_version"] = driver_version
        if cuda_version is not None:
            changes["cuda_driver_version"] = cuda_version
        profile = dataclasses.replace(self.profile, **changes) if changes else self.profile
        with self._events:
            was_away = self._outage is not None
            self._outage = None
            if was_away:
                self._inits = 0
                for event_set in self._sets.values():  # made before the unload: invalid
                    event_set.freed = True
                    event_set.registered.clear()
                self.driver_loads += 1
            self.profile = profile
            self._events.notify_all()
        self._write_version()

    # --- GPUs on the bus ------------------------------------------------------------------------
    def remove_gpu(self, index: int) -> str:
        """GPU ``index`` is gone from the bus (and from NVML); returns its UUID. The other GPUs
        keep UUID, PCI address and minor number; NVML renumbers their indices."""
        if index not in self._pos:
            raise LifecycleError(f"no GPU with index {index} on this fake node")
        if len(self.profile.gpus) == 1:
            raise LifecycleError("cannot remove the last GPU of a fake node")
        gone = self._pos[index]
        uuid = self.profile.gpu_uuid(gone)
        keep = [p for p in range(len(self.profile.gpus)) if p != gone]
        self._reprofile(keep, extra=None)
        return uuid

    def add_gpu(
        self,
        *,
        like: int | None = None,
        uuid: str | None = None,
        pci_bus_id: str | None = None,
    ) -> tuple[int, str]:
        """A GPU is hot-added: a copy of GPU ``like`` (default: the last one) with a new UUID,
        PCI address and minor number, MIG mode off. Returns its NVML index and UUID."""
        template_index = like if like is not None else max(self._pos)
        if template_index not in self._pos:
            raise LifecycleError(f"no GPU with index {template_index} to copy")
        template = self.profile.gpus[self._pos[template_index]]
        used_bus = {nvml.sysfs_bus_id(g.pci_bus_id) for g in self.profile.gpus}
        bus = pci_bus_id or _free_bus_id(used_bus)
        if nvml.sysfs_bus_id(bus) in used_bus:
            raise LifecycleError(f"PCI address {bus} is taken by another GPU")
        self._added += 1
        new_uuid = uuid or "GPU-" + str(
            uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"dra-driver/{self.profile.name}/hot/{bus}")
        )
        if any(self.profile.gpu_uuid(p) == new_uuid for p in range(len(self.profile.gpus))):
            raise LifecycleError(f"UUID {new_uuid} is taken by another GPU")
        minors = [self._minor(p) for p in range(len(self.profile.gpus))]
        spec = dataclasses.replace(
            template,
            index=None,
            minor=max(minors) + 1,
            uuid=new_uuid,
            pci_bus_id=bus,
            mig=None,
            pcie_switch=None,
        )
        self._reprofile(list(range(len(self.profile.gpus))), extra=spec)
        index = max(self._pos)
        return index, new_uuid

    def destroy_mig(self, index: int, gpu_instance: int) -> list[str]:
        """An admin destroys GPU instance ``gpu_instance`` of GPU ``index`` behind the driver's
        back (``nvidia-smi mig -dgi``); returns the UUIDs of the MIG devices that went."""
        if index not in self._pos:
            raise LifecycleError(f"no GPU with index {index} on this fake node")
        uuid = self.profile.gpu_uuid(self._pos[index])
        with self.mig_state.edit() as state:
            gpu = state.get(uuid)
            found = [i for i in (gpu.instances if gpu is not None else ()) if i.id == gpu_instance]
            if gpu is None or not found:
                raise LifecycleError(f"GPU {index} has no GPU instance {gpu_instance}")
            gpu.instances.remove(found[0])
        return [c.uuid for c in found[0].computeInstances]

    def _minor(self, pos: int) -> int:
        minor = self.profile.gpus[pos].minor
        return self.profile.gpu_index(pos) if minor is None else minor

    def _reprofile(self, keep: list[int], extra: profiles.GpuSpec | None) -> None:
        """Swap in a profile of the GPUs at positions ``keep`` (in NVML index order) plus
        ``extra`` (last), each pinned to its UUID and minor so nothing but the index changes."""
        old = self.profile
        keep = sorted(keep, key=old.gpu_index)
        pinned = [
            dataclasses.replace(
                old.gpus[p],
                uuid=old.gpu_uuid(p),
                minor=self._minor(p),
                mig=_pinned_migs(old, p),
            )
            for p in keep
        ]
        if extra is not None:
            pinned.append(extra)
        gpus = [dataclasses.replace(g, index=i) for i, g in enumerate(pinned)]
        profile = dataclasses.replace(old, gpus=gpus, nvlink=_nvlink(old, keep, extra))
        fresh = type(self)(profile)  # type: ignore[call-arg]
        faults = {old.gpu_uuid(p): self._faults[p] for p in keep}
        with self._events:
            moved = {old.gpu_uuid(p): p for p in keep}
            new_pos = {profile.gpu_uuid(p): p for p in range(len(gpus))}
            for event_set in self._sets.values():
                event_set.registered = {
                    new_pos[old.gpu_uuid(p)]: mask
                    for p, mask in event_set.registered.items()
                    if old.gpu_uuid(p) in moved
                }
            self._faults = [
                faults.get(profile.gpu_uuid(p)) or fresh._faults[p] for p in range(len(gpus))
            ]
            for name in ("_pos", "_bus", "_links", "_brand", "_arch"):
                setattr(self, name, getattr(fresh, name))
            self._adopt_mig(fresh)
            self.profile = profile

    def _adopt_mig(self, fresh: Any) -> None:
        """MIG tables of the new positions; MIG state of a new GPU added to the live state."""
        self._mig_tables, self._mig_derived = fresh._mig_tables, fresh._mig_derived
        added = fresh.mig_state.read()
        with self.mig_state.edit() as state:
            for uuid, gpu in added.items():
                state.setdefault(uuid, gpu)

    if TYPE_CHECKING:  # provided by FakeNvml (fakemig)
        _mig_tables: list[Any]
        _mig_derived: list[Any]
        mig_state: Any


def _pinned_migs(profile: profiles.Profile, pos: int) -> list[profiles.MigSpec] | None:
    migs = profile.gpus[pos].mig
    if migs is None:
        return None
    return [dataclasses.replace(m, uuid=profile.mig_uuid(pos, m)) for m in migs]


def _free_bus_id(used: set[str]) -> str:
    for bus in range(0xC0, 0x100):
        candidate = f"0000:{bus:02x}:00.0"
        if candidate not in used:
            return candidate
    raise LifecycleError("no free PCI bus address for another fake GPU")


def _nvlink(
    old: profiles.Profile, keep: list[int], extra: profiles.GpuSpec | None
) -> profiles.Nvlink | None:
    """The NVLink wiring of the kept GPUs (in ``keep`` order, then ``extra``, which has no
    direct links); GPUs behind NVSwitches: the wiring stays as it is."""
    link = old.nvlink
    if link is None or link.switched is not None:
        return link
    order: list[int | None] = [*keep, *([None] if extra is not None else [])]
    n = len(order)
    matrix = [[0] * n for _ in range(n)]
    for a, pa in enumerate(order):
        for b, pb in enumerate(order):
            if a != b and pa is not None and pb is not None:
                matrix[a][b] = old.links(pa, pb)
    return profiles.Nvlink(matrix=matrix) if any(any(r) for r in matrix) else None
