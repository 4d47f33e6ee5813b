"""GPU sharing is applied at prepare, restored at unprepare, rolled back on failure, and
recovered after a crash; MIG devices and conflicting intervals are per-claim errors."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import refdata
import structlog

from dra_driver import app, logs
from dra_driver.devices import control, fake
from dra_driver.driver import checkpoint, sharing

from .conftest import Node, claim_obj, gpu_config, new_uid, opaque, ref_of

# The pool (and node) of real-allocations.json; checked against the file by a fixture test.
POOL = "shape-n1"
CRASHED = 86


def _claim(**fields: Any) -> dict[str, Any]:
    return claim_obj(pool=POOL, **fields)


def time_sliced(interval: str | None = None) -> dict[str, Any]:
    sharing_cfg: dict[str, Any] = {"strategy": "TimeSlicing"}
    if interval is not None:
        sharing_cfg["timeSlicing"] = {"interval": interval}
    return opaque(gpu_config(sharing=sharing_cfg))


class OneShot:
    """Wraps a control; the first ``operation`` on ``uuid`` fails, later ones go through."""

    def __init__(self, inner: control.FakeGpuControl, uuid: str, operation: str) -> None:
        self.inner, self.key, self.fired = inner, (uuid, operation), False

    def _maybe_fail(self, uuid: str, operation: str) -> None:
        if (uuid, operation) == self.key and not self.fired:
            self.fired = True
            raise control.ControlError(f"GPU {uuid}: injected failure")

    def set_compute_mode(self, uuid: str, mode: control.ComputeMode) -> None:
        self._maybe_fail(uuid, "compute_mode")
        self.inner.set_compute_mode(uuid, mode)

    def set_timeslice(self, uuid: str, interval: int) -> None:
        self._maybe_fail(uuid, "timeslice")
        self.inner.set_timeslice(uuid, interval)


@dataclasses.dataclass
class Rig:
    """A node whose GPU control is a recording fake with its state in a file."""

    node: Node
    profile: str
    gpu: control.FakeGpuControl

    def restart(
        self, wrap: Callable[[control.FakeGpuControl], control.GpuControl] | None = None
    ) -> None:
        """A new driver process over the same disk and cards; ``wrap`` decorates its control."""
        self.node.driver.close()
        self.gpu = control.FakeGpuControl.for_devices(self._devices(), state_file=self.state)
        self.node.driver = app.build_driver(
            self.node.settings,
            devices=self._devices(),
            api=self.node.api,
            log=logs.get("test"),
            gpu_control=wrap(self.gpu) if wrap else self.gpu,
        )

    def _devices(self) -> Any:
        return fake.FakeBackend.from_name(self.profile).discover()

    @property
    def state(self) -> Path:
        return self.node.settings.plugin_dir.parent / "gpu-state.json"

    def uuid(self, device: str) -> str:
        found = self.node.driver.state.devices.get(device)
        assert found is not None
        return found.uuid

    def timeslice(self, device: str) -> object:
        return self.gpu.settings().get(self.uuid(device), {}).get("timeslice")

    def sharing(self) -> sharing.GpuSharing:
        return self.node.driver.state.sharing


@pytest.fixture
def rig_factory(node_factory: Callable[..., Node]) -> Callable[..., Rig]:
    def make(profile: str = "dgx-h100") -> Rig:
        node = node_factory(profile, node_name=POOL, serial=True)
        rig = Rig(node=node, profile=profile, gpu=control.FakeGpuControl(gpus=()))
        rig.restart()
        return rig

    return make


@pytest.fixture
def rig(rig_factory: Callable[..., Rig]) -> Rig:
    return rig_factory()


@refdata.MARK
def test_pool_is_the_one_of_the_recorded_allocations() -> None:
    assert refdata.real_allocations()["slice"]["spec"]["pool"]["name"] == POOL


def _real(name: str, interval: str | None = None) -> dict[str, Any]:
    real = refdata.real_allocations()["claims"]
    claim: dict[str, Any] = copy.deepcopy(next(c for c in real if c["metadata"]["name"] == name))
    if interval is not None:
        for entry in claim["status"]["allocation"]["devices"]["config"]:
            params = entry["opaque"]["parameters"]
            if "sharing" in params:
                params["sharing"]["timeSlicing"] = {"interval": interval}
    return claim


@refdata.MARK
def test_real_claim_time_slices_infer_and_leaves_train_exclusive(rig: Rig) -> None:
    ref = rig.node.add(_real("two-requests-with-config"))
    assert rig.node.driver.prepare([ref])[ref.uid].error == ""
    infer, train = rig.uuid("gpu-5"), rig.uuid("gpu-4")
    assert rig.gpu.calls == [("compute_mode", infer, "Default"), ("timeslice", infer, 0)]
    assert rig.sharing().applied() == {infer: "TimeSlicing:Default"}
    assert train not in rig.gpu.settings()
    record = json.loads((rig.node.claims_dir / f"{ref.uid}.json").read_text())
    configs = {d["deviceName"]: d["config"] for d in record["devices"]}
    assert configs["gpu-5"]["sharing"] == {"strategy": "TimeSlicing"}
    assert "sharing" not in configs["gpu-4"]

    assert rig.node.driver.unprepare([ref]) == {ref.uid: ""}
    assert rig.gpu.calls[2:] == [("compute_mode", infer, "Default"), ("timeslice", infer, 0)]
    assert rig.sharing().applied() == {}


@refdata.MARK
def test_interval_is_applied_and_unprepare_restores_the_default_idempotently(rig: Rig) -> None:
    ref = rig.node.add(_real("two-requests-with-config", interval="Long"))
    assert rig.node.driver.prepare([ref])[ref.uid].error == ""
    assert rig.timeslice("gpu-5") == 3
    assert rig.node.driver.prepare([ref])[ref.uid].error == ""  # answered from the checkpoint
    assert len(rig.gpu.calls) == 2
    assert rig.node.driver.unprepare([ref]) == {ref.uid: ""}
    assert rig.timeslice("gpu-5") == 0
    calls = len(rig.gpu.calls)
    assert rig.node.driver.unprepare([ref]) == {ref.uid: ""}
    assert len(rig.gpu.calls) == calls


def test_failure_rolls_back_every_gpu_and_stays_per_claim(rig: Rig) -> None:
    bad = rig.node.add(
        _claim(name="bad", uid=new_uid(), devices=["gpu-0", "gpu-1"], config=[time_sliced("Long")])
    )
    good = rig.node.add(_claim(name="good", uid=new_uid(), devices=["gpu-2"]))
    gpu_1 = rig.uuid("gpu-1")
    rig.restart(wrap=lambda gpu: OneShot(gpu, gpu_1, "timeslice"))
    got = rig.node.driver.prepare([bad, good])
    assert got[good.uid].error == ""
    error = got[bad.uid].error
    assert "ResourceClaim default/bad" in error and "device gpu-1" in error
    assert "injected failure" in error and "rolled back to their defaults" in error
    assert rig.timeslice("gpu-0") == 0  # it was set to Long first, then put back
    assert ("timeslice", rig.uuid("gpu-0"), 3) in rig.gpu.calls
    assert rig.sharing().applied() == {}
    assert not (rig.node.claims_dir / f"{bad.uid}.json").exists()
    assert rig.node.spec_files() == [f"k8s.gpu.nvidia.com-claim_{good.uid}.json"]
    assert rig.node.driver.prepare([bad])[bad.uid].error == ""  # the retry succeeds
    assert rig.timeslice("gpu-0") == rig.timeslice("gpu-1") == 3


def test_a_failing_rollback_is_reported_too(rig: Rig) -> None:
    ref = rig.node.add(_claim(name="c", uid=new_uid(), devices=["gpu-3"], config=[time_sliced()]))
    rig.gpu.fail[(rig.uuid("gpu-3"), "timeslice")] = RuntimeError("nvidia-smi: GPU is lost")
    error = rig.node.driver.prepare([ref])[ref.uid].error
    assert "device gpu-3" in error and "GPU is lost" in error and "rolling back failed" in error
    assert rig.node.spec_files() == []


def test_unprepare_that_cannot_restore_fails_and_keeps_the_claim_for_a_retry(rig: Rig) -> None:
    ref = rig.node.add(
        _claim(name="c", uid=new_uid(), devices=["gpu-6"], config=[time_sliced("Short")])
    )
    assert rig.node.driver.prepare([ref])[ref.uid].error == ""
    rig.gpu.fail[(rig.uuid("gpu-6"), "timeslice")] = RuntimeError("permission denied")
    error = rig.node.driver.unprepare([ref])[ref.uid]
    assert "cannot restore" in error and "gpu-6" in error and "permission denied" in error
    assert (rig.node.claims_dir / f"{ref.uid}.json").exists()
    assert rig.timeslice("gpu-6") == 1
    del rig.gpu.fail[(rig.uuid("gpu-6"), "timeslice")]
    assert rig.node.driver.unprepare([ref]) == {ref.uid: ""}
    assert rig.timeslice("gpu-6") == 0
    assert rig.node.spec_files() == []


def test_mig_device_cannot_be_time_sliced(rig_factory: Callable[..., Rig]) -> None:
    rig = rig_factory("a100-mig")
    mig = rig.node.add(
        _claim(name="m", uid=new_uid(), devices=["gpu-0-mig-1g-5gb-2"], config=[time_sliced()])
    )
    exclusive = rig.node.add(
        _claim(
            name="e",
            uid=new_uid(),
            devices=["gpu-1-mig-7g-40gb-0"],
            config=[opaque(gpu_config(sharing={"strategy": "Exclusive"}))],
        )
    )
    got = rig.node.driver.prepare([mig, exclusive])
    assert "device gpu-0-mig-1g-5gb-2" in got[mig.uid].error
    assert "MIG device" in got[mig.uid].error and "full GPU" in got[mig.uid].error
    assert got[exclusive.uid].error == ""
    assert rig.gpu.calls == []


def test_shared_gpu_holders_must_agree_and_the_last_one_restores(rig: Rig) -> None:
    def claim(name: str, interval: str, admin: bool) -> dict[str, Any]:
        return _claim(
            name=name,
            uid=new_uid(),
            results=[
                {"request": "gpu", "driver": "gpu.nvidia.com", "pool": POOL, "device": "gpu-7"}
                | ({"adminAccess": True} if admin else {})
            ],
            config=[time_sliced(interval)],
        )

    a = rig.node.add(claim("a", "Long", admin=False))
    b = rig.node.add(claim("b", "Short", admin=True))
    c = rig.node.add(claim("c", "Long", admin=True))
    assert rig.node.driver.prepare([a])[a.uid].error == ""
    error = rig.node.driver.prepare([b])[b.uid].error
    assert "already time-sliced with interval Long" in error and "gpu-7" in error
    assert rig.node.driver.prepare([c])[c.uid].error == ""
    assert rig.node.driver.unprepare([a]) == {a.uid: ""}
    assert rig.timeslice("gpu-7") == 3  # c still holds it
    assert rig.node.driver.unprepare([c]) == {c.uid: ""}
    assert rig.timeslice("gpu-7") == 0


def _prepare_then_die_before_the_spec(rig: Rig, ref: Any) -> int:
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        try:
            rig.node.driver.state.specs.write = lambda *a, **k: os._exit(CRASHED)  # type: ignore[method-assign]
            rig.node.driver.prepare([ref])
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_crash_between_apply_and_checkpoint_is_recovered(rig: Rig) -> None:
    ref = rig.node.add(
        _claim(name="c", uid=new_uid(), devices=["gpu-2"], config=[time_sliced("Medium")])
    )
    assert _prepare_then_die_before_the_spec(rig, ref) == CRASHED
    assert rig.timeslice("gpu-2") == 2  # the dead process changed the GPU ...
    record = json.loads((rig.node.claims_dir / f"{ref.uid}.json").read_text())
    assert record["state"] == checkpoint.PREPARE_STARTED  # ... after recording its intent
    assert record["devices"][0]["config"]["sharing"] == {
        "strategy": "TimeSlicing",
        "timeSlicing": {"interval": "Medium"},
    }
    rig.restart()
    assert rig.timeslice("gpu-2") == 0
    assert rig.gpu.calls == [
        ("compute_mode", rig.uuid("gpu-2"), "Default"),
        ("timeslice", rig.uuid("gpu-2"), 0),
    ]
    assert not (rig.node.claims_dir / f"{ref.uid}.json").exists()
    assert rig.node.driver.prepare([ref])[ref.uid].error == ""
    assert rig.timeslice("gpu-2") == 2


def test_restart_reapplies_settings_of_prepared_claims(rig: Rig) -> None:
    ref = rig.node.add(
        _claim(name="c", uid=new_uid(), devices=["gpu-1"], config=[time_sliced("Long")])
    )
    assert rig.node.driver.prepare([ref])[ref.uid].error == ""
    rig.state.write_text("{}")  # the card lost its settings (e.g. the driver was reloaded)
    rig.restart()
    assert rig.timeslice("gpu-1") == 3
    assert rig.sharing().applied() == {rig.uuid("gpu-1"): "TimeSlicing:Long"}


def test_without_gpu_control_time_slicing_is_refused_clearly() -> None:
    gpu_sharing = sharing.GpuSharing(gpu_control=None, log=logs.get("test"))
    target = sharing.Target(device="gpu-0", uuid="GPU-1", interval="Short")
    ref = ref_of(_claim(name="c", uid=new_uid()))
    with pytest.raises(sharing.SharingError) as err:
        gpu_sharing.apply(ref, [target])
    assert str(err.value) == (
        f"{ref}: device gpu-0 asks for TimeSlicing:Short, but this plugin runs without GPU control"
    )
    gpu_sharing.apply(ref, [])  # nothing asked, nothing needed


def test_time_slicing_without_an_interval_is_recorded_as_the_default_interval(rig: Rig) -> None:
    ref = rig.node.add(_claim(name="ts", uid=new_uid(), devices=["gpu-2"], config=[time_sliced()]))
    assert rig.node.driver.prepare([ref])[ref.uid].error == ""
    record = rig.node.driver.state.store.get(ref.uid)
    assert record is not None
    assert sharing.recorded_targets(record, rig.node.driver.state.devices) == (
        sharing.Target(device="gpu-2", uuid=rig.uuid("gpu-2"), interval="Default"),
    )
    assert rig.sharing().applied() == {rig.uuid("gpu-2"): "TimeSlicing:Default"}
    assert rig.node.driver.unprepare([ref]) == {ref.uid: ""}


def test_a_setting_that_cannot_be_reapplied_at_start_up_is_reported_per_claim(rig: Rig) -> None:
    ref = rig.node.add(
        _claim(name="c", uid=new_uid(), devices=["gpu-1"], config=[time_sliced("Long")])
    )
    assert rig.node.driver.prepare([ref])[ref.uid].error == ""
    rig.state.write_text("{}")  # the card lost its settings
    gpu1 = rig.uuid("gpu-1")
    with structlog.testing.capture_logs() as logged:
        rig.restart(wrap=lambda inner: OneShot(inner, gpu1, "timeslice"))
    problems = [(e["event"], e["problem"]) for e in logged if e["log_level"] == "error"]
    assert problems == [
        (
            "GPU sharing settings could not be recovered",
            f"claim uid {ref.uid}: device gpu-1: GPU {gpu1}: injected failure",
        )
    ]
