"""Atomic (and, where it matters, durable) file updates for the CDI specs and the checkpoint.

Atomic: a crash of the process at any instant leaves either the old or the new content, never a
torn file: write a temporary file under a dot-name in the same directory, then rename it over the
target (rename is atomic, and the kernel keeps both in its cache even if we are SIGKILLed).

Seen by watchers: container runtimes (containerd 2, CRI-O) keep a cache of the CDI spec
directories that refreshes on inotify *write*, *rename* and *remove* events and deliberately
ignores bare *creates* (a file that just appeared may still be empty). Writing a named temporary
file and renaming it raises a rename event (``IN_MOVED_FROM`` of the temporary name), so the
cache reloads the directory the moment the spec is complete; writes to the temporary file itself
are ignored by the cache (its extension is neither ``.json`` nor ``.yaml``), and so is it when it
scans (same reason). Never link a finished unnamed (``O_TMPFILE``) file into such a directory:
that raises nothing but a create, and the runtime never learns of the spec (issue 19). Only
:func:`create_open`, for the plugin's private checkpoint directory that nobody watches, still
uses an unnamed file.

Durable (``durable=True``): additionally fsync the file before the rename and the directory after
it, so the new content also survives a power loss or kernel crash. That costs two journal commits
(milliseconds, with a long tail on busy disks), so it is used only where a later boot could read
the file; see :mod:`dra_driver.driver.checkpoint` for which writes those are.

Group commit (:class:`DirSync`): the directory fsync that makes a rename durable covers *every*
rename made in that directory before it began. So when many claims commit at once, one thread
syncs and the others that renamed before that sync started just wait for it; the serial case
still pays exactly one directory sync per durable write.

Paths are handled as strings and every step is one system call where possible: this runs for
every prepared claim, and pathlib's object churn alone was a visible part of its cost.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import os
import secrets
import threading
import weakref
from pathlib import Path
from typing import Any


class DirSync:
    """fsync of one directory, shared by concurrent callers (group commit; thread-safe)."""

    def __init__(self, directory: Path | str) -> None:
        self.directory = os.fspath(directory)
        self._syncing = threading.Lock()  # held by the one thread inside fsync
        self._guard = threading.Lock()
        self._arrived = 0  # tickets handed out: a caller takes one after its rename
        self._covered = 0  # every ticket up to this one is durable
        self._fd = -1  # the directory, opened on first use and kept (two syscalls a sync less)
        self.syncs = 0

    def sync(self) -> None:
        """Return once every rename this thread made in the directory is durable."""
        with self._guard:
            self._arrived += 1
            ticket = self._arrived
        with self._syncing:
            if self._covered >= ticket:  # a sync that began after our rename covered it
                return
            with self._guard:
                upto = self._arrived  # their renames happened before they took tickets
            if self._fd < 0:
                self._fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                weakref.finalize(self, os.close, self._fd)
            os.fsync(self._fd)
            self.syncs += 1
            self._covered = upto


# Temporary files start with a dot: CDI runtimes only read *.json / *.yaml, and our own scans
# of the checkpoint directory skip dot files.
TMP_PREFIX = ".tmp-"


def fsync_dir(directory: Path | str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes(
    path: Path | str,
    data: bytes,
    *,
    durable: bool = True,
    mode: int = 0o644,
    dir_sync: DirSync | None = None,
) -> None:
    """Replace ``path`` with ``data`` atomically, visibly to directory watchers (a named
    temporary file renamed over it), and durably if asked (``dir_sync``, the group-committed
    sync of ``path``'s directory, then makes the rename durable)."""
    target = os.fspath(path)
    head, name = os.path.split(target)
    _write_named(target, head, name, data, durable=durable, mode=mode)
    if durable:
        if dir_sync is not None:
            dir_sync.sync()
        else:
            fsync_dir(head or ".")


def create_open(path: Path | str, data: bytes, *, mode: int = 0o644) -> int:
    """Atomically write ``data`` as ``path`` (expected to be new; replaced if not) and return a
    descriptor open for writing to it, for a later in-place update; the caller closes it.

    Where Linux allows (``O_TMPFILE``), the content is written to an unnamed file that is then
    linked in under its name: one directory operation, and nothing left behind by a crash. Only
    for directories no other program watches (see the module docstring)."""
    target = os.fspath(path)
    head, name = os.path.split(target)
    fd = _open_unnamed(head or ".", mode)
    if fd is not None:
        try:
            _write_all(fd, data)
            if _link(fd, target, head, name):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    _write_named(target, head, name, data, durable=False, mode=mode)
    return os.open(target, os.O_WRONLY | os.O_CLOEXEC)


_unnamed = {"supported": hasattr(os, "O_TMPFILE")}
_NO_UNNAMED = (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL)
_NO_PROC_LINK = (errno.ENOENT, errno.EXDEV, errno.EPERM, errno.EACCES)


def _open_unnamed(directory: str, mode: int) -> int | None:
    """An unnamed file in ``directory``; None where the filesystem (or kernel) has none."""
    if not _unnamed["supported"]:
        return None
    try:
        return os.open(directory, os.O_WRONLY | os.O_TMPFILE | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno not in _NO_UNNAMED:
            raise
        _unnamed["supported"] = False
        return None


def _link(fd: int, target: str, head: str, name: str) -> bool:
    """Give the unnamed file ``fd`` the name ``target``, replacing what is there; False when
    this process cannot link through ``/proc/self/fd`` (then the caller writes it named)."""
    source = f"/proc/self/fd/{fd}"
    try:
        # An absolute source ignores src_dir_fd; passing one makes Python call linkat(2),
        # which (with AT_SYMLINK_FOLLOW) links the file the /proc link points to.
        os.link(source, target, src_dir_fd=fd, follow_symlinks=True)
        return True
    except FileExistsError:  # not new after all: link under a temporary name, rename over it
        tmp = _tmp_name(head, name)
        os.link(source, tmp, src_dir_fd=fd, follow_symlinks=True)
    except OSError as exc:
        if exc.errno not in _NO_PROC_LINK or not os.path.isdir(head or "."):
            raise
        _unnamed["supported"] = False
        return False
    try:
        os.replace(tmp, target)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    return True


def _write_named(
    target: str, head: str, name: str, data: bytes, *, durable: bool, mode: int
) -> None:
    """The portable way: a named temporary file, renamed over ``target``."""
    while True:
        tmp = _tmp_name(head, name)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
            break
        except FileExistsError:  # another process's name (its token and counter): next one
            continue
    try:
        try:
            _write_all(fd, data)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        _unlink_quietly(tmp)
        raise


# Temporary names: this process's random token and a counter. Unique within the process by the
# counter and, with O_EXCL and a retry, across processes (another instance's container may have
# the same PID); no random bytes to draw per file (a getrandom(2) per write, issue 46's profile).
_TOKEN = secrets.token_hex(4)
_serial = itertools.count()


def _tmp_name(head: str, name: str) -> str:
    return os.path.join(head, f"{TMP_PREFIX}{name}.{_TOKEN}{next(_serial):x}")


def write_new(path: Path | str, data: bytes, *, mode: int = 0o644) -> None:
    """Write ``data`` as ``path``, created under its own name when it does not exist yet (one
    directory operation instead of a temporary's create and rename), else replaced atomically
    as :func:`write_bytes` does, never durably. Only for files nothing reads before the writer
    says they are complete, and whose torn content after a crash is found and rewritten (the
    claim metadata files: start-up restores them from the record)."""
    target = os.fspath(path)
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    except FileExistsError:
        head, name = os.path.split(target)
        _write_named(target, head, name, data, durable=False, mode=mode)
        return
    try:
        _write_all(fd, data)
    except BaseException:
        os.close(fd)
        _unlink_quietly(target)
        raise
    os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    written = os.write(fd, data)
    if written < len(data):
        view = memoryview(data)[written:]
        while view:
            view = view[os.write(fd, view) :]


def _unlink_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def write_json(
    path: Path | str,
    obj: Any,
    *,
    durable: bool = True,
    mode: int = 0o644,
    dir_sync: DirSync | None = None,
) -> None:
    """``obj`` as compact JSON, atomically (and durably if asked).

    Compact on purpose: ``indent`` makes the json module fall back to its pure-Python encoder,
    which costs more CPU than the rest of a prepare (``jq`` makes the files readable)."""
    data = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
    write_bytes(path, data, durable=durable, mode=mode, dir_sync=dir_sync)


def remove(path: Path | str, *, durable: bool = True) -> bool:
    """Remove ``path`` (idempotent); False when it did not exist."""
    target = os.fspath(path)
    try:
        os.unlink(target)
    except FileNotFoundError:
        return False
    if durable:
        fsync_dir(os.path.dirname(target) or ".")
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
