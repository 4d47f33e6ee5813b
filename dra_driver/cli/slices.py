"""``dra-driver slices``: print the ResourceSlices this node would publish.

Lets an operator see exactly what the scheduler will be told about a node — device names,
attributes, topology, how the pool is split — before anything is sent, and apply it by hand
(``dra-driver slices --node-name n1 --fake dgx-h100 | kubectl apply -f -``). Output is
deterministic: the same hardware gives byte-identical YAML.
"""

from __future__ import annotations

import argparse
import json
import sys

import yaml

from dra_driver import cli
from dra_driver.cli import common
from dra_driver.devices import backend
from dra_driver.slices import build


def add_identity_flags(parser: argparse.ArgumentParser) -> None:
    """``--node-name`` and ``--driver-name`` with their environment twins."""
    from dra_driver.cli import env_default

    parser.add_argument(
        "--node-name",
        default=env_default("NODE_NAME"),
        help="node name; also the ResourceSlice pool name (env NODE_NAME; required)",
    )
    parser.add_argument(
        "--driver-name",
        default=env_default("DRIVER_NAME", build.DEFAULT_DRIVER_NAME),
        help=f"DRA driver name (env DRIVER_NAME; default {build.DEFAULT_DRIVER_NAME})",
    )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("slices", help=cli.SUMMARIES["slices"])
    add_identity_flags(parser)
    common.add_backend_flags(parser)
    common.add_shareable_flag(parser)
    parser.add_argument(
        "--node-uid",
        default=None,
        help="UID of the Node object, to include the owner reference the publisher sets",
    )
    common.add_dynamic_mig_flag(parser)
    common.add_gpu_sets_flag(parser)
    parser.add_argument("--output", "-o", choices=("yaml", "json"), default="yaml")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if not args.node_name:
        return common.fail("--node-name (or env NODE_NAME) is required")
    try:
        dynamic = common.dynamic_mig(args)
        devices = common.make_backend(args).discover()
        result = build.build(
            devices,
            node_name=args.node_name,
            driver_name=args.driver_name,
            node_uid=args.node_uid,
            dynamic_mig=dynamic,
            shareable=common.shareable_from(args),
            gpu_sets=args.gpu_sets,
        )
    except (common.UsageError, backend.DiscoveryError, build.BuildError) as exc:
        return common.fail(str(exc))
    for problem in result.problems:
        print(f"dra-driver: warning: {problem}", file=sys.stderr)
    print(render(result.slices, args.output), end="")
    return 0


def render(slices: list[build.Obj], output: str = "yaml") -> str:
    """Multi-document YAML (``kubectl apply -f -`` ready) or a JSON ``List``."""
    if output == "json":
        doc = {"apiVersion": "v1", "kind": "List", "items": slices}
        return json.dumps(doc, indent=2) + "\n"
    return yaml.safe_dump_all(slices, sort_keys=False, explicit_start=True)
