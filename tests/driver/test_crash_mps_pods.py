"""Crash at every step of starting and stopping an MPS daemon Pod: no orphan Pod, no GPU left in
ExclusiveProcess, every prepared share's daemon Pod adopted.

As in ``test_crash_shares.py``, a forked child runs prepare/unprepare and dies right before its
N-th effect, for N = 0, 1, ... until it gets through. The effects counted here are the file
operations (fsync, link, pwrite, rename, replace, unlink) *and* the daemon's outside effects:
each Pod create and delete sent to the API server and each ``quit`` sent to a daemon. The API
server runs in this process (over real HTTP), with the test kubelet running its Pods, so the
Pods outlive the child as they outlive a SIGKILLed agent; the child talks to it with the real
client. After each crash the driver is rebuilt from disk (recovery adopts, restarts or deletes
daemon Pods) and the invariants are checked.
"""

from __future__ import annotations

import dataclasses
import json
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver import app, logs
from dra_driver.devices import fake
from dra_driver.driver import checkpoint, claims
from dra_driver.driver import driver as driver_mod
from dra_driver.driver.mps import mpspodspec, mpsprocess
from dra_driver.kube import client
from dra_driver.kube.objectclient import ObjectClient
from dra_driver.kube.objects import PODS
from dra_driver.testing.fakeapi import fakeserver, memory
from dra_driver.testing.podrunner import PodKubelet
from dra_driver.testing.polling import poll

from . import podkit
from .conftest import DRIVER, NODE, make_driver_root, ref_of
from .sharekit import share, share_claim
from .test_crash_points import CRASHED

FILE_OPS = ("fsync", "link", "pwrite", "rename", "replace", "unlink", "write")


@dataclasses.dataclass
class Rig:
    mem: memory.InMemoryApi
    server: fakeserver.FakeApiServer
    kubelet: PodKubelet
    settings: app.PluginSettings
    kubeconfig: Path

    def build(self) -> driver_mod.Driver:
        """The agent's core as a fresh process would build it: a new client, recovery."""
        api = client.KubeClient.connect(self.kubeconfig)
        devices = fake.FakeBackend.from_name("dgx-h100").discover()
        return app.build_driver(self.settings, devices=devices, api=api, log=logs.get("test"))

    @property
    def plugin_dir(self) -> Path:
        return self.settings.plugin_dir

    def pods(self) -> dict[str, dict[str, Any]]:
        return {p["metadata"]["name"]: p for p in self.mem.objects.all(PODS)}

    def json_files(self, folder: str) -> dict[str, Any]:
        return {
            p.stem: json.loads(p.read_text()) for p in (self.plugin_dir / folder).glob("*.json")
        }

    def modes(self) -> dict[str, str]:
        path = self.plugin_dir / "fake-gpu-control.json"
        state = json.loads(path.read_text()) if path.exists() else {}
        return {u: s["computeMode"] for u, s in state.items()}


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    (tmp_path / "boot_id").write_text("boot-1\n")
    settings = app.PluginSettings(
        node_name=NODE,
        driver_name=DRIVER,
        registry_dir=tmp_path / "registry",
        plugins_dir=tmp_path / "plugins",
        cdi_root=tmp_path / "cdi",
        driver_root=make_driver_root(tmp_path / "driver-root"),
        fake=True,
        boot_id_file=tmp_path / "boot_id",
        cleanup_interval_s=0,
        publish=False,
        **podkit.POD_SETTINGS,
    )
    mem = memory.InMemoryApi(use_default_cel=False)
    mem.put_node(NODE, uid=str(uuid.uuid4()))
    mem.put_namespace(podkit.NAMESPACE)
    with fakeserver.FakeApiServer(mem) as server:
        kubelet = PodKubelet(mem.objects, node_name=NODE, base=tmp_path / "pods").start()
        try:
            yield Rig(mem, server, kubelet, settings, server.write_kubeconfig(tmp_path / "kc"))
        finally:
            kubelet.stop(kill=True)


