"""The node agent's ComputeDomain flags (``dra-driver kubelet-plugin --compute-domains``).

Why its own module: they configure the second driver, ``compute-domain.nvidia.com``
(docs/computedomains.md), and keep :mod:`dra_driver.cli.kubelet_plugin` about the GPU driver.
"""

from __future__ import annotations

import argparse

from dra_driver import computedomain as cd
from dra_driver.computedomain.settings import ComputeDomainSettings


def add_flags(parser: argparse.ArgumentParser) -> None:
    from dra_driver.cli import env_default

    parser.add_argument(
        "--compute-domains",
        action="store_true",
        default=env_default("COMPUTE_DOMAINS") == "true",
        help="also serve the DRA driver compute-domain.nvidia.com: IMEX channels for "
        "ComputeDomains on nodes in a multi-node NVLink clique (env COMPUTE_DOMAINS=true)",
    )
    parser.add_argument(
        "--node-ip",
        default=env_default("NODE_IP", ""),
        help="this node's IP, where its IMEX daemon listens (env NODE_IP, from the downward "
        "API's status.hostIP; needed with --compute-domains)",
    )
    parser.add_argument(
        "--imex-port",
        type=int,
        default=env_default("IMEX_PORT", str(cd.DEFAULT_IMEX_PORT)),
        help=f"the IMEX daemons' port (env IMEX_PORT; default {cd.DEFAULT_IMEX_PORT})",
    )
    parser.add_argument(
        "--imex-check-interval",
        type=float,
        default=env_default("IMEX_CHECK_INTERVAL", "1"),
        help="seconds between checks of the IMEX daemons' readiness and nodes configs "
        "(env IMEX_CHECK_INTERVAL)",
    )


def settings_from(args: argparse.Namespace) -> ComputeDomainSettings | None:
    if not args.compute_domains:
        return None
    return ComputeDomainSettings(
        node_ip=args.node_ip,
        imex_port=args.imex_port,
        check_interval_s=max(0.05, args.imex_check_interval),
    )
