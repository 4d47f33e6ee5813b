"""Flags of the node agents' GPU labels (``--node-labels``, ``--node-labels-resync``).

Shared by ``kubelet-plugin`` and ``device-plugin`` so both spell them, and their environment
twins (``NODE_LABELS``, ``NODE_LABELS_RESYNC``), the same way. The device plugin, which needs no
API server otherwise, also gets ``--node-name`` here.
"""

from __future__ import annotations

import argparse

_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def parse_bool(value: str) -> bool:
    """``true``/``false`` (and 1/0, yes/no, on/off), as flags and environment values."""
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"{value!r} is not true or false")


def positive_seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"{value!r} must be more than 0 seconds")
    return seconds


def add_flags(parser: argparse.ArgumentParser, *, api_access: bool = False) -> None:
    """The label flags; ``api_access`` adds ``--node-name`` (the caller adds ``--kubeconfig``
    and ``--context``: :func:`dra_driver.cli.common.add_kubeconfig`)."""
    from dra_driver.cli import env_default

    parser.add_argument(
        "--node-labels",
        type=parse_bool,
        nargs="?",
        const="true",
        default=env_default("NODE_LABELS", "true"),
        metavar="true|false",
        help="keep this node's GPU labels (nvidia.com/gpu.product, ...; docs/labels.md) on its "
        "Node object (env NODE_LABELS; default true"
        + (", when --node-name is given)" if api_access else ")"),
    )
    parser.add_argument(
        "--node-labels-resync",
        type=positive_seconds,
        default=env_default("NODE_LABELS_RESYNC", "60"),
        metavar="SECONDS",
        help="seconds between checks that the Node still carries our labels (env "
        "NODE_LABELS_RESYNC; default 60)",
    )
    if api_access:
        parser.add_argument(
            "--node-name",
            default=env_default("NODE_NAME"),
            help="this node's name, for its labels (env NODE_NAME; unset = no labels)",
        )
