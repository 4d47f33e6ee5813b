"""Reading a file the user names on the command line, so that no input can give a traceback.

Every file-reading flag and positional argument (``simulate CLAIM.yaml``, ``--slices``,
``--allocated``, ``--class``, ``--fake-file``, ...) is declared with ``type=inputfile.path`` and
read with :func:`read_text`. Whatever the path names, the answer is text or one
:class:`InputFileError` whose message is one line naming the file and the reason:

* a directory, a device, a socket: refused after an ``fstat`` of the descriptor (opened with
  ``O_NONBLOCK``, so a FIFO without a writer never blocks the open);
* a FIFO or pipe (``--slices <(kubectl get resourceslices -o json)``, ``/dev/stdin``): read to its
  end; one that no process writes reads as empty at once, and empty is an error;
* more than :data:`MAX_BYTES` (a regular file by its size, before anything is read; a pipe once
  it has given that much);
* a NUL byte (binary data: no YAML or JSON holds one) or bytes that are not UTF-8: the byte
  offset is named.

The parsers behind (YAML, JSON) then only ever see bounded, valid text; their own errors are the
callers' to word. The tests find every flag of this type in the argparse tree and fuzz it
(tests/cli/test_input_fuzz.py): a new reader is covered by being declared with this type.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

# A fleet's exported ResourceSlices are tens of MiB (8,000 nodes as JSON: ~60 MiB); four times
# that is still an input, more is a mistake (a disk image, /dev/zero through a pipe).
MAX_BYTES = 256 * 2**20
_CHUNK = 1 << 20


class InputFileError(ValueError):
    """A file that cannot be used as input; the message is one line naming it."""


def path(value: str) -> Path:
    """The ``type=`` of every flag naming a file that is read (how the tests find them)."""
    return Path(value)


def read_bytes(file: Path, *, limit: int = MAX_BYTES) -> bytes:
    """The whole content of ``file``, a regular file or a pipe, at most ``limit`` bytes."""
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise InputFileError(f"cannot read {file}: {err.strerror or err}") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise InputFileError(f"cannot read {file}: it is a directory, not a file")
        pipe = stat.S_ISFIFO(mode)
        if not (stat.S_ISREG(mode) or pipe):
            raise InputFileError(f"cannot read {file}: not a regular file ({_kind(mode)})")
        if not pipe and os.fstat(fd).st_size > limit:
            raise InputFileError(_too_big(file, limit))
        os.set_blocking(fd, True)  # a pipe with a writer is waited on; one without reads empty
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = os.read(fd, _CHUNK)
            if not chunk:
                break
            size += len(chunk)
            if size > limit:
                raise InputFileError(_too_big(file, limit))
            chunks.append(chunk)
    except OSError as err:
        raise InputFileError(f"cannot read {file}: {err.strerror or err}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if not data and pipe:
        raise InputFileError(f"{file}: a pipe that gave nothing (no process writes to it)")
    return data


def read_text(file: Path, *, limit: int = MAX_BYTES) -> str:
    """The content of ``file`` as UTF-8 text without NUL bytes (see the module docstring)."""
    return decode(read_bytes(file, limit=limit), source=str(file))


def decode(data: bytes, *, source: str) -> str:
    """``data`` as UTF-8 text; a NUL byte or invalid UTF-8 is an error naming the offset."""
    nul = data.find(b"\x00")
    if nul >= 0:
        raise InputFileError(f"{source}: binary data, not text (a NUL byte at offset {nul})")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        bad = data[err.start : err.start + 1].hex()
        raise InputFileError(
            f"{source}: not UTF-8 text (byte 0x{bad} at offset {err.start}: {err.reason})"
        ) from None


def _too_big(file: Path, limit: int) -> str:
    most = f"{limit // 2**20} MiB" if limit % 2**20 == 0 else f"{limit:,} bytes"
    return f"cannot read {file}: larger than {most}, the most an input file may be"


def _kind(mode: int) -> str:
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a file"
