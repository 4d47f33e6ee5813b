"""Flags that point a tool at a running node agent's health socket (``fake-event``, ``discover``).

They are the agent's own directory flags, so an operator types the same values (and the same
environment twins apply): ``--kubelet-plugins-dir`` and ``--driver-name`` for the DRA kubelet
plugin, ``--device-plugin-dir`` for the device plugin.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dra_driver import healthcontrol
from dra_driver.cli import common

DEFAULT_PLUGINS_DIR = "/var/lib/kubelet/plugins"


def add(parser: argparse.ArgumentParser, *, explicit_only: bool) -> None:
    """``explicit_only``: the directories come from flags only (no environment defaults), so
    the tool asks an agent only when told to."""
    from dra_driver.cli import env_default

    target = parser.add_mutually_exclusive_group()
    target.add_argument(
        "--kubelet-plugins-dir",
        type=Path,
        default=None,
        help="the DRA agent's --kubelet-plugins-dir"
        + ("" if explicit_only else f" (env KUBELET_PLUGINS_DIR; default {DEFAULT_PLUGINS_DIR})"),
    )
    target.add_argument(
        "--device-plugin-dir",
        type=Path,
        default=None if explicit_only else env_default("DEVICE_PLUGIN_DIR"),
        help="the device plugin's --device-plugin-dir"
        + ("" if explicit_only else " (env DEVICE_PLUGIN_DIR)"),
    )
    parser.add_argument(
        "--driver-name",
        default=env_default("DRIVER_NAME", "gpu.nvidia.com"),
        help="the DRA agent's --driver-name (env DRIVER_NAME; default gpu.nvidia.com)",
    )


def given(args: argparse.Namespace) -> bool:
    return args.kubelet_plugins_dir is not None or args.device_plugin_dir is not None


def sockets(args: argparse.Namespace) -> list[Path]:
    """The agent sockets the flags point at (several DRA instances during a rolling update)."""
    from dra_driver.cli import env_default

    if args.device_plugin_dir is not None and args.kubelet_plugins_dir is None:
        return [healthcontrol.device_plugin_socket(Path(args.device_plugin_dir))]
    plugins = args.kubelet_plugins_dir or Path(
        env_default("KUBELET_PLUGINS_DIR", DEFAULT_PLUGINS_DIR) or DEFAULT_PLUGINS_DIR
    )
    found = healthcontrol.dra_sockets(plugins, args.driver_name)
    return found or [healthcontrol.dra_socket(plugins / args.driver_name)]


def send_each(args: argparse.Namespace, req: dict[str, object]) -> int:
    """Send ``req`` to every node agent's control socket the flags name; print each answer's
    message. Exit code 1 (after trying them all) if any agent could not be asked."""
    code = 0
    for path in sockets(args):
        try:
            answer = healthcontrol.request(path, req)
        except healthcontrol.ControlError as exc:
            code = common.fail(str(exc), code=1)
            continue
        print(f"{path}: {answer.get('message', 'done')}")
    return code
