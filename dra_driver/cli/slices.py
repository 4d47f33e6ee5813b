"""``dra-driver slices``: print the ResourceSlices this node would publish.

Lets an operator see exactly what the scheduler will be told about a node — device names,
attributes, topology, how the pool is split — before anything is sent, and apply it by hand
(``dra-driver slices --node-name n1 --fake dgx-h100 | kubectl apply -f -``). Output is
deterministic: the same hardware gives byte-identical YAML. Standard error gets the warnings
and one line per node saying what it publishes (:func:`summaries`), e.g.
``node n1: 8 devices in 1 ResourceSlice (8 GPUs; set ranks for 1-7 GPUs)``. With
``--kubeconfig`` the slices are those the agent would publish to that API server: it is asked
(a dry-run probe, nothing stored) which gated fields it keeps, what it would drop is left out,
and an explicit ``--dynamic-mig``/``--shareable`` it cannot honour is refused (exit 2); an
``auto:`` one is off there (its GPUs printed as plain full GPUs, one stderr line says so).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from dra_driver import cli
from dra_driver.cli import common
from dra_driver.devices import backend, passthrough
from dra_driver.kube import client, features
from dra_driver.slices import build, gpusets, serverfeatures, vfioslices


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
    parser = sub.add_parser(
        "slices",
        help=cli.SUMMARIES["slices"],
        epilog="Exit 0: printed. Exit 2, one line on stderr: bad flags or input, an API server "
        "it cannot ask, or an explicit --dynamic-mig/--shareable whose fields that server "
        "drops.",
    )
    add_identity_flags(parser)
    common.add_backend_flags(parser)
    common.add_shareable_flag(parser)
    parser.add_argument(
        "--node-uid",
        default=None,
        help="UID of the Node object, to include the owner reference the publisher sets",
    )
    common.add_dynamic_mig_flag(parser)
    common.add_passthrough_flag(parser)
    common.add_gpu_sets_flag(parser)
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        default=None,
        help="print what the agent would publish to this cluster's API server: ask it (dry-run, "
        "nothing stored) which gated fields it keeps and leave out what it would drop",
    )
    parser.add_argument(
        "--context",
        default=None,
        help="as --kubeconfig, with this context of the kubeconfig kubectl would read "
        "(--kubeconfig, else KUBECONFIG, else ~/.kube/config)",
    )
    parser.add_argument("--output", "-o", choices=("yaml", "json"), default="yaml")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if not args.node_name:
        return common.fail("--node-name (or env NODE_NAME) is required")
    try:
        dynamic = common.dynamic_mig(args)
        shareable = common.shareable_from(args)
        devices = common.make_backend(args).discover()
        kept = serverfeatures.ALL_KEPT
        if args.kubeconfig or args.context:
            kept = _server_keeps(args)
            refused = serverfeatures.refusal(
                kept, gpus=devices.gpus, dynamic_mig=dynamic, shareable=shareable
            )
            if refused:
                return common.fail(refused, code=2)
            for feature, flag in serverfeatures.auto_flags(
                dynamic_mig=dynamic, shareable=shareable
            ).items():
                if not kept.keeps(feature):
                    effect = serverfeatures.AUTO_EFFECTS[feature].format(flag=flag)
                    print(f"dra-driver: {effect}", file=sys.stderr)
        # As the agent starts: an auto: selection the server cannot take is off.
        dynamic, shareable = serverfeatures.resolve(kept, dynamic_mig=dynamic, shareable=shareable)
        vfio = common.passthrough_from(args)
        refused = vfioslices.refusal(kept.shared_counters, devices, vfio)
        if refused:
            return common.fail(refused, code=1)
        devices = passthrough.mark(devices, vfioslices.resolve(kept.shared_counters, vfio))
        result = build.build(
            devices,
            node_name=args.node_name,
            driver_name=args.driver_name,
            node_uid=args.node_uid,
            dynamic_mig=dynamic,
            shareable=shareable,
            gpu_sets=common.gpu_sets_from(args),
            decorate=serverfeatures.withdrawer(kept),
        )
    except (common.UsageError, backend.DiscoveryError, build.BuildError) as exc:
        return common.fail(str(exc))
    except (client.ConfigError, features.ProbeError) as exc:
        return common.fail(str(exc), code=2)
    for problem in result.problems:
        print(f"dra-driver: warning: {problem}", file=sys.stderr)
    for line in summaries(result.slices):
        print(line, file=sys.stderr)
    print(render(result.slices, args.output), end="")
    return 0


def _server_keeps(args: argparse.Namespace) -> serverfeatures.Kept:
    """Ask the API server of ``--kubeconfig`` (or ``--context``) which gated fields it keeps
    (one stderr line)."""
    kube = client.KubeClient.connect(args.kubeconfig, context=args.context)
    try:
        found = features.probe(kube, args.node_name, args.driver_name)
    finally:
        kube.close()
    kept = serverfeatures.Kept.of(found)
    dropped = ", ".join(kept.dropped) or "none"
    print(
        f"API server {kube.server} ({found.server_version}): drops the fields of {dropped}",
        file=sys.stderr,
    )
    return kept


def render(slices: list[build.Obj], output: str = "yaml") -> str:
    """Multi-document YAML (``kubectl apply -f -`` ready) or a JSON ``List``."""
    if output == "json":
        doc = {"apiVersion": "v1", "kind": "List", "items": slices}
        return json.dumps(doc, indent=2) + "\n"
    return yaml.safe_dump_all(slices, sort_keys=False, explicit_start=True)


def summaries(slices: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per node (in the order of its first slice): how many devices it publishes, in
    how many ResourceSlices, and of which kinds — GPUs (shareable ones), MIG devices, dynamic
    MIG placements, the set sizes its GPUs are ranked for, counter sets."""
    by_node: dict[str, list[Mapping[str, Any]]] = {}
    for obj in slices:
        spec = obj.get("spec") or {}
        node = spec.get("nodeName") or (spec.get("pool") or {}).get("name") or "?"
        by_node.setdefault(str(node), []).append(obj)
    return [_summary(node, objs) for node, objs in by_node.items()]


