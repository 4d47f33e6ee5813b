"""The GPU health flags both node agents take (``kubelet-plugin``, ``device-plugin``).

Each flag has an environment twin for the DaemonSet's ConfigMap; docs/health.md explains them.
"""

from __future__ import annotations

import argparse

from dra_driver.cli import common
from dra_driver.devices import healthpolicy as hp


def _xids(values: frozenset[int]) -> str:
    return ",".join(str(x) for x in sorted(values))


def add_flags(parser: argparse.ArgumentParser) -> None:
    from dra_driver.cli import env_default

    group = parser.add_argument_group("GPU health (docs/health.md)")
    group.add_argument(
        "--health-checks",
        choices=("on", "off"),
        default=env_default("HEALTH_CHECKS", "on"),
        help="watch GPU health through NVML (env HEALTH_CHECKS; default on)",
    )
    group.add_argument(
        "--health-ignore-xids",
        metavar="LIST",
        default=env_default("HEALTH_IGNORE_XIDS", ""),
        help="XIDs to ignore besides the default application errors "
        f"({_xids(hp.DEFAULT_IGNORED_XIDS)}); 'all' ignores every XID (env HEALTH_IGNORE_XIDS)",
    )
    group.add_argument(
        "--health-enable-xids",
        metavar="LIST",
        default=env_default("HEALTH_ENABLE_XIDS", ""),
        help="XIDs never to ignore, even if listed or 'all' (env HEALTH_ENABLE_XIDS)",
    )
    group.add_argument(
        "--health-recoverable-xids",
        metavar="LIST",
        default=env_default("HEALTH_RECOVERABLE_XIDS", _xids(hp.DEFAULT_RECOVERABLE_XIDS)),
        help="XIDs that end after the quiet period without a repeat "
        f"(env HEALTH_RECOVERABLE_XIDS; default {_xids(hp.DEFAULT_RECOVERABLE_XIDS)})",
    )
    group.add_argument(
        "--health-reboot-xids",
        metavar="LIST",
        default=env_default("HEALTH_REBOOT_XIDS", _xids(hp.DEFAULT_REBOOT_XIDS)),
        help="XIDs that need a node reboot: the fatal taint effect "
        f"(env HEALTH_REBOOT_XIDS; default {_xids(hp.DEFAULT_REBOOT_XIDS)})",
    )
    group.add_argument(
        "--health-taint-effect",
        choices=hp.EFFECTS,
        default=env_default("HEALTH_TAINT_EFFECT", hp.NO_SCHEDULE),
        help="taint effect of an unhealthy device (env HEALTH_TAINT_EFFECT; default NoSchedule)",
    )
    group.add_argument(
        "--health-fatal-taint-effect",
        choices=hp.EFFECTS,
        default=env_default("HEALTH_FATAL_TAINT_EFFECT", hp.NO_EXECUTE),
        help="taint effect for a lost GPU or one that needs a reboot "
        "(env HEALTH_FATAL_TAINT_EFFECT; default NoExecute)",
    )
    for flag, env, default, text in (
        ("quiet-period", "HEALTH_QUIET_PERIOD", "300", "quiet time that ends a recoverable XID"),
        ("min-hold", "HEALTH_MIN_HOLD", "60", "minimum time unhealthy; doubles per recovery"),
        ("max-hold", "HEALTH_MAX_HOLD", "3600", "cap of the doubling hold time"),
        ("poll-interval", "HEALTH_POLL_INTERVAL", "10", "seconds between polls of each GPU"),
    ):
        group.add_argument(
            f"--health-{flag}",
            metavar="SECONDS",
            type=float,
            default=float(env_default(env, default) or default),
            help=f"{text} (env {env}; default {default})",
        )


def policy_from(args: argparse.Namespace) -> hp.HealthPolicy:
    """The policy the flags describe; raises UsageError naming the bad flag."""
    for flag in ("quiet-period", "min-hold", "max-hold", "poll-interval"):
        value = getattr(args, f"health_{flag.replace('-', '_')}")
        if not value >= 0:
            raise common.UsageError(f"--health-{flag} {value}: must be a number of seconds >= 0")
    try:
        ignore, ignore_all = hp.parse_xids(args.health_ignore_xids, flag="--health-ignore-xids")
        enable, _ = hp.parse_xids(args.health_enable_xids, flag="--health-enable-xids")
        recoverable, _ = hp.parse_xids(
            args.health_recoverable_xids, flag="--health-recoverable-xids"
        )
        reboot, _ = hp.parse_xids(args.health_reboot_xids, flag="--health-reboot-xids")
        return hp.HealthPolicy(
            enabled=args.health_checks == "on",
            ignore_all_xids=ignore_all,
            ignored_xids=hp.ignored_xids(ignore, enable),
            enabled_xids=enable,
            reboot_xids=reboot,
            recoverable_xids=recoverable,
            effect=args.health_taint_effect,
            fatal_effect=args.health_fatal_taint_effect,
            quiet_period_s=args.health_quiet_period,
            min_hold_s=args.health_min_hold,
            max_hold_s=args.health_max_hold,
            poll_interval_s=args.health_poll_interval,
        )
    except hp.PolicyError as exc:
        raise common.UsageError(str(exc)) from None
