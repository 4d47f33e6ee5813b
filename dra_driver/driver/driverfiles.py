"""Finding the NVIDIA driver's user-space files that containers need, under ``--driver-root``.

A CUDA program needs the driver's libraries (``libcuda.so.*``, ``libnvidia-ml.so.*``, ...) of
exactly the kernel module's version, so they come from the host, mounted read-only, not from the
image. The driver may be installed on the host itself (root ``/``) or by a driver container
(e.g. ``/run/nvidia/driver``); either way we scan the usual library and binary directories once at
start-up. Symlinks (``libcuda.so.1`` → ``libcuda.so.580.95.05``) are resolved *inside* the root,
so the container gets a file at every name the loader may look for.

In a container the plugin may see the driver root somewhere else than the host does: the chart
mounts a host root of ``/`` at ``/driver-root`` (``--driver-root-mount``), since ``/`` cannot be
mounted at ``/``. Files are then searched under the mount, and the CDI spec names them by their
*host* path, which is what the container runtime on the host opens.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from dra_driver import records

LIBRARY_PREFIXES = (
    "libcuda.so",
    "libcudadebugger.so",
    "libnvidia-ml.so",
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-nvvm.so",
    "libnvidia-gpucomp.so",
    "libnvidia-allocator.so",
    "libnvidia-cfg.so",
    "libnvidia-opencl.so",
)
BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
LIBRARY_DIRS = (
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "lib64",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "usr/lib",
)
BINARY_DIRS = ("usr/bin", "bin", "usr/sbin")
MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "bind")
_MAX_LINKS = 16


@records.record
class Mount:
    """A read-only bind mount of one driver file."""

    host_path: str  # what the CDI spec names (the runtime on the host opens it)
    container_path: str
    local_path: str = ""  # where this process sees the file (differs under --driver-root-mount)


def discover(root: Path, *, mount: Path | None = None) -> tuple[Mount, ...]:
    """Every driver library and binary under the driver root, in a stable order.

    ``root`` is the driver root's path on the host; ``mount`` is where this process sees it
    (default: at ``root`` itself). ``host_path`` of each result lies under ``root``.
    """
    host_root = root
    root = mount if mount is not None else root
    mounts: dict[str, Mount] = {}
    for rel_dir, wanted in [(d, _is_library) for d in LIBRARY_DIRS] + [
        (d, _is_binary) for d in BINARY_DIRS
    ]:
        directory = root / rel_dir
        if not directory.is_dir() or directory.is_symlink():
            continue
        for entry in sorted(directory.iterdir()):
            if not wanted(entry.name):
                continue
            target = _resolve_inside(root, entry)
            if target is None:
                continue
            container_path = str(PurePosixPath("/") / rel_dir / entry.name)
            host_path = host_root / target.relative_to(root)
            mounts.setdefault(
                container_path, Mount(str(host_path), container_path, local_path=str(target))
            )
    return tuple(mounts.values())


def _is_library(name: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in LIBRARY_PREFIXES)


def _is_binary(name: str) -> bool:
    return name in BINARIES


def _resolve_inside(root: Path, path: Path) -> Path | None:
    """Follow symlinks as if ``root`` were ``/``; the final regular file, or None."""
    current = path
    for _ in range(_MAX_LINKS):
        if not current.is_symlink():
            return current if current.is_file() else None
        target = os.readlink(current)
        absolute = target.startswith("/")
        current = root / target.lstrip("/") if absolute else current.parent / target
        # ".." never leaves the root, as on a real "/": root/usr/../../etc is root/etc
        current = root / os.path.normpath("/" + os.path.relpath(current, root)).lstrip("/")
    return None
