"""``--dynamic-mig auto:…`` / ``--shareable auto:…``: on where the API server keeps the fields,
off (plain full GPUs, one log line, the gauge at 0) where it drops them, following re-probes."""

from __future__ import annotations

import argparse
import dataclasses
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import structlog.testing

from dra_driver import metrics
from dra_driver.cli import common
from dra_driver.devices import health, migprofiles
from dra_driver.slices import nodepublisher, republish, serverfeatures, shares
from dra_driver.testing.fakeapi import memory

from .conftest import Obj, devices_of

DROPPED = serverfeatures.Kept(shared_counters=False, consumable_capacity=False, probed=True)


@pytest.mark.parametrize(
    ("text", "spec", "auto"),
    [
        ("auto:all", "all", True),
        ("AUTO:All", "all", True),
        (" auto: H100 ", "H100", True),
        ("auto:A100|H100", "A100|H100", True),
        ("all", "all", False),
        ("H100", "H100", False),
        ("", "none", False),
        (None, "none", False),
    ],
)
def test_dynamic_mig_parses_the_auto_prefix(text: str | None, spec: str, auto: bool) -> None:
    parsed = migprofiles.DynamicMig.parse(text)
    assert (parsed.spec, parsed.auto) == (spec, auto)
    assert migprofiles.DynamicMig.parse(parsed.text) == parsed


@pytest.mark.parametrize(
    ("text", "spec", "auto"),
    [
        ("auto:all", "all", True),
        ("auto:A100|H100", "A100|H100", True),
        ("all", "all", False),
        ("H100", "H100", False),
        (None, "none", False),
    ],
)
def test_shareable_parses_the_auto_prefix(text: str | None, spec: str, auto: bool) -> None:
    parsed = shares.Shareable.parse(text)
    assert (parsed.spec, parsed.auto) == (spec, auto)
    assert shares.Shareable.parse(str(parsed)) == parsed


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("auto", "say which GPUs, e.g. auto:all"),
        ("auto:", "auto: needs all or a regular expression"),
        ("auto:none", "auto: needs all or a regular expression"),
        ("auto:H100(", "not none, all or a"),
    ],
)
def test_bad_auto_forms_are_usage_errors(value: str, said: str) -> None:
    args = argparse.Namespace(dynamic_mig=value, shareable=value)
    with pytest.raises(common.UsageError, match=r"^--dynamic-mig ") as dyn:
        common.dynamic_mig(args)
    assert said in str(dyn.value)
    with pytest.raises(common.UsageError, match=r"^--shareable ") as shr:
        common.shareable_from(args)
    assert said in str(shr.value)


def test_auto_is_never_refused_and_resolves_off_only_where_dropped() -> None:
    gpus = devices_of("h100-mig").gpus
    dyn = migprofiles.DynamicMig.parse("auto:H100")
    shr = shares.Shareable.parse("auto:all")
    assert not serverfeatures.refusal(DROPPED, gpus=gpus, dynamic_mig=dyn, shareable=shr)
    assert serverfeatures.resolve(DROPPED, dynamic_mig=dyn, shareable=shr) == (
        migprofiles.STATIC,
        shares.NONE,
    )
    kept = serverfeatures.Kept(probed=True)
    assert serverfeatures.resolve(kept, dynamic_mig=dyn, shareable=shr) == (dyn, shr)
    explicit = migprofiles.DynamicMig.parse("H100")
    assert serverfeatures.resolve(DROPPED, dynamic_mig=explicit, shareable=shares.NONE)[0] == (
        explicit
    )
    said = serverfeatures.refusal(DROPPED, gpus=gpus, dynamic_mig=explicit, shareable=shares.NONE)
    assert "--dynamic-mig none" in said and "--dynamic-mig auto:H100" in said


class Probe:
    def __init__(self, found: serverfeatures.Kept) -> None:
        self.found = found

    def __call__(self) -> serverfeatures.Kept:
        return self.found


