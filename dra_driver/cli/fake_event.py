"""``dra-driver fake-event``: make a fake GPU of a running node agent fail (or recover), or
make the fake node's driver go away and come back, or its GPUs vanish and appear
(``--driver-unload``, ``--driver-load [--driver-version V]``, ``--gpu-remove N``, ``--gpu-add``:
docs/lifecycle.md).

Fake nodes (``--fake``) must fail too, so health handling can be shown and tested without GPUs:
this sends the event over the agent's health socket (:mod:`dra_driver.healthcontrol`) and the
agent feeds it to its NVML stand-in, where the agent's health watcher receives it through the same
NVML calls as on a GPU node (docs/health.md). It takes the same directory flags as the agent it
talks to: ``--kubelet-plugins-dir`` / ``--driver-name`` for the DRA kubelet plugin (the default),
``--device-plugin-dir`` for the device plugin. Exit codes: 0 delivered, 1 the agent refused or
cannot be reached, 2 bad flags.
"""

from __future__ import annotations

import argparse
from typing import Any

from dra_driver import cli
from dra_driver.cli import agentflags, common
from dra_driver.devices import healthpolicy


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "fake-event",
        help=cli.SUMMARIES["fake-event"],
        description="Inject a GPU failure (or recovery) into a node agent running on fake GPUs.",
    )
    parser.add_argument(
        "--gpu", type=int, help="GPU index (as `discover` lists); not with the lifecycle flags"
    )
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--xid", type=int, help="an XID error (critical XID event)")
    what.add_argument("--ecc-dbe", action="store_true", help="a double-bit ECC error event")
    what.add_argument("--lost", action="store_true", help="the GPU falls off the bus")
    what.add_argument(
        "--recovered",
        action="store_true",
        help="the GPU was fixed: reset it and send the explicit recovered event",
    )
    what.add_argument(
        "--reset", action="store_true", help="reset the GPU only (the agent observes it)"
    )
    for name, text in (
        ("pages-pending", "pages pending retirement (Volta, Turing)"),
        ("remap-pending", "row remapping pending (Ampere and newer)"),
        ("remap-failure", "row remapping failed (Ampere and newer)"),
        ("fabric-degraded", "the multi-node NVLink fabric route is unhealthy"),
    ):
        what.add_argument(f"--{name}", action="store_true", help=text)
    # The driver and GPUs themselves (docs/lifecycle.md): the node, not one GPU's health.
    what.add_argument(
        "--driver-unload",
        nargs="?",
        const="not-loaded",
        choices=["not-loaded", "uninitialized", "mismatch", "gpu-lost"],
        metavar="MODE",
        help="the NVIDIA driver goes away (an upgrade); MODE: the NVML error its calls raise "
        "(not-loaded, uninitialized, mismatch, gpu-lost; default not-loaded)",
    )
    what.add_argument(
        "--driver-load", action="store_true", help="the NVIDIA driver is loaded again"
    )
    parser.add_argument(
        "--rmmod",
        action="store_true",
        help="with --driver-unload: unload as `rmmod nvidia` does, refused while the agent "
        "holds NVML (release it first: `dra-driver nvml-release`)",
    )
    what.add_argument(
        "--gpu-remove", type=int, metavar="N", help="GPU index N falls off the bus for good"
    )
    what.add_argument(
        "--gpu-add",
        nargs="?",
        const=-1,
        type=int,
        metavar="LIKE",
        help="a GPU is hot-added (a copy of GPU index LIKE, default the last one)",
    )
    what.add_argument(
        "--mig-destroy",
        metavar="N:GI",
        help="GPU instance GI of GPU index N is destroyed behind the driver's back",
    )
    parser.add_argument(
        "--driver-version", help="with --driver-load: the new driver version (an upgrade)"
    )
    parser.add_argument(
        "--action",
        choices=[a for a in healthpolicy.RECOVERY_ACTIONS.values() if a != "none"],
        help="with --xid: the recovery action the driver reports (NVML's recovery-action field)",
    )
    parser.add_argument(
        "--mig",
        metavar="GI:CI",
        help="with --xid / --ecc-dbe: address one MIG device by GPU and compute instance id",
    )
    agentflags.add(parser, explicit_only=False)
    parser.set_defaults(handler=run)


def request_from(args: argparse.Namespace) -> dict[str, Any]:
    """The inject request the flags describe; raises UsageError."""
    lifecycle = _lifecycle(args)
    if lifecycle is not None:
        return lifecycle
    if args.driver_version:
        raise common.UsageError("--driver-version goes with --driver-load")
    if args.rmmod:
        raise common.UsageError("--rmmod goes with --driver-unload")
    if args.gpu is None:
        raise common.UsageError("--gpu is required for a GPU health event")
    req: dict[str, Any] = {"op": "inject", "gpu": args.gpu}
    if args.xid is not None:
        req.update(event="xid", xid=args.xid)
        if args.action:
            req["action"] = args.action
    else:
        if args.action:
            raise common.UsageError("--action goes with --xid")
        for name in (
            "ecc_dbe",
            "lost",
            "recovered",
            "reset",
            "pages_pending",
            "remap_pending",
            "remap_failure",
            "fabric_degraded",
        ):
            if getattr(args, name):
                req["event"] = name.replace("_", "-")
    if args.mig:
        if req["event"] not in ("xid", "ecc-dbe"):
            raise common.UsageError("--mig goes with --xid or --ecc-dbe")
        try:
            gi, ci = (int(p) for p in args.mig.split(":"))
        except ValueError:
            raise common.UsageError(f"--mig {args.mig!r}: expected GI:CI, e.g. 1:0") from None
        req.update(gpuInstance=gi, computeInstance=ci)
    return req


def _lifecycle(args: argparse.Namespace) -> dict[str, Any] | None:
    """The lifecycle request (driver unload/load, GPU remove/add), None for a health event."""
    req: dict[str, Any] = {"op": "lifecycle"}
    if args.driver_unload:
        req.update(action="driver-unload", mode=args.driver_unload)
        if args.rmmod:
            req["rmmod"] = True
    elif args.driver_load:
        req["action"] = "driver-load"
        if args.driver_version:
            req["driverVersion"] = args.driver_version
    elif args.gpu_remove is not None:
        req.update(action="gpu-remove", gpu=args.gpu_remove)
    elif args.mig_destroy:
        try:
            gpu, gi = (int(p) for p in args.mig_destroy.split(":"))
        except ValueError:
            raise common.UsageError(
                f"--mig-destroy {args.mig_destroy!r}: expected N:GI, e.g. 0:1"
            ) from None
        req.update(action="mig-destroy", gpu=gpu, gpuInstance=gi)
    elif args.gpu_add is not None:
        req["action"] = "gpu-add"
        if args.gpu_add >= 0:
            req["like"] = args.gpu_add
    else:
        return None
    if args.gpu is not None:
        raise common.UsageError("--gpu goes with the GPU health events, not the lifecycle flags")
    if args.rmmod and req["action"] != "driver-unload":
        raise common.UsageError("--rmmod goes with --driver-unload")
    if args.driver_version and req["action"] != "driver-load":
        raise common.UsageError("--driver-version goes with --driver-load")
    if args.action or args.mig:
        raise common.UsageError("--action and --mig go with --xid or --ecc-dbe")
    return req


def run(args: argparse.Namespace) -> int:
    try:
        req = request_from(args)
    except common.UsageError as exc:
        return common.fail(str(exc))
    return agentflags.send_each(args, req)
