"""Shares of a GPU prepared through MPS: one daemon per shared GPU started with the first share
and stopped with the last, compute mode switched and restored, each share's limits in its CDI
spec, daemons adopted across restarts and restarted when they die, MPS asked by opaque config."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
import structlog

from dra_driver.devices import control
from dra_driver.driver import atomicfile
from dra_driver.driver.mps import daemons as mps
from dra_driver.driver.mps import mpsclaims, mpsprocess
from dra_driver.testing import polling

from . import sharekit
from .conftest import Node, claim_obj, gpu_config, new_uid, opaque
from .sharekit import share, share_claim


def test_shares_run_through_one_daemon_started_first_and_stopped_last(node: Node) -> None:
    gpu0 = sharekit.uuid_of(node, "gpu-0")
    a = node.add(share_claim("a", share("gpu-0", memory="20Gi", compute="25")))
    b = node.add(share_claim("b", share("gpu-0", memory="30Gi", compute="35")))

    got = node.driver.prepare([a])[a.uid]
    assert got.error == ""
    (dev,) = got.devices
    assert dev.share_id is not None and dev.device_name == "gpu-0"
    assert set(sharekit.daemon_records(node)) == {"gpu-0"}
    record = sharekit.daemon_records(node)["gpu-0"]
    assert record["state"] == "Running"
    assert record["startTime"] == mpsprocess.start_time(record["pid"])  # tells a reused pid apart
    assert record["devices"] == [{"name": "gpu-0", "uuid": gpu0, "kind": "gpu"}]
    assert sharekit.daemon_pids(node) == {"gpu-0": record["pid"]}
    assert sharekit.exclusive_gpus(node) == {gpu0}
    pipe = sharekit.mps_root(node) / "gpu-0" / "pipe"
    assert (pipe / "control").exists()
    assert "Control daemon started" in (pipe.parent / "log" / "control.log").read_text()

    env = sharekit.spec_env(node, a.uid, "gpu-0")
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{gpu0}=20480M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert sharekit.spec_mounts(node, a.uid, "gpu-0") == {
        "/tmp/nvidia-mps": str(pipe),
        "/dev/shm": str(pipe.parent / "shm"),
    }

    # The second share joins the running daemon (same pid), with its own limits.
    assert node.driver.prepare([b])[b.uid].error == ""
    assert sharekit.daemon_pids(node) == {"gpu-0": record["pid"]}
    env_b = sharekit.spec_env(node, b.uid, "gpu-0")
    assert env_b["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{gpu0}=30720M"
    assert env_b["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "35"

    assert node.driver.unprepare([a]) == {a.uid: ""}
    assert sharekit.daemon_pids(node) == {"gpu-0": record["pid"]}  # b still uses it
    assert sharekit.exclusive_gpus(node) == {gpu0}

    assert node.driver.unprepare([b]) == {b.uid: ""}  # the last share: daemon gone
    assert sharekit.daemon_records(node) == {}
    assert polling.poll(lambda: sharekit.daemon_pids(node) == {})
    assert sharekit.compute_modes(node) == {gpu0: "Default"}
    assert sharekit.daemon_dirs(node) == set()
    assert not pipe.exists()
    assert node.spec_files() == []


def test_share_of_the_whole_gpu_is_prepared_like_an_exclusive_gpu(node: Node) -> None:
    whole = node.add(share_claim("whole", share("gpu-1", memory="80Gi", compute="0")))
    got = node.driver.prepare([whole])[whole.uid]
    assert got.error == ""
    assert got.devices[0].share_id is not None
    assert sharekit.daemon_records(node) == {} and sharekit.compute_modes(node) == {}
    assert "CUDA_MPS_PIPE_DIRECTORY" not in sharekit.spec_env(node, whole.uid, "gpu-1")
    # ... but a compute cap needs MPS even with all the memory.
    capped = node.add(share_claim("capped", share("gpu-2", memory="80Gi", compute="40")))
    assert node.driver.prepare([capped])[capped.uid].error == ""
    env = sharekit.spec_env(node, capped.uid, "gpu-2")
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "40"
    assert set(sharekit.daemon_records(node)) == {"gpu-2"}
    assert node.driver.unprepare([whole, capped]) == {whole.uid: "", capped.uid: ""}
    assert sharekit.daemon_records(node) == {}


def test_two_shares_of_one_gpu_in_one_claim_add_up(node: Node) -> None:
    gpu3 = sharekit.uuid_of(node, "gpu-3")
    ref = node.add(
        share_claim(
            "two",
            share("gpu-3", memory="10Gi", compute="20"),
            share("gpu-3", memory="6Gi", compute="10"),
        )
    )
    got = node.driver.prepare([ref])[ref.uid]
    assert got.error == ""
    assert len({d.share_id for d in got.devices}) == 2
    env = sharekit.spec_env(node, ref.uid, "gpu-3")
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{gpu3}=16384M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert node.driver.unprepare([ref]) == {ref.uid: ""}


def test_unprepared_claims_leave_no_daemon_even_after_a_restart(node: Node) -> None:
    ref = node.add(share_claim("r", share("gpu-4", memory="8Gi")))
    assert node.driver.prepare([ref])[ref.uid].error == ""
    pid = sharekit.daemon_pids(node)["gpu-4"]

    node.restart()  # a new agent process over the same disk: the daemon is adopted
    assert sharekit.daemon_pids(node) == {"gpu-4": pid}
    assert sharekit.daemon_records(node)["gpu-4"]["pid"] == pid
    assert node.driver.prepare([ref])[ref.uid].error == ""  # from the checkpoint
    assert sharekit.daemon_pids(node) == {"gpu-4": pid}

    assert node.driver.unprepare([ref]) == {ref.uid: ""}  # the adopted daemon is stopped
    assert polling.poll(lambda: sharekit.daemon_pids(node) == {})
    assert sharekit.daemon_records(node) == {}
    assert sharekit.exclusive_gpus(node) == set()


def test_a_daemon_that_died_is_restarted_by_supervision_and_recovery(node: Node) -> None:
    ref = node.add(share_claim("s", share("gpu-5", memory="4Gi")))
    assert node.driver.prepare([ref])[ref.uid].error == ""
    assert node.driver.state.mps is not None
    daemons = node.driver.state.mps.daemons
    first = sharekit.daemon_pids(node)["gpu-5"]
    os.kill(first, signal.SIGKILL)
    # Wait on what supervision itself reads: a process that lost its environment is still
    # exiting (not yet a zombie) and counts as alive until it is.
    assert polling.poll(lambda: not daemons.processes.alive(first, None))
    assert daemons.supervise() == ["gpu-5"]
    second = sharekit.daemon_pids(node)["gpu-5"]
    assert second != first
    assert daemons.supervise() == []  # healthy: nothing to do

    os.kill(second, signal.SIGKILL)
    assert polling.poll(lambda: not daemons.processes.alive(second, None))
    node.restart()  # recovery brings back the daemon of a prepared share
    assert set(sharekit.daemon_pids(node)) == {"gpu-5"}
    # Stray daemon directories go; the records and the lock files (another agent may hold
    # one during a rolling update) stay.
    assert {p.name for p in sharekit.mps_root(node).iterdir()} == {"daemons", "locks", "gpu-5"}
    assert node.driver.unprepare([ref]) == {ref.uid: ""}


def test_recovery_stops_a_daemon_no_claim_uses(node: Node) -> None:
    ref = node.add(share_claim("o", share("gpu-6", memory="4Gi")))
    assert node.driver.prepare([ref])[ref.uid].error == ""
    (node.claims_dir / f"{ref.uid}.json").unlink()  # its claim is forgotten (e.g. other boot)
    node.restart()
    assert polling.poll(lambda: sharekit.daemon_pids(node) == {})
    assert sharekit.daemon_records(node) == {}
    assert sharekit.exclusive_gpus(node) == set()
    assert sharekit.daemon_dirs(node) == set()


def test_mps_asked_by_config_on_an_exclusive_claim_gets_its_own_daemon(node: Node) -> None:
    g0, g1 = sharekit.uuid_of(node, "gpu-0"), sharekit.uuid_of(node, "gpu-1")
    params = gpu_config(
        sharing={
            "strategy": "MPS",
            "mps": {
                "activeThreadPercentage": 50,
                "pinnedDeviceMemoryLimit": "8Gi",
                "perDevicePinnedMemoryLimits": {"1": "2Gi"},
            },
        }
    )
    ref = node.add(
        claim_obj(name="x", uid=new_uid(), devices=["gpu-0", "gpu-1"], config=[opaque(params)])
    )
    assert node.driver.prepare([ref])[ref.uid].error == ""
    daemon = f"claim-{ref.uid}"
    assert set(sharekit.daemon_records(node)) == {daemon}
    # What recovery reads back from the claim records: one daemon, both devices, once each.
    records = node.driver.state.store.records()
    assert mpsclaims.recorded_daemons(records + records, node.driver.state.devices) == {
        daemon: [
            mps.DaemonDevice(name="gpu-0", uuid=g0, kind="gpu"),
            mps.DaemonDevice(name="gpu-1", uuid=g1, kind="gpu"),
        ]
    }
    assert sharekit.daemon_records(node)[daemon]["devices"] == [
        {"name": "gpu-0", "uuid": g0, "kind": "gpu"},
        {"name": "gpu-1", "uuid": g1, "kind": "gpu"},
    ]
    assert sharekit.exclusive_gpus(node) == {g0, g1}
    for device in ("gpu-0", "gpu-1"):
        env = sharekit.spec_env(node, ref.uid, device)
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{g0}=8192M,{g1}=2048M"
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert set(sharekit.daemon_dirs(node)) == {mps.dir_name(daemon)}
    assert node.driver.unprepare([ref]) == {ref.uid: ""}
    assert sharekit.daemon_records(node) == {}
    assert sharekit.compute_modes(node) == {g0: "Default", g1: "Default"}


def test_nvidia_mps_config_works_unchanged(node: Node) -> None:
    params = {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 20}},
    }
    ref = node.add(claim_obj(name="nv", uid=new_uid(), devices=["gpu-7"], config=[opaque(params)]))
    assert node.driver.prepare([ref])[ref.uid].error == ""
    assert sharekit.spec_env(node, ref.uid, "gpu-7")["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "20"
    assert node.driver.unprepare([ref]) == {ref.uid: ""}


@pytest.mark.parametrize(
    ("results", "config", "expect"),
    [
        (
            [share("gpu-0"), share("gpu-1")],
            None,
            "would need 2 MPS control daemons (gpu-0, gpu-1)",
        ),
        (
            [share("gpu-0")],
            gpu_config(sharing={"strategy": "TimeSlicing"}),
            "its limits are enforced with MPS, so sharing strategy TimeSlicing cannot be applied",
        ),
        (
            [{**share("gpu-0"), "consumedCapacity": {"memory": "lots"}}],
            None,
            "consumedCapacity[memory] 'lots' is not a quantity",
        ),
        (
            [share("gpu-0", compute="150")],
            None,
            "consumedCapacity[computeShare] 150 is above 100",
        ),
    ],
)
def test_share_claims_that_cannot_work_fail_alone(
    node: Node, results: list[dict[str, object]], config: dict[str, object] | None, expect: str
) -> None:
    bad = node.add(
        share_claim("bad", *results, config=[opaque(config)] if config is not None else None)
    )
    good = node.add(share_claim("good", share("gpu-2", memory="2Gi")))
    got = node.driver.prepare([bad, good])
    assert got[good.uid].error == ""
    assert "ResourceClaim default/bad" in got[bad.uid].error
    assert expect in got[bad.uid].error
    assert set(sharekit.daemon_records(node)) == {"gpu-2"}
    assert node.spec_files() == [f"k8s.gpu.nvidia.com-claim_{good.uid}.json"]
    assert node.driver.unprepare([good]) == {good.uid: ""}


def test_one_gpu_cannot_run_two_daemons_or_mps_and_time_slicing(node: Node) -> None:
    shared = node.add(share_claim("shared", share("gpu-0", memory="2Gi")))
    assert node.driver.prepare([shared])[shared.uid].error == ""
    mps_cfg = opaque(gpu_config(sharing={"strategy": "MPS"}))
    admin = claim_obj(name="admin", uid=new_uid(), devices=["gpu-0"], config=[mps_cfg])
    admin["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
    admin_ref = node.add(admin)
    error = node.driver.prepare([admin_ref])[admin_ref.uid].error
    assert "device gpu-0 is already served by MPS control daemon gpu-0" in error
    sliced = claim_obj(
        name="ts",
        uid=new_uid(),
        devices=["gpu-0"],
        config=[opaque(gpu_config(sharing={"strategy": "TimeSlicing"}))],
    )
    sliced["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
    sliced_ref = node.add(sliced)
    error = node.driver.prepare([sliced_ref])[sliced_ref.uid].error
    assert "runs MPS control daemon gpu-0; it cannot be time-sliced" in error
    assert set(sharekit.daemon_records(node)) == {"gpu-0"}
    assert node.driver.unprepare([shared]) == {shared.uid: ""}
    assert sharekit.daemon_records(node) == {}


def test_a_daemon_that_does_not_come_up_fails_the_claim_and_undoes_everything(
    node_factory: Callable[..., Node],
) -> None:
    node = node_factory()
    assert node.driver.state.mps is not None
    daemons = node.driver.state.mps.daemons
    daemons.processes.command = (
        "/bin/sh",
        "-c",
        "echo 'cannot open /dev/nvidiactl' >&2; exit 3",
        "x",
    )
    ref = node.add(share_claim("broken", share("gpu-0", memory="2Gi")))
    error = node.driver.prepare([ref])[ref.uid].error
    assert "cannot start MPS control daemon gpu-0" in error
    assert "the daemon exited at start: cannot open /dev/nvidiactl" in error
    assert sharekit.daemon_records(node) == {}
    assert sharekit.compute_modes(node) == {sharekit.uuid_of(node, "gpu-0"): "Default"}
    assert node.spec_files() == [] and not list(node.claims_dir.glob("*.json"))


def test_an_unreadable_daemon_record_is_removed_and_its_daemon_ended(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = node.add(share_claim("u", share("gpu-3", memory="4Gi")))
    assert node.driver.prepare([ref])[ref.uid].error == ""
    pid = sharekit.daemon_pids(node)["gpu-3"]
    (node.claims_dir / f"{ref.uid}.json").unlink()  # nothing wants the daemon any more
    record = sharekit.mps_root(node) / "daemons" / "gpu-3.json"
    record.write_text("{not json")
    removed: list[tuple[str, bool]] = []
    real_remove = atomicfile.remove

    def remove(path: object, *, durable: bool = True) -> bool:
        removed.append((str(path), durable))
        return real_remove(path, durable=durable)  # type: ignore[arg-type]

    monkeypatch.setattr(atomicfile, "remove", remove)
    ended: list[tuple[int, int | None]] = []
    real_end = mpsprocess.Processes.end

    def end(self: mpsprocess.Processes, pipe: Path, pid: int, start_time: int | None) -> None:
        ended.append((pid, start_time))
        real_end(self, pipe, pid, start_time)

    monkeypatch.setattr(mpsprocess.Processes, "end", end)
    with structlog.testing.capture_logs() as logged:
        node.restart()
    assert ended == [(pid, None)]  # found by its marker: no start time to go by
    [line] = [e for e in logged if e["log_level"] == "error"]
    assert line["event"] == (
        "unreadable MPS daemon record removed; its daemon is ended, but the compute mode of its "
        "GPU is unknown and may still be ExclusiveProcess"
    )
    assert line["file"] == str(record) and line["daemon_pid"] == pid
    assert (str(record), False) in removed  # never fsynced: means nothing after a reboot
    assert polling.poll(lambda: sharekit.daemon_pids(node) == {})
    assert not record.exists() and sharekit.daemon_dirs(node) == set()


def test_mps_on_a_dynamic_mig_device_is_refused_naming_it(
    node_factory: Callable[..., Node],
) -> None:
    mig_node = node_factory("h100-mig", dynamic_mig="all")
    params = gpu_config(sharing={"strategy": "MPS", "mps": {"activeThreadPercentage": 50}})
    device = "gpu-0-mig-1g-10gb-0"
    mps_claim = claim_obj(name="m", uid=new_uid(), devices=[device], config=[opaque(params)])
    ref = mig_node.add(mps_claim)
    error = mig_node.driver.prepare([ref])[ref.uid].error
    assert f"device {device} is a dynamic MIG device" in error
    assert "MPS on it is not supported" in error
    assert sharekit.daemon_records(mig_node) == {} and mig_node.spec_files() == []
    # Without MPS the same device is prepared.
    plain = mig_node.add(claim_obj(name="p", uid=new_uid(), devices=[device]))
    assert mig_node.driver.prepare([plain])[plain.uid].error == ""
    assert mig_node.driver.unprepare([plain]) == {plain.uid: ""}


def test_a_daemon_is_stopped_as_the_process_its_record_names(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = node.add(share_claim("s", share("gpu-2", memory="4Gi")))
    assert node.driver.prepare([ref])[ref.uid].error == ""
    assert node.driver.state.mps is not None
    daemons = node.driver.state.mps.daemons
    record = sharekit.daemon_records(node)["gpu-2"]
    ended: list[tuple[int, int | None]] = []
    real_end = daemons.processes.end

    def end(pipe: object, pid: int, start_time: int | None) -> None:
        ended.append((pid, start_time))
        real_end(pipe, pid, start_time)  # type: ignore[arg-type]

    removed: list[tuple[str, bool]] = []
    real_remove = atomicfile.remove

    def remove(path: object, *, durable: bool = True) -> bool:
        removed.append((str(path), durable))
        return real_remove(path, durable=durable)  # type: ignore[arg-type]

    monkeypatch.setattr(daemons.processes, "end", end)
    monkeypatch.setattr(atomicfile, "remove", remove)
    assert node.driver.unprepare([ref]) == {ref.uid: ""}
    assert ended == [(record["pid"], record["startTime"])]
    # Daemon records are never fsynced: a record means nothing after a reboot.
    assert (str(sharekit.mps_root(node) / "daemons" / "gpu-2.json"), False) in removed
    assert daemons._log_tail(daemons.dirs("never-started")) == "no output"


def test_a_failed_start_whose_undo_fails_too_is_one_clear_claim_error(
    node_factory: Callable[..., Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    node = node_factory()
    assert node.driver.state.mps is not None
    daemons = node.driver.state.mps.daemons
    daemons.processes.command = ("/bin/sh", "-c", "echo 'no /dev/nvidiactl' >&2; exit 3", "x")
    gpu_control = daemons.gpu_control
    assert gpu_control is not None
    real_set = gpu_control.set_compute_mode

    def set_mode(uuid: str, mode: control.ComputeMode) -> None:
        if mode == "Default":
            raise control.ControlError(f"GPU {uuid}: GPU is lost")
        real_set(uuid, mode)

    monkeypatch.setattr(gpu_control, "set_compute_mode", set_mode)
    ref = node.add(share_claim("broken", share("gpu-0", memory="2Gi")))
    error = node.driver.prepare([ref])[ref.uid].error
    assert error == (
        f"{ref}: cannot start MPS control daemon gpu-0: the daemon exited at start: "
        "no /dev/nvidiactl"
    )
    # The undo that failed left the record (Stopping): the next start-up finishes the job.
    assert sharekit.daemon_records(node)["gpu-0"]["state"] == "Stopping"


def test_a_daemon_that_cannot_be_restarted_is_logged_and_left(node: Node) -> None:
    ref = node.add(share_claim("s", share("gpu-4", memory="4Gi")))
    assert node.driver.prepare([ref])[ref.uid].error == ""
    assert node.driver.state.mps is not None
    daemons = node.driver.state.mps.daemons
    first = sharekit.daemon_pids(node)["gpu-4"]
    os.kill(first, signal.SIGKILL)
    assert polling.poll(lambda: not daemons.processes.alive(first, None))
    daemons.processes.command = ("/bin/sh", "-c", "exit 3", "x")
    with structlog.testing.capture_logs() as logged:
        assert daemons.supervise() == []
    errors = [(e["event"], e.get("daemon")) for e in logged if e["log_level"] == "error"]
    assert errors == [
        ("MPS daemon died; restarting it", "gpu-4"),
        ("cannot restart MPS daemon", "gpu-4"),
    ]
    [failed] = [e for e in logged if e["event"] == "cannot restart MPS daemon"]
    assert failed["error"] == (
        "supervision: cannot start MPS control daemon gpu-4: the daemon exited at start: no output"
    )
    # Start-up recovery tries too, and reports the daemon it could not bring back.
    mps_claims = node.driver.state.mps
    assert mps_claims.recover(node.driver.state.store.records()) == [
        "recovery: cannot start MPS control daemon gpu-4: the daemon exited at start: no output"
    ]


def test_a_zero_thread_percentage_is_passed_on_as_zero(tmp_path: Path) -> None:
    dirs = mps.Dirs(
        root=tmp_path, pipe=tmp_path / "pipe", log=tmp_path / "log", shm=tmp_path / "shm"
    )
    gpu = mps.DaemonDevice(name="gpu-0", uuid="GPU-a", kind="gpu")
    edits = mpsclaims.edits([mpsclaims.Need("claim-x", gpu, 1 << 30, 0)], dirs=dirs)
    assert edits["env"] == [
        "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=GPU-a=1024M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=0",
    ]


def test_a_per_device_limit_for_no_device_of_the_claim_names_the_claims_devices(
    node: Node,
) -> None:
    g0, g1 = sharekit.uuid_of(node, "gpu-0"), sharekit.uuid_of(node, "gpu-1")
    params = gpu_config(
        sharing={"strategy": "MPS", "mps": {"perDevicePinnedMemoryLimits": {"2": "2Gi"}}}
    )
    ref = node.add(
        claim_obj(name="x", uid=new_uid(), devices=["gpu-0", "gpu-1"], config=[opaque(params)])
    )
    error = node.driver.prepare([ref])[ref.uid].error
    assert error.endswith(
        ": mps.perDevicePinnedMemoryLimits key '2' names no device of this claim that uses MPS "
        f"(UUIDs {g0}, {g1}, or an index below 2)"
    ), error
    assert sharekit.daemon_records(node) == {} and node.spec_files() == []


def test_an_unreadable_daemon_record_without_a_daemon_is_removed(node: Node) -> None:
    ref = node.add(share_claim("u", share("gpu-3", memory="4Gi")))
    assert node.driver.prepare([ref])[ref.uid].error == ""
    (node.claims_dir / f"{ref.uid}.json").unlink()  # nothing wants the daemon any more
    sharekit.kill_daemons(node)
    record = sharekit.mps_root(node) / "daemons" / "gpu-3.json"
    record.write_text("{not json")
    node.restart()
    assert not record.exists() and sharekit.daemon_dirs(node) == set()


def test_records_of_an_earlier_boot_are_dropped_and_this_boots_kept(node: Node) -> None:
    ref = node.add(share_claim("s", share("gpu-3", memory="4Gi")))
    assert node.driver.prepare([ref])[ref.uid].error == ""
    daemons_dir = sharekit.mps_root(node) / "daemons"
    old = dict(sharekit.daemon_records(node)["gpu-3"], id="gpu-4", bootId="boot-0", pid=1)
    for name in ("gpu-4", "gpu-5"):  # after gpu-3.json, which is of this boot
        (daemons_dir / f"{name}.json").write_text(json.dumps(dict(old, id=name)))
        (sharekit.mps_root(node) / name / "pipe").mkdir(parents=True)
    node.restart()
    assert sorted(p.name for p in daemons_dir.iterdir()) == ["gpu-3.json"]
    assert sharekit.daemon_dirs(node) == {"gpu-3"}
    assert set(sharekit.daemon_pids(node)) == {"gpu-3"}  # adopted, still serving its claim
    assert node.driver.unprepare([ref]) == {ref.uid: ""}
