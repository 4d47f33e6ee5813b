"""The ``dra-driver`` command line: one entry point, one module per subcommand.

Each subcommand module in this package exposes ``register(subparsers)``, which adds its parser
and sets ``handler`` to a function taking the parsed namespace and returning the exit code.
Every flag that matters in a container has an environment twin (``NODE_NAME`` for
``--node-name``, ...), see :func:`env_default`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence

from dra_driver import __version__, logs

# Subcommands, in the order `--help` lists them, with their one-line summaries. A subcommand's
# module is imported only when that subcommand runs (or for `--help`): the node agent's memory
# (RSS is a target) must not carry the simulator, the demo or the in-memory API server.
SUMMARIES = {
    "discover": "list this node's GPUs and their topology",
    "slices": "print the ResourceSlices this node would publish (multi-document YAML)",
    "labels": "print this node's GPU labels (GPU Feature Discovery's names)",
    "publish": "publish this node's ResourceSlices and keep them",
    "simulate": "predict the scheduler's allocation of a ResourceClaim on one node",
    "claim": "print the ResourceClaim to write for N well-connected GPUs",
    "capacity": "how many N-GPU claims the cluster still fits, and how many on optimal sets",
    "demo": "run the whole node pipeline on fake GPUs (no cluster, no GPU needed)",
    "dev-cluster": "a development stand-in cluster: in-memory API server, fake nodes, real agents",
    "kubelet-plugin": "run the node agent: kubelet DRA plugin and slice publisher",
    "device-plugin": "serve nvidia.com/gpu through the kubelet device plugin API",
    "fake-event": "make a fake GPU of a running node agent fail or recover (fake nodes)",
    "nvml-release": "make a running node agent let go of NVML for a driver upgrade (or resume)",
    "doctor": "check what the API server serves and keeps of our slices, and our RBAC",
    "controller": "run the ComputeDomain controller (multi-node NVLink, IMEX)",
    "imex-daemon": "run NVIDIA's IMEX daemon in a ComputeDomain daemon pod, report readiness",
    "completion": "print a bash or zsh completion script (docs/completion.md)",
}

Handler = Callable[[argparse.Namespace], int]


def env_default(env: str, default: str | None = None) -> str | None:
    """Default for a flag from its environment twin."""
    return os.environ.get(env, default)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The full parser for ``argv``: only the chosen subcommand's module is imported."""
    from dra_driver.cli import helptext

    parser = helptext.PlainParser(
        prog="dra-driver",
        description="Kubernetes DRA driver for NVIDIA GPUs (topology-aware).",
        epilog="Exit code 2 with one line on stderr: the command cannot run (bad flags, an "
        "input file or kubeconfig it cannot use, an API server it cannot reach); each "
        "subcommand's --help lists its other codes.",
    )
    parser.add_argument("--version", action="version", version=f"dra-driver {__version__}")
    parser.add_argument(
        "--log-level",
        choices=logs.LEVELS,
        default=env_default("LOG_LEVEL", "info"),
        help="log verbosity (env LOG_LEVEL; default info)",
    )
    parser.add_argument(
        "--log-format",
        choices=("auto", "json", "console"),
        default=env_default("LOG_FORMAT", "auto"),
        help="auto = console on a terminal, JSON otherwise (env LOG_FORMAT)",
    )
    sub = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, parser_class=helptext.PlainParser
    )
    # The first word naming a subcommand is the subcommand (global flags' values never do).
    words = sys.argv[1:] if argv is None else argv
    chosen = next((word for word in words if word in SUMMARIES), None)
    for name, summary in SUMMARIES.items():
        if chosen is None or name == chosen:
            module = importlib.import_module(f"dra_driver.cli.{name.replace('-', '_')}")
            module.register(sub)
        else:  # listed in --help; never parsed (another subcommand was chosen)
            sub.add_parser(name, help=summary)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    logs.configure(level=args.log_level, fmt=args.log_format)
    handler: Handler = args.handler
    try:
        return handler(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
