"""``dra-driver claim``: print the ResourceClaim to write for N well-connected GPUs.

kube-scheduler takes the first devices that fit, so the claim's shape decides what a pod gets.
The claim printed here gets the N GPUs with the most NVLink links free on whatever node it lands
on (``--nvlink best``, the default), N GPUs sharing an NVLink island (``island``) or any N GPUs
(``any``). One claim serves a cluster of mixed machines; it uses only the DeviceClasses the
driver ships. ``--template`` prints a ResourceClaimTemplate (one claim per pod).
"""

from __future__ import annotations

import argparse
import json

import yaml

from dra_driver import cli
from dra_driver.allocation import claimgen
from dra_driver.cli import common


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "claim",
        help=cli.SUMMARIES["claim"],
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    parser.add_argument("--gpus", type=int, required=True, metavar="N", help="number of GPUs")
    parser.add_argument(
        "--nvlink",
        choices=claimgen.MODES,
        default="best",
        help="best: the best-connected N GPUs free on the node (default); island: N GPUs on "
        "one NVLink island; any: any N GPUs",
    )
    parser.add_argument(
        "--template", action="store_true", help="print a ResourceClaimTemplate instead"
    )
    parser.add_argument("--name", help="object name (default gpus-<N>, plus -<mode> if not best)")
    parser.add_argument("--namespace", help="object namespace (default: none, kubectl's)")
    parser.add_argument(
        "--driver-name",
        default=claimgen.DEFAULT_DRIVER_NAME,
        help="driver whose attributes the selectors name (default %(default)s)",
    )
    parser.add_argument(
        "--without-ranked-class",
        action="store_true",
        help=f"for clusters without the {claimgen.RANKED_CLASS} DeviceClass (chart "
        "deviceClasses.gpuRanked=false): the rank alternatives use the GPU class instead "
        "(same picks, more scheduler work)",
    )
    parser.add_argument("--output", "-o", choices=("yaml", "json"), default="yaml")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    try:
        obj = claimgen.claim(
            args.gpus,
            nvlink=args.nvlink,
            template=args.template,
            name=args.name,
            namespace=args.namespace,
            driver_name=args.driver_name,
            ranked_class=None if args.without_ranked_class else claimgen.RANKED_CLASS,
        )
    except claimgen.ClaimGenError as err:
        return common.fail(str(err))
    if args.output == "json":
        print(json.dumps(obj, indent=2))
    else:
        print(yaml.safe_dump(obj, sort_keys=False, width=120), end="")
    return 0
