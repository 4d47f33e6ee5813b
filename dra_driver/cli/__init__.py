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

# Subcommand modules, in the order `--help` lists them.
COMMANDS = (
    "discover",
    "slices",
    "publish",
    "simulate",
    "demo",
    "kubelet_plugin",
    "device_plugin",
)

Handler = Callable[[argparse.Namespace], int]


def env_default(env: str, default: str | None = None) -> str | None:
    """Default for a flag from its environment twin."""
    return os.environ.get(env, default)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dra-driver",
        description="Kubernetes DRA driver for NVIDIA GPUs (topology-aware).",
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
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"dra_driver.cli.{name}")
        except ModuleNotFoundError as exc:  # DEVELOPMENT-ONLY: removed once all exist
            if exc.name != f"dra_driver.cli.{name}":
                raise
            continue
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logs.configure(level=args.log_level, fmt=args.log_format)
    handler: Handler = args.handler
    try:
        return handler(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
