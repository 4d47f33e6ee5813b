"""``dra-driver capacity``: how many N-GPU claims the fleet still fits, and how many of them well.

Per claim size (1, 2, 4, 8 and the ``--sizes`` asked) it prints how many claims for N GPUs of
one node fit now, summed over the nodes; how many of them get a set as well connected as the
best N-set of their node when empty; the nodes that fit the largest size; and the GPUs stranded
(free, in no set of the sizes above 1). ``--by-node`` adds a line per node, ``-o json`` prints
the same for scripts. The ResourceSlices and allocated ResourceClaims come from the cluster
(``--kubeconfig``, else kubectl's defaults: ``KUBECONFIG``, ``~/.kube/config``, the in-cluster
account) or from files (``--slices``, ``--allocated``).
Bad input is one error line, exit 2. Definitions: docs/capacity.md.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from dra_driver import cli, inputfile
from dra_driver.allocation import allocatedcheck, documents, fleetnodes, setfit
from dra_driver.cli import bulkgc, common, output, progress
from dra_driver.slices import build as slices_build

SHOWN_NODES = 12  # nodes named per line in the text output (-o json names all)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "capacity",
        help=cli.SUMMARIES["capacity"],
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    common.add_kubeconfig(parser)
    parser.add_argument(
        "--slices",
        metavar="SLICES.yaml",
        type=inputfile.path,
        action="append",
        help="ResourceSlices from a file instead of the cluster (repeatable; YAML or JSON, "
        "e.g. kubectl get resourceslices -o json)",
    )
    parser.add_argument(
        "--allocated",
        metavar="ALLOCATED.yaml",
        type=inputfile.path,
        action="append",
        default=[],
        help="with --slices: ResourceClaims (with status.allocation) or allocation results "
        "whose devices are in use (repeatable)",
    )
    parser.add_argument(
        "--sizes",
        metavar="N[,N...]",
        action="append",
        default=[],
        help="claim sizes in GPUs to answer for besides 1, 2, 4 and 8 (repeatable)",
    )
    parser.add_argument("--by-node", action="store_true", help="also answer per node")
    output.add_flag(parser, aliases=("text",))
    progress.add_flag(parser)
    parser.add_argument(
        "--driver-name",
        default=slices_build.DEFAULT_DRIVER_NAME,
        help="the driver whose pools are counted (default %(default)s)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    with bulkgc.paused():  # millions of acyclic objects from the input (cli/bulkgc.py)
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    shown = progress.Progress.of(args, "capacity")
    try:
        sizes = setfit.parse_sizes(args.sizes)
        shown.say("reading the ResourceSlices and claims")
        slices, allocated = _from_files(args) if args.slices else _from_cluster(args)
        step = (lambda done, total: shown.step(done, total, "nodes")) if shown.enabled else None
        nodes = fleetnodes.read(slices, allocated, driver_name=args.driver_name, progress=step)
        if getattr(args, "no_results", None):
            raise documents.SimulateError(args.no_results[0])
    except (
        setfit.SizeError,
        fleetnodes.InputError,
        documents.SimulateError,
        common.UsageError,
    ) as err:
        shown.close()
        return common.fail("; ".join(ln.strip() for ln in str(err).splitlines() if ln.strip()))
    shown.say(f"answering for {len(nodes):,} nodes")
    result = setfit.fleet(nodes, sizes)
    shown.close()
    answer = setfit.report(result, by_node=args.by_node)
    if output.fmt(args) != output.TABLE:
        output.emit(answer, output.fmt(args))
    else:
        print(render(answer), end="")
    return 0


def _from_files(args: argparse.Namespace) -> tuple[list[Any], list[Any]]:
    slices: list[Any] = []
    for path in args.slices:
        kinds = documents.split_kinds(documents.load_file(path), source=str(path))
        if not kinds["slices"]:
            raise documents.SimulateError(f"{path}: no ResourceSlice in it")
        slices += kinds["slices"]
    allocated: list[Any] = []
    args.no_results = []
    for path in args.allocated:
        docs = documents.load_file(path)
        try:  # simulate --allocated's rule: a file with no allocation result is a mistake
            allocatedcheck.entries(docs, source=str(path))
        except allocatedcheck.AllocatedError as err:
            args.no_results.append(str(err))  # said after a malformed result, more precise
        allocated += docs
    return slices, allocated


def _from_cluster(args: argparse.Namespace) -> tuple[list[Any], list[Any]]:
    """Every ResourceSlice and ResourceClaim of the cluster (two LIST calls)."""
    if args.allocated:
        raise common.UsageError("--allocated needs --slices (the cluster's claims are read)")
    from dra_driver.kube import api, client, objectclient, objects

    slices_kind = objects.Kind(
        "resource.k8s.io", "v1", "resourceslices", "ResourceSlice", namespaced=False
    )
    claims_kind = objects.Kind("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim")
    try:
        kube = client.KubeClient.connect(args.kubeconfig, context=args.context)
    except client.ConfigError as err:
        raise common.UsageError(str(err)) from err
    try:
        reader = objectclient.ObjectClient(kube)
        slices, _ = reader.list(slices_kind)
        claims, _ = reader.list(claims_kind)
    except api.ApiError as err:
        raise common.UsageError(f"cannot list ResourceSlices and ResourceClaims: {err}") from err
    finally:
        kube.close()
    return slices, claims


def render(answer: dict[str, Any]) -> str:
    """The text answer."""
    gpus = answer["gpus"]
    lines = [
        f"{answer['nodes']} nodes, {gpus['total']} GPUs: {gpus['free']} free, "
        f"{gpus['held']} held by claims, {gpus['unhealthy']} unhealthy",
        "",
        f"{'GPUs per claim':>14}  {'claims that fit':>15}  {'on an optimal set':>17}  "
        f"{'nodes with room':>15}",
    ]
    for size, row in answer["sizes"].items():
        lines.append(f"{size:>14}  {row['fit']:>15}  {row['optimal']:>17}  {row['nodes']:>15}")
    largest = answer["largest"]
    lines += ["", f"nodes that fit {largest['size']} GPUs: {_names(largest['nodes'])}"]
    stranded = answer["stranded"]
    multi = [s for s in answer["sizes"] if int(s) > 1]
    lines.append(
        f"stranded GPUs (free, in no set of {_or(multi)} GPUs): {stranded['gpus']}"
        + (f" on {_names(stranded['nodes'])}" if stranded["nodes"] else "")
    )
    for unknown in answer["unknown"]:
        lines.append(f"unknown: {unknown['what']} ({_names(unknown['nodes'])})")
    if "byNode" in answer:
        lines += ["", _by_node(answer["byNode"], list(answer["sizes"]))]
    return "\n".join(lines) + "\n"


def _by_node(rows: dict[str, Any], sizes: Sequence[str]) -> str:
    width = max([4, *(len(n) for n in rows)])
    head = f"{'node':<{width}}  {'GPUs':>4}  {'free':>4}  {'held':>4}  {'unhealthy':>9}  "
    head += "  ".join(f"{'fit/opt ' + s:>10}" for s in sizes) + "  stranded  product"
    out = [head]
    for name, row in rows.items():
        cells = "  ".join(
            f"{row['sizes'][s]['fit']:>4}/{_opt(row['sizes'][s]['optimal']):<5}" for s in sizes
        )
        line = (
            f"{name:<{width}}  {row['gpus']:>4}  {row['free']:>4}  {row['held']:>4}  "
            f"{row['unhealthy']:>9}  {cells}  {row['stranded']:>8}  {row['product']}"
        )
        if "problem" in row:
            line += f"  ({row['problem']})"
        out.append(line.rstrip())
    return "\n".join(out)


def _opt(value: int | None) -> str:
    return "?" if value is None else str(value)


def _names(names: Sequence[str]) -> str:
    if not names:
        return "none"
    shown = ", ".join(names[:SHOWN_NODES])
    more = len(names) - SHOWN_NODES
    return f"{len(names)} node{'s' if len(names) != 1 else ''}: {shown}" + (
        f" and {more} more" if more > 0 else ""
    )


def _or(sizes: Sequence[str]) -> str:
    if not sizes:
        return "any size above 1"
    return sizes[0] if len(sizes) == 1 else ", ".join(sizes[:-1]) + " or " + sizes[-1]
