"""Classification and the health flags: what each XID means, what operators can change."""

from __future__ import annotations

import argparse

import pytest

from dra_driver.cli import common, healthflags
from dra_driver.devices import healthpolicy as hp


def test_defaults_follow_nvidias_ignore_list_and_reboot_xids() -> None:
    policy = hp.HealthPolicy()
    assert {13, 31, 43, 45, 68, 109} == hp.DEFAULT_IGNORED_XIDS
    assert all(policy.xid(x) is None for x in hp.DEFAULT_IGNORED_XIDS)
    fatal = policy.xid(79)
    assert fatal is not None and fatal.condition.effect == "NoExecute" and not fatal.quiet
    quiet = policy.xid(94)
    assert quiet is not None and quiet.quiet and quiet.condition.effect == "NoSchedule"
    assert policy.lost().condition.effect == "NoExecute"
    assert policy.lost().check == hp.LOST


def test_recovery_action_wins_over_the_tables() -> None:
    policy = hp.HealthPolicy()
    reboot = policy.xid(94, action=2)
    assert reboot is not None
    assert (reboot.condition.effect, reboot.quiet, reboot.action) == (
        "NoExecute",
        False,
        "node-reboot",
    )
    assert "driver asks for node-reboot" in reboot.condition.message
    assert policy.ecc_dbe(1).action == "gpu-reset"


def test_hold_doubles_per_recovery_up_to_the_cap() -> None:
    policy = hp.HealthPolicy(min_hold_s=60, max_hold_s=300)
    assert [policy.hold_s(n) for n in range(5)] == [60, 120, 240, 300, 300]


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    healthflags.add_flags(parser)
    return parser.parse_args(argv)


def test_flags_build_the_policy() -> None:
    policy = healthflags.policy_from(
        parse(
            "--health-ignore-xids", "48, 74",
            "--health-enable-xids", "13",
            "--health-recoverable-xids", "94",
            "--health-taint-effect", "None",
            "--health-min-hold", "5",
        )
    )  # fmt: skip
    assert policy.ignored_xids == (hp.DEFAULT_IGNORED_XIDS | {48, 74}) - {13}
    assert policy.xid(13) is not None and policy.xid(48) is None
    assert policy.recoverable_xids == {94}
    assert policy.effect == "None" and policy.min_hold_s == 5
    every = healthflags.policy_from(
        parse("--health-ignore-xids", "all", "--health-enable-xids", "79")
    )
    assert every.xid(48) is None and every.xid(79) is not None
    assert not healthflags.policy_from(parse("--health-checks", "off")).enabled


def test_env_twins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEALTH_FATAL_TAINT_EFFECT", "NoSchedule")
    monkeypatch.setenv("HEALTH_QUIET_PERIOD", "30")
    policy = healthflags.policy_from(parse())
    assert (policy.fatal_effect, policy.quiet_period_s) == ("NoSchedule", 30)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--health-ignore-xids", "48,x"], "--health-ignore-xids: 'x' is not an XID number"),
        (["--health-recoverable-xids", "-3"], "--health-recoverable-xids: -3 is not an XID"),
        (["--health-min-hold", "-1"], "--health-min-hold -1.0: must be a number of seconds"),
    ],
)
def test_bad_flags_are_usage_errors(argv: list[str], message: str) -> None:
    with pytest.raises(common.UsageError, match=message):
        healthflags.policy_from(parse(*argv))
