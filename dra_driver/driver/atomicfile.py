"""Atomic (and, where it matters, durable) file updates for the CDI specs and the checkpoint.

Atomic: a crash of the process at any instant leaves either the old or the new content, never a
torn file: write a temporary file in the same directory, then rename it over the target (rename
is atomic, and the kernel keeps both in its cache even if we are SIGKILLed).

Durable (``durable=True``): additionally fsync the file before the rename and the directory after
it, so the new content also survives a power loss or kernel crash. That costs two journal commits
(milliseconds, with a long tail on busy disks), so it is used only where a later boot could read
the file; see :mod:`dra_driver.driver.checkpoint` for which writes those are.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

# Temporary files start with a dot: CDI runtimes only read *.json / *.yaml, and our own scans
# of the checkpoint directory skip dot files.
TMP_PREFIX = ".tmp-"


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes(path: Path, data: bytes, *, durable: bool = True, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` atomically (and durably if asked)."""
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def write_json(path: Path, obj: Any, *, durable: bool = True, mode: int = 0o644) -> None:
    """``obj`` as compact JSON, atomically (and durably if asked).

    Compact on purpose: ``indent`` makes the json module fall back to its pure-Python encoder,
    which costs more CPU than the rest of a prepare (``jq`` makes the files readable)."""
    write_bytes(path, (json.dumps(obj) + "\n").encode(), durable=durable, mode=mode)


def remove(path: Path, *, durable: bool = True) -> bool:
    """Remove ``path`` (idempotent); False when it did not exist."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    if durable:
        fsync_dir(path.parent)
    return True


def remove_stale_temporaries(directory: Path, *, target_prefix: str = "") -> list[Path]:
    """Delete leftovers of our writes interrupted by a crash (temporaries of targets whose name
    starts with ``target_prefix``, so other writers' files are left alone); returns them."""
    removed: list[Path] = []
    if not directory.is_dir():
        return removed
    for entry in directory.iterdir():
        if entry.name.startswith(TMP_PREFIX + target_prefix) and entry.is_file():
            entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed
