"""File-system faults on demand, for the fault tests and ``benchmarks/faults.py``.

Why it exists: a full disk (ENOSPC), a read-only mount (EROFS) or a permission problem (EACCES)
under the CDI or checkpoint directory are expected conditions on a node, and the plugin must
answer them with a clear per-claim error and lose nothing. Making them real needs mounts or a
non-root user, which CI does not have, so :func:`failing_files` makes the operating system calls
that change a directory's entries (``open`` for writing or creating, ``link``, ``rename``,
``replace``, ``unlink``, ``mkdir``, ``rmdir``) fail with the chosen ``errno`` for paths under that
directory, in this process, for the duration of a ``with`` block. Reads are untouched, as on a
read-only mount. Used in-process only (never installed in the agents).
"""

from __future__ import annotations

import contextlib
import errno as errno_mod
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | getattr(os, "O_TMPFILE", 0)
_lock = threading.Lock()


def _under(value: object, roots: tuple[str, ...]) -> str | None:
    if isinstance(value, str | Path):
        text = os.path.abspath(os.fspath(value))
        for root in roots:
            if text == root or text.startswith(root + os.sep):
                return text
    return None


@contextlib.contextmanager
def failing_files(*directories: Path, errno: int = errno_mod.EROFS) -> Iterator[None]:
    """Inside the block, changes of entries under ``directories`` fail with ``errno``."""
    roots = tuple(os.path.abspath(os.fspath(d)) for d in directories)
    message = os.strerror(errno)

    def wrap(real: Callable[..., Any], *, writes_only: bool = False) -> Callable[..., Any]:
        def op(*args: Any, **kwargs: Any) -> Any:
            if writes_only:
                flags = args[1] if len(args) > 1 else kwargs.get("flags", 0)
                if not flags & _WRITE_FLAGS:
                    return real(*args, **kwargs)
            for value in (*args[:2], kwargs.get("dst")):
                hit = _under(value, roots)
                if hit is not None:
                    raise OSError(errno, message, hit)
            return real(*args, **kwargs)

        return op

    names = ("link", "rename", "replace", "unlink", "remove", "mkdir", "rmdir")
    with _lock:
        saved = {name: getattr(os, name) for name in (*names, "open")}
        for name in names:
            setattr(os, name, wrap(saved[name]))
        os.open = wrap(saved["open"], writes_only=True)
    try:
        yield
    finally:
        with _lock:
            for name, real in saved.items():
                setattr(os, name, real)
