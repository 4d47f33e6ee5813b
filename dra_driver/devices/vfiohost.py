"""The host side of VFIO passthrough: moving one GPU between ``nvidia`` and ``vfio-pci`` in sysfs.

Why it exists: binding a GPU to ``vfio-pci`` is a few writes to ``/sys/bus/pci`` and a wait for
its node under ``/dev/vfio``, each of which the kernel may refuse; this module is the only code
that does them, below a root path passed in (``/`` on a node, ``/host`` in a container that
mounts the host there, a fake tree in tests: :mod:`dra_driver.testing.fakesysfs`). It knows
nothing of claims or checkpoints (:mod:`dra_driver.driver.vfio` orders and records the steps).

One step each, every one safe to repeat (a restart may redo any of them):

* :meth:`VfioHost.unbind` — write the BDF to the bound driver's ``unbind``, then wait (bounded)
  for the ``driver`` link to go: the nvidia driver does not let go of a GPU that is in use.
* :meth:`VfioHost.set_override` — ``driver_override`` (``vfio-pci``, or cleared), so that no
  other driver (nvidia's udev rules) grabs the unbound GPU.
* :meth:`VfioHost.bind` — write the BDF to ``drivers/<name>/bind``, wait for the link.
* :meth:`VfioHost.wait_nodes` — wait (bounded) for the device nodes a VM opens: with IOMMUFD
  (``/dev/iommu`` exists and the device lists a ``vfio-dev/vfioN``) ``/dev/vfio/devices/vfioN``
  and ``/dev/iommu``, otherwise the group's ``/dev/vfio/<group>`` and the container
  ``/dev/vfio/vfio``.

Refusals come first (:meth:`VfioHost.group_members`): the whole IOMMU group goes to the VM, so
a group holding any device besides the GPU cannot be passed through safely.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from pathlib import Path

VFIO = "vfio-pci"
NVIDIA = "nvidia"
DEFAULT_WAIT_S = 5.0


class VfioHostError(Exception):
    """A sysfs step failed; the message names the GPU and what the kernel did."""


class VfioHost:
    """``<root>/sys`` and ``<root>/dev`` of one host."""

    def __init__(
        self,
        root: Path = Path("/"),
        *,
        wait_s: float = DEFAULT_WAIT_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.root = root
        self.wait_s = wait_s
        self._clock = clock
        self._sleep = sleep

    # ---- reading -------------------------------------------------------------------------------

    def device(self, bdf: str) -> Path:
        return self.root / "sys" / "bus" / "pci" / "devices" / bdf

    def driver(self, bdf: str) -> str | None:
        """The bound driver's name, None when unbound (or the device is unknown)."""
        try:
            return os.path.basename(os.readlink(self.device(bdf) / "driver"))
        except OSError:
            return None

    def override(self, bdf: str) -> str:
        try:
            return (self.device(bdf) / "driver_override").read_text().strip()
        except OSError:
            return ""

    def group(self, bdf: str) -> int | None:
        try:
            return int(os.path.basename(os.readlink(self.device(bdf) / "iommu_group")))
        except (OSError, ValueError):
            return None

    def group_members(self, bdf: str) -> list[str]:
        """Every device of the GPU's IOMMU group, the GPU included (sorted)."""
        try:
            return sorted(os.listdir(self.device(bdf) / "iommu_group" / "devices"))
        except OSError:
            return []

    def iommufd(self) -> bool:
        return os.path.exists(self.root / "dev" / "iommu")

    def nodes(self, bdf: str) -> tuple[str, ...]:
        """The container paths of the nodes a VM needs for ``bdf`` bound to vfio-pci (they may
        not exist yet)."""
        if self.iommufd():
            try:
                cdevs = sorted(os.listdir(self.device(bdf) / "vfio-dev"))
            except OSError:
                cdevs = []
            if cdevs:
                return (f"/dev/vfio/devices/{cdevs[0]}", "/dev/iommu")
        group = self.group(bdf)
        return (f"/dev/vfio/{group}", "/dev/vfio/vfio")

    def host_path(self, path: str) -> Path:
        """Where a container path (``/dev/vfio/12``) is on this host's root."""
        return self.root / path.lstrip("/")

    # ---- steps ---------------------------------------------------------------------------------

    def unbind(self, bdf: str, *, who: str = "") -> None:
        """Unbind from whatever driver holds it (nothing bound: nothing to do)."""
        current = self.driver(bdf)
        if current is None:
            return
        self._write(self.device(bdf) / "driver" / "unbind", bdf, bdf)
        if not self._until(lambda: self.driver(bdf) is None):
            users = f" (in use by {who})" if who else ""
            raise VfioHostError(
                f"GPU {bdf}: the {current} driver did not let go of it within "
                f"{self.wait_s:g} s{users} (EBUSY)"
            )

    def set_override(self, bdf: str, driver: str | None) -> None:
        """``driver_override``: ``driver``, or cleared (None)."""
        self._write(self.device(bdf) / "driver_override", driver or "\n", bdf)

    def bind(self, bdf: str, driver: str) -> None:
        if self.driver(bdf) == driver:
            return
        path = self.root / "sys" / "bus" / "pci" / "drivers" / driver / "bind"
        if not os.path.exists(path):
            raise VfioHostError(
                f"GPU {bdf}: no {driver} driver in {path.parent} (is the module loaded? "
                f"modprobe {driver.replace('-', '_')})"
            )
        self._write(path, bdf, bdf)
        if not self._until(lambda: self.driver(bdf) == driver):
            raise VfioHostError(
                f"GPU {bdf}: binding it to {driver} did not take within {self.wait_s:g} s "
                f"(bound to {self.driver(bdf) or 'nothing'})"
            )

    def wait_nodes(self, bdf: str) -> tuple[str, ...]:
        """The VM's nodes for ``bdf`` once they exist; raises when they do not appear."""
        found: list[tuple[str, ...]] = []

        def ready() -> bool:
            nodes = self.nodes(bdf)
            found[:] = [nodes]
            return all(os.path.exists(self.host_path(n)) for n in nodes)

        if not self._until(ready):
            missing = [n for n in found[0] if not os.path.exists(self.host_path(n))]
            raise VfioHostError(
                f"GPU {bdf}: bound to {VFIO}, but {', '.join(missing)} did not appear within "
                f"{self.wait_s:g} s"
            )
        return found[0]

    # ---- helpers -------------------------------------------------------------------------------

    def _until(self, done: Callable[[], bool]) -> bool:
        deadline = self._clock() + self.wait_s
        delay = 0.005
        while True:
            if done():
                return True
            if self._clock() >= deadline:
                return False
            self._sleep(delay)
            delay = min(delay * 2, 0.1)

    def _write(self, path: Path, text: str, bdf: str) -> None:
        try:
            write_attribute(path, text)
        except OSError as exc:
            code = errno.errorcode.get(exc.errno or 0, "")
            raise VfioHostError(
                f"GPU {bdf}: cannot write {text.strip() or 'nothing'!r} to {path}: "
                f"{exc.strerror or exc}" + (f" ({code})" if code else "")
            ) from None


def write_attribute(path: Path, text: str) -> None:
    """One ``write`` of ``text`` to a sysfs attribute (or the fake kernel's FIFO): opened
    without creating, never truncating a FIFO, closed at once. Tests wrap this to crash at a
    step."""
    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_TRUNC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
