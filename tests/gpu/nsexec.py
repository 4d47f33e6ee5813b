"""Run a program with a ``/dev`` that holds only the given device nodes (what a container gets
from a CDI spec), in the private mount namespace ``unshare --mount`` made for this process.

Usage (inside the namespace)::

    nsexec.py --stage DIR [--node PATH[=HOSTPATH] ...] [--env K=V ...] -- PROGRAM [ARG ...]

A tmpfs is mounted on ``DIR``, each node is bind-mounted into it at ``PATH`` from the host's
``HOSTPATH`` (default ``PATH``, as a CDI ``deviceNodes`` entry means it; a bind mount works in a
user namespace too, where ``mknod`` does not), the tmpfs is then moved over
``/dev``, and ``PROGRAM`` replaces this process with exactly the environment given. Only the
namespace sees any of it: the host's ``/dev`` is never touched.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys

MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_BIND = 0x1000
MS_MOVE = 0x2000
_libc = ctypes.CDLL(None, use_errno=True)


def mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    if (
        _libc.mount(
            source.encode(),
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        )
        != 0
    ):
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source} on {target}: {os.strerror(errno)}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stage", required=True)
    parser.add_argument("--node", action="append", default=[])
    parser.add_argument("--env", action="append", default=[])
    parser.add_argument("program", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not program:
        parser.error("no program to run")
    # nodev: a node made in it later (nvidia-modprobe creates missing /dev/nvidia* nodes) cannot
    # be opened, so the program reaches only the nodes bound here, each on its own mount.
    mount("gpu-check-dev", args.stage, "tmpfs", MS_NODEV | MS_NOSUID, "mode=0755")
    for node in args.node:
        path, _, host = node.partition("=")
        if not path.startswith("/dev/"):
            raise SystemExit(f"{path}: not under /dev")
        target = os.path.join(args.stage, path.removeprefix("/dev/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "w"):
            pass  # the mount point for the node
        mount(host or path, target, None, MS_BIND, None)
    mount(args.stage, "/dev", None, MS_MOVE, None)
    env = dict(item.split("=", 1) for item in args.env)
    os.execve(program[0], program, env)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
