"""The node agent's flags for where MPS control daemons run (``--mps-daemon-image`` and kin).

Why its own module: they choose the daemon runner (docs/sharing.md) — Pods of their own, which
survive agent upgrades (the chart's default), or processes of the agent — and keep
:mod:`dra_driver.cli.kubelet_plugin` short. Every flag has its environment twin.
"""

from __future__ import annotations

import argparse
from typing import Any

from dra_driver.cli import common


def add_flags(parser: argparse.ArgumentParser) -> None:
    from dra_driver.cli import env_default

    parser.add_argument(
        "--mps-daemon-image",
        default=env_default("MPS_DAEMON_IMAGE", ""),
        help="run each MPS control daemon in a Pod of its own on this node, with this image "
        "(the chart sets the agent's own), in --pod-namespace: shared GPUs then survive "
        "upgrades and restarts of the agent. Empty: the daemons are processes of the agent "
        "and end with its container (env MPS_DAEMON_IMAGE)",
    )
    parser.add_argument(
        "--pod-namespace",
        "--namespace",
        "-n",
        dest="pod_namespace",
        default=env_default("POD_NAMESPACE", ""),
        help="the agent's namespace, where the MPS daemon Pods are created (env POD_NAMESPACE, "
        "from the downward API; needed with --mps-daemon-image)",
    )
    # Test seam, not for operators: how long a daemon Pod may take to be Ready.
    parser.add_argument("--mps-ready-timeout", type=float, default=30.0, help=argparse.SUPPRESS)


def settings_from(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`~dra_driver.pluginsettings.PluginSettings` fields these flags set."""
    image = (args.mps_daemon_image or "").strip()
    namespace = (args.pod_namespace or "").strip()
    if image and not namespace:
        raise common.UsageError(
            "--mps-daemon-image needs --pod-namespace (or POD_NAMESPACE): the daemon Pods are "
            "created in the agent's namespace"
        )
    if not args.mps_ready_timeout > 0:
        raise common.UsageError("--mps-ready-timeout must be more than 0 seconds")
    return {
        "mps_daemon_image": image,
        "pod_namespace": namespace,
        "mps_ready_timeout_s": args.mps_ready_timeout,
    }
