"""``dra-driver demo``: flags for the walk-through in :mod:`dra_driver.demo`."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from dra_driver import cli, demo, inputfile
from dra_driver.cli import common, env_default
from dra_driver.devices import fake
from dra_driver.devices.fake import profiles

# ``--keep`` without DIR: a fresh directory under /tmp (short: unix socket paths), kept.
KEEP_TEMP = object()
# The scenes' unix sockets lie deep below the working directory and a socket path has at most
# 107 bytes: a DIR much longer than the default's 22 bytes failed a scene half-way, with a
# traceback. Every scene passes with a DIR of this length.
KEEP_MAX_BYTES = 40


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "demo",
        help=cli.SUMMARIES["demo"],
        description="Discover fake GPUs, publish ResourceSlices, allocate the example claims, "
        "and drive the real kubelet plugin over real unix sockets as the kubelet would.",
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--fake",
        metavar="PROFILE",
        default=demo.DEFAULT_PROFILE,
        help=f"built-in fake GPU profile (default {demo.DEFAULT_PROFILE}; "
        f"one of {', '.join(profiles.builtin_names())})",
    )
    group.add_argument(
        "--fake-file",
        metavar="FILE",
        type=inputfile.path,
        help="fake GPU profile from a YAML file (docs/profiles.md)",
    )
    parser.add_argument("--node-name", default=env_default("NODE_NAME", "demo-node"))
    parser.add_argument("--driver-name", default=env_default("DRIVER_NAME", "gpu.nvidia.com"))
    parser.add_argument(
        "--keep",
        metavar="DIR",
        type=Path,
        nargs="?",
        const=KEEP_TEMP,
        help="keep the working directory (sockets, CDI specs, checkpoint, logs) and say where: "
        "DIR, or without DIR a new one under /tmp",
    )
    parser.add_argument(
        "--scene",
        action="append",
        choices=demo.scene_names(),
        help="run only this scene (repeatable; default: all of them in order)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    try:
        backend = (
            fake.FakeBackend.from_file(args.fake_file)
            if args.fake_file
            else fake.FakeBackend.from_name(args.fake)
        )
    except profiles.ProfileError as exc:
        return common.fail(str(exc))
    keep: Path | None = args.keep
    if args.keep is KEEP_TEMP:
        keep = Path(tempfile.mkdtemp(prefix="dra-demo-", dir="/tmp"))
    elif keep is not None:
        keep = keep.absolute()
        if len(os.fsencode(keep)) > KEEP_MAX_BYTES:
            return common.fail(
                f"--keep {keep}: {len(os.fsencode(keep))} bytes; the demo's unix sockets under "
                f"it would exceed the 107 a socket path may have: use a directory of at most "
                f"{KEEP_MAX_BYTES} bytes (e.g. under /tmp)"
            )
    return demo.run(
        backend=backend,
        node_name=args.node_name,
        driver_name=args.driver_name,
        out=sys.stdout,
        keep=keep,
        scenes=args.scene,
    )