def test_one_line_names_the_auto_flag_and_the_gauge_says_zero() -> None:
    m = metrics.new()
    flags = serverfeatures.auto_flags(
        dynamic_mig=migprofiles.DynamicMig.parse("auto:H100"),
        shareable=shares.Shareable.parse("auto:all"),
    )
    with structlog.testing.capture_logs() as logs:
        found = serverfeatures.ServerFeatures(
            probe=Probe(DROPPED), log=structlog.get_logger(), metrics=m, auto=flags
        )
        found.start()
    effects = {
        x["feature"]: x["effect"] for x in logs if x["event"] == serverfeatures.DROPPED_EVENT
    }
    assert effects == {
        "sharedCounters": "--dynamic-mig auto:H100: dynamic MIG is off, its GPUs are published "
        "as full GPUs",
        "consumableCapacity": "--shareable auto:all: GPU shares are off, its GPUs are published "
        "as full GPUs",
    }
    value = m.registry.get_sample_value
    assert value("dra_driver_feature_enabled", {"feature": "sharedCounters"}) == 0
    assert value("dra_driver_feature_enabled", {"feature": "consumableCapacity"}) == 0


def devices_in(slices: list[Obj]) -> list[Obj]:
    return [d for s in slices for d in s["spec"].get("devices") or ()]


def test_the_rebuild_follows_what_the_server_keeps() -> None:
    devices = devices_of("h100-mig")
    now = [serverfeatures.Kept(probed=True)]
    rebuild = republish.rebuilder(
        devices,
        node_name="n1",
        driver_name="gpu.nvidia.com",
        dynamic_mig=migprofiles.DynamicMig.parse("auto:all"),
        kept=lambda: now[0],
    )
    on = devices_in(rebuild(republish.Inputs()))
    assert any(d.get("consumesCounters") for d in on)
    now[0] = DROPPED
    off = devices_in(rebuild(republish.Inputs()))
    # Every GPU still published, whole, nothing consuming counters (nothing withdrawn).
    assert not any(d.get("consumesCounters") for d in off)
    gpus = sorted(g.name for g in devices.gpus)
    assert sorted(d["name"] for d in off) == gpus
    now[0] = serverfeatures.Kept(probed=True)
    assert devices_in(rebuild(republish.Inputs())) == on


class Answers:
    """A probe the test switches."""

    def __init__(self) -> None:
        self.kept = True

    def __call__(self) -> serverfeatures.Kept:
        return dataclasses.replace(DROPPED, consumable_capacity=self.kept, shared_counters=True)


def wait_for(condition: Callable[[], Any], timeout_s: float = 10.0) -> None:
    done = threading.Event()
    for _ in range(int(timeout_s / 0.02)):
        if condition():
            return
        done.wait(0.02)
    raise AssertionError("condition not met in time")


@pytest.mark.parametrize("with_board", [False, True])
def test_the_agent_publisher_turns_auto_shares_off_and_on_with_re_probes(
    tmp_path: Path, with_board: bool
) -> None:
    mem = memory.InMemoryApi()
    mem.put_node("n1", uid="uid-n1")
    answers = Answers()
    found = serverfeatures.ServerFeatures(probe=answers, log=structlog.get_logger())
    found.start()
    node = nodepublisher.NodePublisher(
        driver_name="gpu.nvidia.com",
        node_name="n1",
        devices=devices_of("dgx-h100"),
        api=mem,
        lock_file=tmp_path / "publisher.lock",
        grace_s=60.0,
        watch_timeout_s=30.0,
        log=structlog.get_logger(),
        board=health.HealthBoard() if with_board else None,
        shareable=shares.Shareable.parse("auto:all"),
        features=found,
    )

    def shared() -> int:
        stored, _ = mem.list_resource_slices(driver="gpu.nvidia.com", node_name="n1")
        return sum(1 for d in devices_in(stored) if d.get("allowMultipleAllocations"))

    def published() -> int:
        stored, _ = mem.list_resource_slices(driver="gpu.nvidia.com", node_name="n1")
        return len(devices_in(stored))

    node.start()
    try:
        wait_for(lambda: shared() == 8)
        answers.kept = False
        found.reconnected()
        wait_for(lambda: shared() == 0 and published() == 8)
        answers.kept = True
        found.reconnected()
        wait_for(lambda: shared() == 8)
    finally:
        node.stop()
