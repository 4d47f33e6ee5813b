"""``dra-driver demo``: flags for the walk-through in :mod:`dra_driver.demo`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dra_driver import cli, demo, inputfile
from dra_driver.cli import common, env_default
from dra_driver.devices import fake
from dra_driver.devices.fake import profiles


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
        help="work in DIR and keep it (sockets, CDI specs, checkpoint, logs)",
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
    return demo.run(
        backend=backend,
        node_name=args.node_name,
        driver_name=args.driver_name,
        out=sys.stdout,
        keep=args.keep,
        scenes=args.scene,
    )