def _summary(node: str, slices: Sequence[Mapping[str, Any]]) -> str:
    specs = [obj.get("spec") or {} for obj in slices]
    devices = [d for spec in specs for d in spec.get("devices") or ()]
    counter_sets = sum(len(spec.get("sharedCounters") or ()) for spec in specs)
    gpus = [d for d in devices if _type(d) == "gpu"]
    migs = [d for d in devices if _type(d) == "mig"]
    placements = sum(  # dynamic: no instance yet (a MIG set's counters, not passthrough's)
        any(str(u.get("counterSet", "")).endswith("-mig") for u in d.get("consumesCounters") or ())
        for d in migs
    )
    vfio = sum(_type(d) == "vfio" for d in devices)
    shareable = sum(bool(d.get("allowMultipleAllocations")) for d in gpus)
    kinds: list[str] = []
    if gpus:
        kinds.append(_count(len(gpus), "GPU") + (f", {shareable} shareable" if shareable else ""))
    if len(migs) > placements:
        kinds.append(_count(len(migs) - placements, "MIG device"))
    if placements:
        kinds.append(_count(placements, "dynamic MIG placement"))
    if vfio:
        kinds.append(_count(vfio, "passthrough device"))
    others = len(devices) - len(gpus) - len(migs) - vfio
    if others:
        kinds.append(_count(others, "other device"))
    parts = [", ".join(kinds)] if kinds else []
    sizes = _rank_sizes(gpus)
    if sizes:
        span = str(sizes[0]) if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]}"
        parts.append(f"set ranks for {span} GPUs")
    elif gpus:
        parts.append("no set ranks")
    if counter_sets:
        parts.append(_count(counter_sets, "counter set"))
    detail = f" ({'; '.join(parts)})" if parts else ""
    return (
        f"node {node}: {_count(len(devices), 'device')} in "
        f"{_count(len(slices), 'ResourceSlice')}{detail}"
    )


def _rank_sizes(gpus: Sequence[Mapping[str, Any]]) -> list[int]:
    """The set sizes the GPUs' ``setRanks`` attributes rank, ascending: 1 up to the number of
    GPUs carrying one, minus one (the agent ranks every size its full GPUs can form)."""
    ranked = sum(gpusets.PACKED_ATTRIBUTE in (d.get("attributes") or {}) for d in gpus)
    return list(range(1, min(ranked, gpusets.MAX_SIZE + 1)))


def _type(device: Mapping[str, Any]) -> str | None:
    value = ((device.get("attributes") or {}).get("type") or {}).get("string")
    return value if isinstance(value, str) else None


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")
