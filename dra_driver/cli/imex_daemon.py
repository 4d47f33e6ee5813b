"""``dra-driver imex-daemon``: the program of a ComputeDomain's IMEX daemon pods on real nodes.

Runs NVIDIA's ``nvidia-imex -c <dir>/imexd.cfg`` as a child on the directory the node agent
prepared (``/imexd``, the daemon claim's CDI mount), asks ``nvidia-imex-ctl -c ... -q`` every
``--interval`` whether it is ready and writes ``status.json`` for the agent
(docs/computedomains.md).
The binaries come from ``--imex-bin`` / ``--imex-ctl-bin`` when given, else from PATH, else
from the host's driver root mounted at ``--driver-root``. Exit codes: 0 stopped (SIGTERM,
SIGINT) or the directory went, 1 the IMEX daemon died or stopped answering, 2 bad flags, no
config or no binary. The logic lives in :mod:`dra_driver.computedomain.imexdaemon`.
"""

from __future__ import annotations

import argparse
import signal
from pathlib import Path
from typing import Any

from dra_driver import cli, logs
from dra_driver import computedomain as cd
from dra_driver.cli import common
from dra_driver.computedomain import imexconfig, imexdaemon

DRIVER_ROOT_MOUNT = imexdaemon.DRIVER_ROOT_MOUNT


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from dra_driver.cli import env_default

    parser = sub.add_parser(
        "imex-daemon",
        help=cli.SUMMARIES["imex-daemon"],
        description="Run NVIDIA's IMEX daemon for a ComputeDomain and report its readiness.",
    )
    parser.add_argument(
        "--config-dir",
        type=Path,
        default=Path(env_default("IMEX_CONFIG_DIR", cd.DAEMON_DIR) or cd.DAEMON_DIR),
        help=f"the domain's IMEX directory: {imexconfig.CONFIG}, {imexconfig.NODES}, "
        f"{imexconfig.STATUS} (env IMEX_CONFIG_DIR; default {cd.DAEMON_DIR})",
    )
    parser.add_argument(
        "--interval", type=float, default=1.0, help="seconds between readiness checks"
    )
    parser.add_argument(
        "--imex-bin",
        default=env_default("IMEX_BIN"),
        help=f"the {imexdaemon.IMEX} executable (env IMEX_BIN; default: PATH, then the driver "
        "root)",
    )
    parser.add_argument(
        "--imex-ctl-bin",
        default=env_default("IMEX_CTL_BIN"),
        help=f"the {imexdaemon.IMEX_CTL} executable (env IMEX_CTL_BIN; default: PATH, then the "
        "driver root)",
    )
    parser.add_argument(
        "--driver-root",
        type=Path,
        default=Path(env_default("IMEX_DRIVER_ROOT", DRIVER_ROOT_MOUNT) or DRIVER_ROOT_MOUNT),
        help="where the host's NVIDIA driver root is mounted; its usr/bin, usr/sbin, bin, sbin "
        f"are searched after PATH (env IMEX_DRIVER_ROOT; default {DRIVER_ROOT_MOUNT})",
    )
    parser.add_argument(
        "--ctl-timeout",
        type=float,
        default=5.0,
        help="seconds one nvidia-imex-ctl query may take; longer counts as not ready",
    )
    parser.add_argument(
        "--lost-after",
        type=float,
        default=60.0,
        help="a daemon that detached (DAEMONIZE=1) and has not answered nvidia-imex-ctl for "
        "this many seconds is gone: exit 1",
    )
    parser.add_argument(
        "--stop-timeout",
        type=float,
        default=20.0,
        help="seconds the IMEX daemon gets to end after SIGTERM before SIGKILL",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    for flag in ("interval", "ctl_timeout", "lost_after", "stop_timeout"):
        if not getattr(args, flag) > 0:
            return common.fail(f"--{flag.replace('_', '-')} must be above 0")
    directory: Path = args.config_dir
    config = directory / imexconfig.CONFIG
    if not config.is_file():
        return common.fail(
            f"{config} does not exist: the daemon claim's CDI spec mounts the domain's IMEX "
            f"directory (prepared by the node agent) at {cd.DAEMON_DIR}"
        )
    try:
        imex = imexdaemon.find_binary(
            imexdaemon.IMEX, explicit=args.imex_bin, driver_root=args.driver_root
        )
        ctl = imexdaemon.find_binary(
            imexdaemon.IMEX_CTL, explicit=args.imex_ctl_bin, driver_root=args.driver_root
        )
    except imexdaemon.MissingBinary as exc:
        return common.fail(str(exc))
    supervisor = imexdaemon.Supervisor(
        imexdaemon.Options(
            directory=directory,
            imex=imex,
            ctl=ctl,
            interval_s=args.interval,
            ctl_timeout_s=args.ctl_timeout,
            lost_after_s=args.lost_after,
            stop_timeout_s=args.stop_timeout,
        ),
        log=logs.get("imex-daemon"),
    )

    def forward(signum: int, _frame: Any) -> None:
        supervisor.request_stop(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    return supervisor.run()
