"""A fake sysfs and /dev for VFIO passthrough: real files and symlinks under a temp root, and a
small "kernel" thread that moves a device's driver link when ``bind``/``unbind`` are written.

Why it exists: the agent's VFIO code (:mod:`dra_driver.devices.vfiohost`) only ever reads
links and writes attribute files under ``<root>/sys`` and looks for nodes under ``<root>/dev``,
so tests (and the real agent run as a subprocess) can drive it over this tree exactly as over
the kernel's. Layout, as the kernel has it::

    sys/bus/pci/devices/<bdf>/driver -> ../../drivers/<name>      (absent: unbound)
    sys/bus/pci/devices/<bdf>/driver_override                      (regular file, "\\n" = none)
    sys/bus/pci/devices/<bdf>/iommu_group -> sys/kernel/iommu_groups/<n>
    sys/kernel/iommu_groups/<n>/devices/<bdf> -> sys/bus/pci/devices/<bdf>
    sys/bus/pci/drivers/{nvidia,vfio-pci}/{bind,unbind}            (FIFOs the kernel reads)
    sys/bus/pci/devices/<bdf>/vfio-dev/vfio<N>                     (IOMMUFD, while on vfio-pci)
    dev/vfio/vfio, dev/vfio/<group>, dev/iommu, dev/vfio/devices/vfio<N>   (stand-in files)

``bind``/``unbind`` are FIFOs the kernel thread keeps open for reading, so a write never blocks
and the writer (any process) returns at once; the effect follows within milliseconds, and the
agent checks the driver link afterwards, as it must on a real kernel too. Failures the kernel
has: an unbind of a GPU in use does not happen (:meth:`FakeKernel.hold`: nvidia's ``remove``
would wait for its users — the agent sees the driver link stay and reports EBUSY), a bind
whose device node never appears (:meth:`FakeKernel.no_node`), a bind to a driver other than
``driver_override`` names is refused, and a bind of a device that has a driver is ignored.

This is the test kit, not product code: nothing in the driver imports it.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

DRIVERS = ("nvidia", "vfio-pci")


class FakeKernel:
    """The tree under ``root`` and the thread acting on binds and unbinds."""

    def __init__(self, root: Path, groups: Mapping[str, int], *, iommufd: bool = False) -> None:
        """``groups``: BDF → IOMMU group of every device (all start bound to nvidia, except
        non-GPU devices, named with a function other than ``.0``, which start unbound)."""
        self.root = root
        self.groups = dict(groups)
        self.iommufd = iommufd
        self.held: dict[str, list[int]] = {}  # BDF → PIDs keeping nvidia's unbind from finishing
        self.missing_node: set[str] = set()
        self.events: list[str] = []
        # Called as ``on_write(when, attr, driver, bdf)`` with when "before"/"after" acting on
        # each bind/unbind write: a test may SIGKILL the writer there (every step of a prepare).
        self.on_write: Callable[[str, str, str, str], None] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._fds: dict[int, tuple[str, str]] = {}
        self._next_vfio = 0
        self._build()

    # ---- layout --------------------------------------------------------------------------------

    @property
    def sys(self) -> Path:
        return self.root / "sys"

    def device(self, bdf: str) -> Path:
        return self.sys / "bus" / "pci" / "devices" / bdf

    def driver_dir(self, name: str) -> Path:
        return self.sys / "bus" / "pci" / "drivers" / name

    def driver_of(self, bdf: str) -> str | None:
        try:
            return os.path.basename(os.readlink(self.device(bdf) / "driver"))
        except OSError:
            return None

    def _build(self) -> None:
        (self.root / "dev" / "vfio" / "devices").mkdir(parents=True, exist_ok=True)
        (self.root / "dev" / "vfio" / "vfio").write_text("")
        if self.iommufd:
            (self.root / "dev" / "iommu").write_text("")
        for name in DRIVERS:
            folder = self.driver_dir(name)
            folder.mkdir(parents=True, exist_ok=True)
            for attr in ("bind", "unbind"):
                if not (folder / attr).exists():
                    os.mkfifo(folder / attr)
        for bdf, group in self.groups.items():
            dev = self.device(bdf)
            dev.mkdir(parents=True, exist_ok=True)
            (dev / "driver_override").write_text("\n")
            gdir = self.sys / "kernel" / "iommu_groups" / str(group) / "devices"
            gdir.mkdir(parents=True, exist_ok=True)
            (gdir / bdf).symlink_to(dev)
            (dev / "iommu_group").symlink_to(gdir.parent)
            if bdf.endswith(".0"):
                self._link(bdf, "nvidia")

    def _link(self, bdf: str, driver: str) -> None:
        (self.device(bdf) / "driver").symlink_to(f"../../drivers/{driver}")
        (self.driver_dir(driver) / bdf).symlink_to(f"../../devices/{bdf}")

    # ---- faults --------------------------------------------------------------------------------

    def hold(self, bdf: str, pids: list[int]) -> None:
        """Processes use the GPU: nvidia's unbind of it does not finish."""
        with self._lock:
            self.held[bdf] = list(pids)

    def release(self, bdf: str) -> None:
        with self._lock:
            self.held.pop(bdf, None)

    def no_node(self, bdf: str) -> None:
        """Binding ``bdf`` to vfio-pci never makes its device node."""
        with self._lock:
            self.missing_node.add(bdf)

    # ---- the thread ----------------------------------------------------------------------------

    def start(self) -> FakeKernel:
        for name in DRIVERS:
            for attr in ("bind", "unbind"):
                path = self.driver_dir(name) / attr
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
                os.open(path, os.O_WRONLY | os.O_NONBLOCK)  # never EOF: a writer always exists
                self._fds[fd] = (name, attr)
        self._thread = threading.Thread(target=self._loop, name="fake-kernel", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> FakeKernel:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _loop(self) -> None:
        pending: dict[int, bytes] = {}
        while not self._stop.is_set():
            ready, _, _ = select.select(list(self._fds), [], [], 0.05)
            for fd in ready:
                with contextlib.suppress(BlockingIOError):
                    pending[fd] = pending.get(fd, b"") + os.read(fd, 4096)
                data = pending.pop(fd, b"")
                name, attr = self._fds[fd]
                for word in data.decode(errors="replace").split():
                    hook = self.on_write
                    if hook is not None:
                        hook("before", attr, name, word)
                    with self._lock:
                        self._act(name, attr, word.strip())
                    if hook is not None:
                        hook("after", attr, name, word)

    def _act(self, driver: str, attr: str, bdf: str) -> None:
        if bdf not in self.groups:
            self.events.append(f"{attr} {driver} {bdf}: no such device")
            return
        current = self.driver_of(bdf)
        if attr == "unbind":
            if current != driver:
                self.events.append(f"unbind {driver} {bdf}: not bound to it")
                return
            if driver == "nvidia" and bdf in self.held:
                self.events.append(f"unbind {driver} {bdf}: busy {self.held[bdf]}")
                return
            (self.device(bdf) / "driver").unlink()
            (self.driver_dir(driver) / bdf).unlink(missing_ok=True)
            if driver == "vfio-pci":
                self._drop_nodes(bdf)
            self.events.append(f"unbind {driver} {bdf}")
            return
        override = (self.device(bdf) / "driver_override").read_text().strip()
        if current is not None or (override and override != driver):
            self.events.append(f"bind {driver} {bdf}: refused (driver {current}, {override!r})")
            return
        # As the kernel: vfio-pci's probe registers the device (its group node, its cdev)
        # before the driver core links the driver; a reader that sees the link sees the nodes
        # (the other order once failed a test: the group node seen, the cdev not yet).
        if driver == "vfio-pci" and bdf not in self.missing_node:
            self._make_nodes(bdf)
        self._link(bdf, driver)
        self.events.append(f"bind {driver} {bdf}")

    def _make_nodes(self, bdf: str) -> None:
        (self.root / "dev" / "vfio" / str(self.groups[bdf])).write_text("")
        if self.iommufd:
            name = f"vfio{self._next_vfio}"
            self._next_vfio += 1
            (self.device(bdf) / "vfio-dev").mkdir(exist_ok=True)
            (self.device(bdf) / "vfio-dev" / name).mkdir()
            (self.root / "dev" / "vfio" / "devices" / name).write_text("")

    def _drop_nodes(self, bdf: str) -> None:
        group = self.groups[bdf]
        if not any(g == group and self.driver_of(b) == "vfio-pci" for b, g in self.groups.items()):
            (self.root / "dev" / "vfio" / str(group)).unlink(missing_ok=True)
        vdev = self.device(bdf) / "vfio-dev"
        for entry in list(vdev.iterdir()) if vdev.is_dir() else ():
            (self.root / "dev" / "vfio" / "devices" / entry.name).unlink(missing_ok=True)
            entry.rmdir()


@contextlib.contextmanager
def running(
    root: Path, groups: Mapping[str, int], *, iommufd: bool = False
) -> Iterator[FakeKernel]:
    """A started kernel over a new tree under ``root``."""
    kernel = FakeKernel(root, groups, iommufd=iommufd)
    with kernel:
        yield kernel


def groups_of(devices: object) -> dict[str, int]:
    """BDF → IOMMU group of a discovered model's GPUs (``model.NodeDevices``)."""
    return {
        g.pci_bus_id: g.iommu_group
        for g in getattr(devices, "gpus", ())
        if g.iommu_group is not None
    }
