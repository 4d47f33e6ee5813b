"""The GPU health watcher over the NVML stand-in: the same code the real path runs.

Each event kind reaches the board; ignored XIDs change nothing; recovery (an observed reset, an
explicit event, the quiet period) clears; the hold time keeps a flapping GPU unhealthy; events
of devices we do not publish are ignored; MIG devices inherit their GPU's health.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

import pynvml
import pytest

from dra_driver import logs
from dra_driver.devices import fake, health, healthpolicy, healthtracker, model, watcher
from dra_driver.testing import polling


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclasses.dataclass
class Node:
    backend: fake.FakeBackend
    devices: model.NodeDevices
    board: health.HealthBoard
    watcher: watcher.Watcher
    clock: Clock
    seen: list[tuple[str, str, str]]

    def uuid(self, index: int) -> str:
        return self.devices.gpu(index).uuid

    def conditions(self, index: int) -> dict[str, tuple[str, str]]:
        found = self.board.snapshot().conditions.get(self.uuid(index), ())
        return {c.kind: (c.value, c.effect) for c in found}

    def step(self, times: int = 1) -> None:
        for _ in range(times):
            self.watcher.step()


def node(
    profile: str = "dgx-h100",
    *,
    published: Collection[str] | None = None,
    **settings: float,
) -> Node:
    backend = fake.FakeBackend.from_name(profile)
    devices = backend.discover()
    every = {g.uuid for g in devices.gpus} | {m.uuid for g in devices.gpus for m in g.mig_devices}
    policy = healthpolicy.HealthPolicy(
        **{"min_hold_s": 0.0, "poll_interval_s": 3600.0, "wait_ms": 5, **settings}  # type: ignore[arg-type]
    )
    clock, board, seen = Clock(), health.HealthBoard(), []
    names = {g.uuid: g.name for g in devices.gpus}
    tracker = healthtracker.Tracker(
        board=board, policy=policy, names=names, log=logs.get("test"), clock=clock
    )
    w = watcher.Watcher(
        api=backend.nvml,
        gpus=watcher.watched_gpus(devices, every if published is None else published),
        tracker=tracker,
        log=logs.get("test"),
        observe=lambda *event: seen.append(event),
        clock=clock,
    )
    w.open()  # includes the first poll: everything healthy
    return Node(backend, devices, board, w, clock, seen)


def test_critical_xid_makes_the_gpu_unhealthy_with_the_fatal_effect() -> None:
    n = node()
    n.backend.nvml.inject_xid(3, 79)
    n.step()
    assert n.conditions(3) == {"xid": ("79", "NoExecute")}
    message = n.board.snapshot().unhealthy[n.uuid(3)]
    assert "XID 79" in message and "fallen off the bus" in message
    assert n.conditions(2) == {}
    assert n.seen[-1] == ("xid", "79", "unhealthy")


def test_other_critical_xid_is_no_schedule() -> None:
    n = node()
    n.backend.nvml.inject_xid(1, 48)
    n.step()
    assert n.conditions(1) == {"xid": ("48", "NoSchedule")}


@pytest.mark.parametrize("xid", sorted(healthpolicy.DEFAULT_IGNORED_XIDS))
def test_ignored_xids_change_nothing(xid: int) -> None:
    n = node()
    version = n.board.snapshot().version
    n.backend.nvml.inject_xid(0, xid)
    n.step()
    assert n.board.snapshot().version == version
    assert n.seen[-1] == ("xid", str(xid), "ignored")


def test_ignore_list_is_configurable() -> None:
    n = node(ignored_xids=frozenset({48}), enabled_xids=frozenset())  # type: ignore[arg-type]
    n.backend.nvml.inject_xid(0, 48)
    n.backend.nvml.inject_xid(0, 13)  # no longer in the list: critical now
    n.step(2)
    assert n.conditions(0) == {"xid": ("13", "NoSchedule")}


def test_double_bit_ecc_event() -> None:
    n = node()
    n.backend.nvml.inject_ecc_dbe(6)
    n.step()
    assert n.conditions(6) == {"ecc": ("double-bit", "NoSchedule")}


def test_lost_gpu_found_by_the_poll_and_back_after_a_reset() -> None:
    n = node()
    n.backend.nvml.lose(2)
    n.step()  # the wait raises GpuIsLost: poll soon
    n.step()
    assert n.conditions(2) == {"gpu-lost": ("lost", "NoExecute")}
    assert n.conditions(1) == {}
    n.backend.nvml.reset(2)
    n.watcher.poll()
    assert n.conditions(2) == {}
    assert n.watcher.tracker.recoveries(n.uuid(2)) == 1
    n.backend.nvml.inject_xid(2, 74)  # events registered again after the reset
    n.step()
    assert n.conditions(2) == {"xid": ("74", "NoSchedule")}


def test_gpu_is_lost_from_any_call_marks_that_gpu() -> None:
    n = node()
    n.backend.nvml.fail_calls[(4, "nvmlDeviceGetRemappedRows")] = pynvml.NVMLError_GpuIsLost
    n.watcher.poll()
    assert n.conditions(4) == {"gpu-lost": ("lost", "NoExecute")}


def test_recovery_action_decides_effect_and_a_reset_observed_ends_it() -> None:
    n = node()
    reset = pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET
    n.backend.nvml.inject_xid(5, 94, action=reset)  # 94 is recoverable, but the driver asks
    n.step()
    n.watcher.poll()  # the XID's condition names the action: no second condition
    assert n.conditions(5) == {"xid": ("94", "NoSchedule")}
    assert "driver asks for gpu-reset" in n.board.snapshot().unhealthy[n.uuid(5)]
    n.clock.now += 10_000  # no quiet period: the driver asked for a reset
    n.step()
    assert n.conditions(5)
    n.backend.nvml.set_faults(5, recovery_action=pynvml.NVML_GPU_RECOVERY_ACTION_NONE)
    n.watcher.poll()
    assert n.conditions(5) == {}


def test_a_recovery_action_without_an_event_is_found_by_the_poll() -> None:
    n = node()
    n.backend.nvml.set_faults(2, recovery_action=pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_P2P)
    n.watcher.poll()
    assert n.conditions(2) == {"recovery-action": ("drain-p2p", "NoSchedule")}
    n.backend.nvml.set_faults(2, recovery_action=pynvml.NVML_GPU_RECOVERY_ACTION_NONE)
    n.watcher.poll()
    assert n.conditions(2) == {}


def test_a_reset_observed_right_after_an_event_with_an_action_ends_it() -> None:
    n = node()
    n.backend.nvml.inject_xid(3, 48, action=pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET)
    n.step()
    assert n.conditions(3) == {"xid": ("48", "NoSchedule")}
    n.backend.nvml.reset(3)  # before any poll saw the action
    n.watcher.check(n.uuid(3))
    assert n.conditions(3) == {}


def test_reboot_action_is_fatal() -> None:
    n = node()
    n.backend.nvml.inject_xid(0, 48, action=pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT)
    n.step()
    assert n.conditions(0) == {"xid": ("48", "NoExecute")}


def test_quiet_period_ends_a_recoverable_xid_and_a_repeat_restarts_it() -> None:
    n = node(quiet_period_s=300.0)
    n.backend.nvml.inject_xid(7, 94)
    n.step()
    assert n.conditions(7) == {"xid": ("94", "NoSchedule")}
    version = n.board.snapshot().version
    n.clock.now += 200
    n.backend.nvml.inject_xid(7, 94)  # a repeat: no board change, the quiet period restarts
    n.step()
    assert n.board.snapshot().version == version
    n.clock.now += 200
    n.step()
    assert n.conditions(7)
    n.clock.now += 101
    n.step()
    assert n.conditions(7) == {}


def test_non_recoverable_xid_outlives_the_quiet_period_until_explicitly_recovered() -> None:
    n = node(quiet_period_s=1.0)
    n.backend.nvml.inject_xid(7, 48)
    n.step()
    n.clock.now += 3600
    n.step()
    assert n.conditions(7) == {"xid": ("48", "NoSchedule")}
    n.watcher.recovered(n.uuid(7))
    assert n.conditions(7) == {}


def test_flapping_is_held_and_the_hold_doubles_with_each_recovery() -> None:
    n = node(min_hold_s=60.0)
    gpu = n.uuid(1)
    for hold in (60, 120, 240):
        n.backend.nvml.inject_xid(1, 48)
        n.step()
        assert n.conditions(1)
        n.watcher.recovered(gpu)  # at once: held
        n.clock.now += hold - 1
        n.step()
        assert n.conditions(1), f"recovered before the {hold}s hold ended"
        n.backend.nvml.inject_xid(1, 48)  # the same fault again, still held: nothing changes
        n.step()
        n.watcher.recovered(gpu)
        n.clock.now += 1
        n.step()
        assert n.conditions(1) == {}
    assert n.watcher.tracker.recoveries(gpu) == 3


def test_a_new_fault_during_the_hold_cancels_the_pending_recovery() -> None:
    n = node(min_hold_s=60.0)
    n.backend.nvml.inject_xid(1, 48)
    n.step()
    n.watcher.recovered(n.uuid(1))
    n.backend.nvml.inject_xid(1, 48)
    n.step()
    n.clock.now += 61
    n.step()
    assert n.conditions(1) == {"xid": ("48", "NoSchedule")}


def test_pages_pending_on_volta_and_cleared_by_the_check() -> None:
    n = node("dgx-1-v100")
    n.backend.nvml.set_faults(3, pages_pending=True)
    n.watcher.poll()
    assert n.conditions(3) == {"retired-pages": ("pending", "NoSchedule")}
    n.watcher.recovered(n.uuid(3))  # an explicit event cannot end a polled condition
    assert n.conditions(3)
    n.backend.nvml.set_faults(3, pages_pending=False)
    n.watcher.poll()
    assert n.conditions(3) == {}


def test_row_remapping_failure_and_pending() -> None:
    n = node()
    n.backend.nvml.set_faults(0, remap_failure=True)
    n.backend.nvml.set_faults(1, remap_pending=True)
    n.watcher.poll()
    assert n.conditions(0) == {"row-remap": ("failure", "NoSchedule")}
    assert n.conditions(1) == {"row-remap": ("pending", "NoSchedule")}


def test_degraded_fabric_on_a_fabric_gpu() -> None:
    n = node("gb200-nvl")
    n.backend.nvml.set_faults(2, fabric_degraded=True)
    n.watcher.poll()
    assert n.conditions(2) == {"fabric": ("degraded", "NoSchedule")}
    n.backend.nvml.set_faults(2, fabric_degraded=False)
    n.watcher.poll()
    assert n.conditions(2) == {}


def test_mig_event_concerns_that_mig_device_and_a_gpu_event_all_of_them() -> None:
    n = node("a100-mig")
    gpu = n.devices.gpu(0)
    mig = gpu.mig_devices[1]
    n.backend.nvml.inject_xid(
        0, 94, gpu_instance=mig.gpu_instance_id, compute_instance=mig.compute_instance_id
    )
    n.step()
    snap = n.board.snapshot()
    keys = health.device_keys(n.devices)
    sick = {name for name, k in keys.items() if not snap.is_healthy(k)}
    assert sick == {model.mig_device_name(gpu, mig)}
    n.backend.nvml.inject_xid(0, 79)
    n.step()
    snap = n.board.snapshot()
    sick = {name for name, k in keys.items() if not snap.is_healthy(k)}
    assert sick == {model.mig_device_name(gpu, m) for m in gpu.mig_devices} | {gpu.name}


def test_events_of_unpublished_devices_are_ignored() -> None:
    backend_devices = fake.FakeBackend.from_name("a100-mig").discover()
    gpu0 = backend_devices.gpus[0]
    published = {m.uuid for m in gpu0.mig_devices[:1]}  # one MIG device of GPU 0 only
    n = node("a100-mig", published=published)
    version = n.board.snapshot().version
    assert n.backend.nvml.inject_xid(1, 79) == 0  # GPU 1 not watched: not even registered
    other = gpu0.mig_devices[1]
    n.backend.nvml.inject_xid(
        0, 79, gpu_instance=other.gpu_instance_id, compute_instance=other.compute_instance_id
    )
    n.step()
    assert n.board.snapshot().version == version
    assert n.seen[-1] == ("xid", "79", "unpublished")


def test_running_watcher_reports_each_kind_of_failure_on_its_own() -> None:
    # Its own thread, no step(): how fast is benchmarks/health_latency.py's question.
    n = node(wait_ms=200)
    n.watcher.start()
    try:
        for inject, index in (
            (lambda i: n.backend.nvml.inject_xid(i, 79), 0),
            (lambda i: n.backend.nvml.inject_ecc_dbe(i), 1),
            (n.backend.nvml.lose, 2),
        ):
            inject(index)
            assert polling.poll(lambda i=index: n.conditions(i), timeout_s=60), (
                f"GPU {index} still healthy"
            )
    finally:
        n.watcher.stop()
