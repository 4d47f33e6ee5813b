"""Passthrough through the driver core on the fake kernel: a claim for gpu-vfio-N moves its GPU
to vfio-pci with a CDI spec of exactly its /dev/vfio nodes, unprepare gives it back, a restart
keeps a prepared claim's GPU, and a crash before any durable write or sysfs write of prepare or
unprepare leaves, after the restart, no GPU on vfio-pci without a prepared claim."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver import app, logs
from dra_driver.devices import fake, model, passthrough, vfiohost
from dra_driver.devices.fake import migstate
from dra_driver.driver import checkpoint, claims
from dra_driver.driver import driver as driver_mod
from dra_driver.testing import fakesysfs
from dra_driver.testing.fakeapi import memory

NODE, DRIVER = "n1", "gpu.nvidia.com"
CRASHED = 86


@dataclasses.dataclass
class Rig:
    kernel: fakesysfs.FakeKernel
    devices: model.NodeDevices
    settings: app.PluginSettings
    api: memory.InMemoryApi
    driver: driver_mod.Driver

    def restart(self) -> driver_mod.Driver:
        self.driver.close()
        self.driver = build(self.settings, self.api, self.devices)
        return self.driver

    def claim(self, name: str, *devices: str) -> claims.ClaimRef:
        uid = f"00000000-0000-0000-0000-{abs(hash(name)) % 10**12:012d}"
        obj = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "vms", "uid": uid},
            "spec": {"devices": {"requests": [{"name": "vm", "exactly": {
                "deviceClassName": passthrough.DEVICE_CLASS, "count": len(devices)}}]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "vm", "driver": DRIVER, "pool": NODE, "device": d} for d in devices
            ], "config": []}}},
        }  # fmt: skip
        self.api.put_resource_claim(obj)
        return claims.ClaimRef(uid=uid, namespace="vms", name=name)

    def spec(self, ref: claims.ClaimRef) -> dict[str, Any]:
        path = self.driver.state.specs.spec_path(ref.uid)
        return dict(json.loads(path.read_text()))

    def on_vfio(self) -> set[str]:
        return {
            g.name for g in self.devices.gpus if self.kernel.driver_of(g.pci_bus_id) == "vfio-pci"
        }


def build(
    settings: app.PluginSettings, api: memory.InMemoryApi, devices: model.NodeDevices
) -> driver_mod.Driver:
    backend = fake.FakeBackend.from_name("dgx-h100")
    mig_control = app.mig_control_for(settings, backend)
    return app.build_driver(
        settings, devices=devices, api=api, log=logs.get("test"), mig_control=mig_control
    )


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    devices = passthrough.mark(
        fake.FakeBackend.from_name("dgx-h100").discover(), passthrough.Passthrough.parse("all")
    )
    (tmp_path / "boot_id").write_text("boot-1\n")
    settings = app.PluginSettings(
        node_name=NODE, driver_name=DRIVER, registry_dir=tmp_path / "registry",
        plugins_dir=tmp_path / "plugins", cdi_root=tmp_path / "cdi",
        driver_root=tmp_path / "none", fake=True, boot_id_file=tmp_path / "boot_id",
        cleanup_interval_s=0, publish=False, passthrough="all", vfio_root=tmp_path / "host",
    )  # fmt: skip
    api = memory.InMemoryApi(use_default_cel=False)
    with fakesysfs.running(tmp_path / "host", fakesysfs.groups_of(devices)) as kernel:
        r = Rig(kernel, devices, settings, api, build(settings, api, devices))
        yield r
        r.driver.close()


def test_prepare_binds_vfio_and_the_spec_lists_exactly_its_nodes(rig: Rig) -> None:
    ref = rig.claim("vm-1", "gpu-vfio-1")
    rig.driver.state.prepare(ref)
    assert rig.on_vfio() == {"gpu-1"}
    spec = rig.spec(ref)
    group = rig.devices.gpus[1].iommu_group
    [device] = spec["devices"]
    assert [n["path"] for n in device["containerEdits"]["deviceNodes"]] == [
        f"/dev/vfio/{group}",
        "/dev/vfio/vfio",
    ]
    common = spec["containerEdits"]
    assert "NVIDIA_VISIBLE_DEVICES=void" in common["env"]
    assert "deviceNodes" not in common  # no /dev/nvidiactl for a VM
    meta = [
        m
        for m in device["containerEdits"].get("mounts", [])
        if "dra-device-attributes" in m["containerPath"]
    ]
    kep = json.loads(Path(meta[0]["hostPath"]).read_text())
    attrs = kep["requests"][0]["devices"][0]["attributes"]
    assert attrs["resource.kubernetes.io/pciBusID"] == {"string": rig.devices.gpus[1].pci_bus_id}
    assert attrs["type"] == {"string": "vfio"}
    assert rig.driver.state.vfio is not None
    assert rig.driver.state.vfio.passed_through() == {rig.devices.gpus[1].uuid}
    assert rig.driver.state.held.claims() == {ref.uid: {"gpu-1"}} or "gpu-1" in str(
        rig.driver.state.held.claims()
    )
    rig.driver.state.unprepare(ref)
    assert rig.on_vfio() == set()
    assert rig.driver.state.vfio.passed_through() == frozenset()
    assert rig.driver.state.specs.claim_uids_on_disk() == []


def test_a_restart_keeps_a_prepared_claims_gpu_on_vfio(rig: Rig) -> None:
    ref = rig.claim("vm-1", "gpu-vfio-0")
    first = rig.driver.state.prepare(ref)
    driver = rig.restart()
    assert rig.on_vfio() == {"gpu-0"}
    assert driver.state.prepare(ref) == first  # answered from the checkpoint
    driver.state.unprepare(ref)
    assert rig.on_vfio() == set()


def test_a_claim_mixing_vm_and_container_devices_is_refused(rig: Rig) -> None:
    ref = rig.claim("mixed", "gpu-vfio-0", "gpu-1")
    with pytest.raises(claims.ClaimError, match="mixes passthrough devices"):
        rig.driver.state.prepare(ref)
    assert rig.on_vfio() == set()


def test_prepare_refuses_one_gpu_to_a_vm_claim_and_a_container_claim(rig: Rig) -> None:
    """The last line of defence, should the scheduler ever hand out both: ownership."""
    pod = rig.claim("pod", "gpu-0")
    rig.driver.state.prepare(pod)
    vm = rig.claim("vm", "gpu-vfio-0")
    with pytest.raises(claims.ClaimError, match="already prepared"):
        rig.driver.state.prepare(vm)
    assert rig.on_vfio() == set()
    rig.driver.state.unprepare(pod)
    rig.driver.state.prepare(vm)
    assert rig.on_vfio() == {"gpu-0"}
    with pytest.raises(claims.ClaimError, match="already prepared"):
        rig.driver.state.prepare(pod)
    rig.driver.state.unprepare(vm)


def test_a_gpu_running_a_process_is_refused_naming_it(rig: Rig) -> None:
    state = migstate.MigState({}, state_file=rig.settings.fake_mig_state)
    rig.restart()  # the state file exists from now on
    gpu = rig.devices.gpus[2]
    state.add_process(gpu.uuid, pid=31337)
    ref = rig.claim("busy", "gpu-vfio-2")
    with pytest.raises(claims.ClaimError) as err:
        rig.driver.state.prepare(ref)
    assert "31337" in str(err.value) and gpu.pci_bus_id in str(err.value)
    assert rig.on_vfio() == set()
    assert rig.driver.state.store.get(ref.uid) is None


def _crash_child(crash_at: int, work: Callable[[], None]) -> int:
    pid = os.fork()
    if pid == 0:
        count = [0]
        real = {
            n: getattr(os, n) for n in ("fsync", "link", "pwrite", "rename", "replace", "unlink")
        }
        real_attr = vfiohost.write_attribute

        def gate() -> None:
            if count[0] == crash_at:
                os._exit(CRASHED)
            count[0] += 1

        def counting(name: str) -> Callable[..., Any]:
            def op(*args: Any, **kwargs: Any) -> Any:
                gate()
                return real[name](*args, **kwargs)

            return op

        def attr(path: Path, text: str) -> None:
            gate()
            real_attr(path, text)

        for name in real:
            setattr(os, name, counting(name))
        vfiohost.write_attribute = attr  # type: ignore[assignment]
        try:
            work()
        except BaseException:
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _consistent(rig: Rig, ref: claims.ClaimRef) -> bool:
    """After a restart: the GPU is on vfio-pci exactly when the claim is prepared."""
    driver = rig.restart()
    record = driver.state.store.get(ref.uid)
    prepared = record is not None and record.state == checkpoint.PREPARE_COMPLETED
    assert rig.on_vfio() == ({"gpu-0"} if prepared else set()), (prepared, rig.kernel.events[-3:])
    return prepared


def test_killed_at_every_point_of_prepare_and_unprepare(rig: Rig) -> None:
    ref = rig.claim("vm-1", "gpu-vfio-0")
    rig.driver.close()
    for phase in ("prepare", "unprepare"):
        steps = 0
        while True:
            if phase == "unprepare":
                rig.restart().state.prepare(ref)
                rig.driver.close()

            def work(phase: str = phase) -> None:
                driver = build(rig.settings, rig.api, rig.devices)
                if phase == "prepare":
                    driver.state.prepare(ref)
                else:
                    driver.state.unprepare(ref)

            code = _crash_child(steps, work)
            prepared = _consistent(rig, ref)
            if code == 0:
                assert prepared == (phase == "prepare")
                rig.driver.state.unprepare(ref)
                assert rig.on_vfio() == set()
                break
            assert code == CRASHED
            rig.driver.state.unprepare(ref)  # the kubelet's retry: always succeeds
            assert rig.on_vfio() == set()
            rig.driver.close()
            steps += 1
        assert steps >= 5, phase
    rig.driver = build(rig.settings, rig.api, rig.devices)
