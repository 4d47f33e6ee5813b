"""Finding the NVIDIA driver's user-space files that containers need, under ``--driver-root``.

A CUDA program needs the driver's libraries (``libcuda.so.*``, ``libnvidia-ml.so.*``, ...) of
exactly the kernel module's version, so they come from the host, mounted read-only, not from the
image. The driver may be installed on the host itself (root ``/``) or by a driver container
(e.g. ``/run/nvidia/driver``); either way we scan the usual library and binary directories once at
start-up. Symlinks (``libcuda.so.1`` → ``libcuda.so.580.95.05``) are resolved *inside* the root,
so the container gets a file at every name the loader may look for.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path, PurePosixPath

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


@dataclasses.dataclass(frozen=True, slots=True)
class Mount:
    """A read-only bind mount of one driver file."""

    host_path: str
    container_path: str


def discover(root: Path) -> tuple[Mount, ...]:
    """Every driver library and binary under ``root``, in a stable order.

    ``root`` is where the driver files are visible to this process, which must be the same path
    as on the host (the plugin's container mounts it at the identical path).
    """
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
            mounts.setdefault(container_path, Mount(str(target), container_path))
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
    return None
