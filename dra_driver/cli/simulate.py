"""``dra-driver simulate``: would this claim fit on this node, on which GPUs, and if not, why?

A pod stuck Pending on a ResourceClaim is DRA's most common support question. This command
answers it without a cluster: it replays kube-scheduler's own search and prints the allocation
the scheduler would write, in the shape of ``status.allocation`` (exit 0), or an explanation per
request and device (exit 1). ``--explain`` adds the best placement the node has for as many
GPUs, the gap to it, and for a claim that is not topology-optimal the claim ``dra-driver
claim`` writes instead. Bad input is one error line, exit 2.

Devices come from ``--slices`` (exported ResourceSlices), a fake profile (``--fake``,
``--fake-file``), ResourceSlices inside the claim file, or else this node's real GPUs. Slices
built from a profile are those the node agent publishes once it has prepared the ``--allocated``
claims: their GPUs carry no set ranks (exported slices show whatever ranks were published).
"""

from __future__ import annotations

import argparse
import difflib
import os
import socket
import sys
from typing import Any

from dra_driver import cli, inputfile
from dra_driver.allocation import allocatedcheck, capacity, simulator
from dra_driver.cli import bulkgc, common, output, progress
from dra_driver.devices import backend, model, passthrough
from dra_driver.devices.fake import profiles
from dra_driver.slices import build as slices_build


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "simulate",
        help=cli.SUMMARIES["simulate"],
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    parser.add_argument(
        "claim",
        metavar="CLAIM.yaml",
        type=inputfile.path,
        help="ResourceClaim or ResourceClaimTemplate (a Pod and DeviceClasses "
        "in the same file are fine; several claims are allocated in order)",
    )
    parser.add_argument(
        "--class",
        dest="classes",
        metavar="CLASS.yaml",
        type=inputfile.path,
        action="append",
        default=[],
        help="DeviceClass file (repeatable); the built-in classes are known",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--fake",
        metavar="PROFILE",
        help=f"devices of a fake profile ({', '.join(profiles.builtin_names())})",
    )
    source.add_argument(
        "--fake-file",
        metavar="FILE",
        type=inputfile.path,
        help="devices of a fake profile file (docs/profiles.md)",
    )
    source.add_argument(
        "--slices",
        metavar="SLICES.yaml",
        type=inputfile.path,
        action="append",
        help="ResourceSlices to allocate from (repeatable)",
    )
    parser.add_argument(
        "--allocated",
        metavar="ALLOCATED.yaml",
        type=inputfile.path,
        action="append",
        default=[],
        help="devices in use (repeatable): " + allocatedcheck.FORMAT + "; an entry that "
        "matches no device of the slices is a warning, no match at all an error (exit 2)",
    )
    parser.add_argument(
        "--shareable",
        metavar="none|all|REGEX",
        default="none",
        help="with a profile: publish these GPUs as shareable, as the node agent's --shareable "
        "does (default none)",
    )
    parser.add_argument(
        "--explain",
        action="store_true",
        help="also print the optimum, the gap to it and, for a claim that is not "
        "topology-optimal, the claim `dra-driver claim` would write instead",
    )
    parser.add_argument(
        "--driver-name",
        default=slices_build.DEFAULT_DRIVER_NAME,
        help="driver name for slices built from a profile (default %(default)s)",
    )
    common.add_dynamic_mig_flag(parser)
    common.add_passthrough_flag(parser)
    parser.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME"),
        help="node to allocate on (env NODE_NAME; default: the slices' node, "
        "'fake-node' with a profile, else this host's name)",
    )
    output.add_flag(parser)
    progress.add_flag(parser)
    parser.set_defaults(handler=run)


def _devices(args: argparse.Namespace) -> model.NodeDevices:
    try:
        return common.make_backend(args).discover()
    except (common.UsageError, backend.DiscoveryError) as err:
        raise simulator.SimulateError(str(err)) from err


