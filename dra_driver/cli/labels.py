"""``dra-driver labels``: the Node labels this node's agents keep, in GPU Feature Discovery's names.

Prints ``nvidia.com/gpu.product``, ``gpu.count``, ``cuda.driver.major`` ... for the discovered
GPUs (docs/labels.md), as YAML or JSON. ``--mig-strategy`` and ``--replicas`` (the device
plugin's settings, same environment twins) show the labels the device plugin would set; the
defaults are what the DRA kubelet plugin sets. How the labels were chosen (several GPU products,
a MIG layout the strategy cannot serve) is said on stderr.
"""

from __future__ import annotations

import argparse
import sys

from dra_driver import cli
from dra_driver.cli import common, output
from dra_driver.devices import backend
from dra_driver.nodelabels import compute


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from dra_driver.cli import env_default

    parser = sub.add_parser(
        "labels",
        help=cli.SUMMARIES["labels"],
        description="The GPU labels the node agents keep on this node's Node object "
        "(docs/labels.md).",
    )
    common.add_backend_flags(parser)
    output.add_flag(parser, default=output.YAML)  # table: one NAME=VALUE line each
    parser.add_argument(
        "--mig-strategy",
        default=env_default("MIG_STRATEGY", "none"),
        help="the device plugin's MIG strategy: none | single | mixed (env MIG_STRATEGY)",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=env_default("GPU_REPLICAS", "1"),
        help="the device plugin's time-slicing replicas per GPU (env GPU_REPLICAS)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    try:
        settings = compute.Settings(mig_strategy=args.mig_strategy, replicas=args.replicas)
    except compute.LabelError as exc:
        return common.fail(str(exc))
    try:
        devices = common.make_backend(args).discover()
    except (common.UsageError, backend.DiscoveryError) as exc:
        return common.fail(str(exc))
    result = compute.compute(devices, settings)
    for warning in result.warnings:
        print(f"dra-driver: warning: {warning}", file=sys.stderr)
    if output.fmt(args) == output.TABLE:
        print("".join(f"{key}={value}\n" for key, value in result.labels.items()), end="")
    else:
        output.emit(result.labels, output.fmt(args))
    return 0