def _run_child(rig: Rig, crash_at: int, work: Callable[[driver_mod.Driver], None]) -> int:
    """Fork; the child builds the driver, then dies right before its ``crash_at``-th effect."""
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        try:
            driver = rig.build()
            count = [0]

            def counting(real: Callable[..., Any]) -> Callable[..., Any]:
                def op(*args: Any, **kwargs: Any) -> Any:
                    if count[0] == crash_at:
                        os._exit(CRASHED)
                    count[0] += 1
                    return real(*args, **kwargs)

                return op

            for name in FILE_OPS:
                setattr(os, name, counting(getattr(os, name)))
            for cls, name in (
                (ObjectClient, "create"),
                (ObjectClient, "delete"),
                (mpsprocess.Processes, "quit"),
            ):
                setattr(cls, name, counting(getattr(cls, name)))
            work(driver)
        except BaseException:
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _check(rig: Rig, driver: driver_mod.Driver) -> None:
    """No orphan Pod, no GPU in ExclusiveProcess that no prepared share's daemon serves."""
    records = rig.json_files("claims")
    assert all(r["state"] == checkpoint.PREPARE_COMPLETED for r in records.values())
    wanted = {d["mpsDaemon"] for r in records.values() for d in r["devices"] if d["mpsDaemon"]}
    daemons = rig.json_files("mps/daemons")
    assert {d["id"] for d in daemons.values()} == wanted
    assert all(d["state"] == "Running" for d in daemons.values())
    pods = rig.pods()
    assert {p: v["metadata"]["uid"] for p, v in pods.items()} == {
        d["pod"]: d["podUid"] for d in daemons.values()
    }
    assert set(pods) == {mpspodspec.pod_name(DRIVER, NODE, d) for d in wanted}
    assert poll(lambda: set(rig.kubelet.running()) == set(pods))
    served = {dev["uuid"] for d in daemons.values() for dev in d["devices"]}
    assert {u for u, m in rig.modes().items() if m == "ExclusiveProcess"} == served
    # Every prepared share's daemon answers where its CDI spec points.
    for name in wanted:
        assert (driver.state.mps.daemons.dirs(name).pipe / "control").is_socket()  # type: ignore[union-attr]


@pytest.mark.parametrize("scenario", ["prepare", "unprepare"])
def test_a_crash_at_any_step_of_a_daemon_pod_leaves_no_orphan_pod_or_exclusive_gpu(
    rig: Rig, scenario: str
) -> None:
    objs = [
        share_claim("first", share("gpu-0", memory="20Gi", compute="30")),
        share_claim("second", share("gpu-0", memory="30Gi")),
    ]
    for obj in objs:
        rig.mem.put_resource_claim(obj)
    refs: list[claims.ClaimRef] = [ref_of(o) for o in objs]
    driver = rig.build()
    if scenario == "unprepare":
        assert {r.error for r in driver.prepare(refs).values()} == {""}
    driver.close()

    def work(child: driver_mod.Driver) -> None:
        if scenario == "prepare":
            results = child.prepare(refs)
            assert {r.error for r in results.values()} == {""}
        else:
            assert set(child.unprepare(refs).values()) == {""}

    crash_at, pod_uids = 0, set()
    while (code := _run_child(rig, crash_at, work)) == CRASHED:
        driver = rig.build()
        _check(rig, driver)
        pod_uids |= {p["metadata"]["uid"] for p in rig.pods().values()}
        if scenario == "prepare":  # back to the start: nothing prepared
            assert set(driver.unprepare(refs).values()) == {""}
            assert rig.pods() == {}
        else:
            assert {r.error for r in driver.prepare(refs).values()} == {""}
            assert len(rig.pods()) == 1
        driver.close()
        crash_at += 1
    assert code == 0, f"the child failed without a crash at step {crash_at}"
    # Each claim's own windows (7 to prepare, 4 to unprepare, as in test_crash_points) and the
    # daemon's: record Starting, compute mode, Pod create, record Running (prepare); record
    # Stopping, quit, Pod delete, compute mode, files removed (unprepare).
    assert crash_at >= (2 * 7 + 4 if scenario == "prepare" else 2 * 4 + 5), crash_at
    driver = rig.build()
    _check(rig, driver)
    assert len(rig.pods()) == (1 if scenario == "prepare" else 0)
    assert set(driver.unprepare(refs).values()) == {""}
    assert rig.pods() == {} and rig.json_files("mps/daemons") == {}
    assert "ExclusiveProcess" not in rig.modes().values()
    assert poll(lambda: rig.kubelet.running() == {})
    driver.close()