def gather(args: argparse.Namespace) -> simulator.Inputs:
    """Read every input the flags name; raises :class:`simulator.SimulateError`."""
    main = simulator.split_kinds(simulator.load_file(args.claim), source=str(args.claim))
    if not main["claims"]:
        raise simulator.SimulateError(
            f"{args.claim}: no ResourceClaim or ResourceClaimTemplate in it"
        )
    user_classes = list(main["classes"])
    for path in args.classes:
        kinds = simulator.split_kinds(simulator.load_file(path), source=str(path))
        if not kinds["classes"]:
            raise simulator.SimulateError(f"{path}: no DeviceClass in it")
        user_classes += kinds["classes"]
    classes = simulator.merge_classes(
        simulator.builtin_classes(driver_name=args.driver_name), user_classes
    )
    unknown_class(main["claims"], classes)
    allocated: set[tuple[str, str, str]] = set()
    consumed = capacity.Ledger()
    entries: dict[str, list[tuple[str, str, str]]] = {}
    for path in args.allocated:
        docs = simulator.load_file(path)
        allocated |= simulator.allocated_from(docs, source=str(path))
        try:
            entries[str(path)] = allocatedcheck.entries(docs, source=str(path))
        except allocatedcheck.AllocatedError as err:
            raise simulator.SimulateError(str(err)) from err
        for device, used in simulator.consumed_from(docs, source=str(path)).used.items():
            consumed.add(device, used)

    node_devices = None
    slices = list(main["slices"])
    for path in args.slices or ():
        kinds = simulator.split_kinds(simulator.load_file(path), source=str(path))
        if not kinds["slices"]:
            raise simulator.SimulateError(f"{path}: no ResourceSlice in it")
        slices += kinds["slices"]
    node_name = args.node_name
    if args.fake or args.fake_file or not slices:
        node_devices = _devices(args)
        try:  # GPUs offered to VMs too: their passthrough devices and counters
            node_devices = passthrough.mark(node_devices, common.passthrough_from(args))
        except common.UsageError as err:
            raise simulator.SimulateError(str(err)) from err
        default = "fake-node" if args.fake or args.fake_file else socket.gethostname()
        node_name = node_name or default
        try:
            shareable = common.shareable_from(args)
            dynamic = common.dynamic_mig(args)
        except common.UsageError as err:
            raise simulator.SimulateError(str(err)) from err
        slices = simulator.fake_slices(
            node_devices,
            node_name=node_name,
            driver_name=args.driver_name,
            dynamic_mig=dynamic,
            shareable=shareable,
            allocated=allocated,
        )
    elif node_name is None:
        node_name = simulator.slice_node(slices)
        if node_name is None:
            raise simulator.SimulateError(
                "the ResourceSlices are for several nodes (or none "
                "names one); choose one with --node-name"
            )
    try:
        for warning in allocatedcheck.check(entries, slices):
            print(f"dra-driver: warning: {warning}", file=sys.stderr)
    except allocatedcheck.AllocatedError as err:
        raise simulator.SimulateError(str(err)) from err
    return simulator.Inputs(
        claims=main["claims"],
        classes=classes,
        slices=slices,
        node_name=node_name,
        allocated=allocated,
        node_devices=node_devices,
        consumed=consumed,
    )


def unknown_class(claims: list[dict[str, Any]], classes: list[dict[str, Any]]) -> None:
    """A request naming a DeviceClass that neither the built-in classes nor ``--class`` define
    is a typo far more often than a class the cluster has: an input error naming the closest
    known class, not "does not fit" (kube-scheduler would wait for the class forever)."""
    known = [str((c.get("metadata") or {}).get("name")) for c in classes]
    for claim in claims:
        spec = claim.get("spec") or {}
        if claim.get("kind") == "ResourceClaimTemplate":
            spec = spec.get("spec") or {}
        requests = (spec.get("devices") or {}).get("requests") or []
        for request in requests if isinstance(requests, list) else []:
            if not isinstance(request, dict):
                continue
            exactly = request.get("exactly") or {}
            subs = request.get("firstAvailable") or []
            for sub in [exactly, *(subs if isinstance(subs, list) else [])]:
                name = sub.get("deviceClassName") if isinstance(sub, dict) else None
                if not isinstance(name, str) or not name or name in known:
                    continue
                close = difflib.get_close_matches(name, known, n=1)
                hint = f"did you mean {close[0]}? " if close else ""
                claim_name = (claim.get("metadata") or {}).get("name") or "?"
                raise simulator.SimulateError(
                    f"{claim.get('kind')} {claim_name} request {request.get('name')}: unknown "
                    f"DeviceClass {name!r} ({hint}known: {', '.join(sorted(known))}; "
                    "give another class's file with --class)"
                )


def run(args: argparse.Namespace) -> int:
    with bulkgc.paused():  # millions of acyclic objects from the input (cli/bulkgc.py)
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    shown = progress.Progress.of(args, "simulate")
    try:
        shown.say(f"reading {args.claim}")
        inputs = gather(args)
        step = (lambda done, total: shown.step(done, total, "claims")) if shown.enabled else None
        if args.explain:
            results = simulator.run_explained(inputs, progress=step)
        else:
            results = [(o, None) for o in simulator.run(inputs, progress=step)]
    except simulator.SimulateError as err:
        shown.close()
        return common.fail(one_line(str(err)))
    shown.close()
    if output.fmt(args) != output.TABLE:
        output.emit(document(inputs.node_name, [o for o, _ in results]), output.fmt(args))
        return 0 if all(o.allocated for o, _ in results) else 1
    names = simulator.gpu_names(inputs)
    texts = [
        simulator.render(o, node_name=inputs.node_name, insight=i, names=names) for o, i in results
    ]
    print("---\n".join(texts), end="")
    return 0 if all(o.allocated for o, _ in results) else 1


def document(node_name: str, outcomes: list[Any]) -> dict[str, Any]:
    """What ``-o json|yaml`` prints (docs/cli-output.md): per claim, in input order, the
    ``status.allocation`` the scheduler would write, or why not."""
    claims = []
    for o in outcomes:
        links, numa, root = o.score if o.score is not None else (None, None, None)
        claims.append(
            {
                "name": o.claim_name,
                "allocated": o.allocated,
                "allocation": dict(o.allocation) if o.allocation is not None else None,
                "gpus": list(o.gpus),
                "placement": None
                if o.score is None
                else {"nvlinks": links, "numaPairs": numa, "pcieRootPairs": root},
                "explanation": list(o.explanation),
                "notes": list(o.notes),
            }
        )
    return {"node": node_name, "claims": claims}


def one_line(message: str) -> str:
    """CEL compile errors carry a source excerpt with a caret line; keep just the text."""
    lines = [ln.strip() for ln in message.splitlines() if not ln.lstrip().startswith("|")]
    return "; ".join(ln for ln in lines if ln)
