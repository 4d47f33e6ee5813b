"""The real agent passes GPUs through on the fake kernel (real files, symlinks and FIFOs under a
temp root): prepare over the kubelet's gRPC moves the GPU's driver link to vfio-pci and writes a
CDI spec of exactly its /dev/vfio nodes, unprepare moves it back; a GPU in use gets the claim
one error line naming the GPU and the processes, nothing half-done; and SIGKILL at every
bind/unbind of prepare and unprepare (before and after the kernel acts) leaves, after a restart,
no GPU on vfio-pci without a prepared claim, and a prepared claim still prepared."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.devices import fake, passthrough
from dra_driver.devices.fake import migstate
from dra_driver.driver import claims
from dra_driver.testing import fakesysfs
from dra_driver.testing.fakeapi import fakeserver
from dra_driver.testing.kubeletsim import KubeletSim, PluginProcess

from .claimkit import put_claim

DEVICES = passthrough.mark(
    fake.FakeBackend.from_name("dgx-h100").discover(), passthrough.Passthrough.parse("all")
)
GPU0 = DEVICES.gpus[0]


@pytest.fixture
def kernel(short_dir: Path) -> Iterator[fakesysfs.FakeKernel]:
    with fakesysfs.running(short_dir / "host", fakesysfs.groups_of(DEVICES)) as k:
        yield k


def plugin(base: Path, kubeconfig: Path, root: Path) -> PluginProcess:
    return PluginProcess(
        base=base, kubeconfig=kubeconfig, extra=["--passthrough", "all", "--vfio-root", str(root)]
    )


def claim(
    server: fakeserver.FakeApiServer, name: str, device: str = "gpu-vfio-0"
) -> claims.ClaimRef:
    return put_claim(
        server, name, [device], "vm", namespace="vms", device_class="vfio.gpu.nvidia.com"
    )


def prepare(p: PluginProcess, ref: claims.ClaimRef) -> str:
    kubelet = KubeletSim(p.registry_dir)
    try:
        kubelet.register("gpu.nvidia.com")
        return str(kubelet.prepare([ref]).claims[ref.uid].error)
    finally:
        kubelet.close()


def unprepare(p: PluginProcess, ref: claims.ClaimRef) -> str:
    kubelet = KubeletSim(p.registry_dir)
    try:
        kubelet.register("gpu.nvidia.com")
        return str(kubelet.unprepare([ref]).claims[ref.uid].error)
    finally:
        kubelet.close()


def prepared(p: PluginProcess, ref: claims.ClaimRef) -> bool:
    path = p.plugins_dir / "gpu.nvidia.com" / "claims" / f"{ref.uid}.json"
    return path.exists() and json.loads(path.read_text())["state"] == "PrepareCompleted"


def spec_nodes(p: PluginProcess, ref: claims.ClaimRef) -> list[str]:
    [path] = p.cdi_root.glob(f"*{ref.uid}*.json")
    spec = json.loads(path.read_text())
    return [n["path"] for d in spec["devices"] for n in d["containerEdits"]["deviceNodes"]]


def test_prepare_and_unprepare_move_the_driver_link(
    short_dir: Path, apiserver: fakeserver.FakeApiServer, kernel: fakesysfs.FakeKernel
) -> None:
    kubeconfig = apiserver.write_kubeconfig(short_dir / "kubeconfig")
    ref = claim(apiserver, "vm-1")
    p = plugin(short_dir, kubeconfig, kernel.root).start()
    try:
        p.wait_ready()
        assert prepare(p, ref) == ""
        assert kernel.driver_of(GPU0.pci_bus_id) == "vfio-pci"
        assert spec_nodes(p, ref) == [f"/dev/vfio/{GPU0.iommu_group}", "/dev/vfio/vfio"]
        _, body = p.http_get("/metrics")
        assert f'dra_driver_gpu_passed_through{{device="gpu-0",uuid="{GPU0.uuid}"}} 1.0' in body
        assert unprepare(p, ref) == ""
        assert kernel.driver_of(GPU0.pci_bus_id) == "nvidia"
        assert list(p.cdi_root.glob(f"*{ref.uid}*")) == []
    finally:
        p.kill()


def test_a_gpu_in_use_gets_one_error_line_naming_it_and_its_processes(
    short_dir: Path, apiserver: fakeserver.FakeApiServer, kernel: fakesysfs.FakeKernel
) -> None:
    kubeconfig = apiserver.write_kubeconfig(short_dir / "kubeconfig")
    p = plugin(short_dir, kubeconfig, kernel.root).start()
    try:
        p.wait_ready()
        stand_in = migstate.MigState(
            {}, state_file=p.plugins_dir / "gpu.nvidia.com" / "fake-mig-state.json"
        )
        stand_in.add_process(GPU0.uuid, 4242)
        kernel.hold(GPU0.pci_bus_id, [4242])
        ref = claim(apiserver, "busy")
        error = prepare(p, ref)
        assert "\n" not in error and GPU0.pci_bus_id in error and "4242" in error, error
        stand_in.end_process(GPU0.uuid, 4242)  # NVML no longer sees it, the kernel still does
        error = prepare(p, ref)
        assert "\n" not in error and GPU0.pci_bus_id in error and "EBUSY" in error, error
        assert kernel.driver_of(GPU0.pci_bus_id) == "nvidia"
        assert (kernel.device(GPU0.pci_bus_id) / "driver_override").read_text().strip() == ""
        assert not prepared(p, ref) and list(p.cdi_root.glob(f"*{ref.uid}*")) == []
        kernel.release(GPU0.pci_bus_id)
        assert prepare(p, ref) == ""
        assert kernel.driver_of(GPU0.pci_bus_id) == "vfio-pci"
    finally:
        p.kill()


def test_sigkill_at_every_step_of_prepare_and_unprepare(
    short_dir: Path, apiserver: fakeserver.FakeApiServer, kernel: fakesysfs.FakeKernel
) -> None:
    kubeconfig = apiserver.write_kubeconfig(short_dir / "kubeconfig")
    ref = claim(apiserver, "vm-1")
    bdf = GPU0.pci_bus_id
    killed = 0
    for phase in ("prepare", "unprepare"):
        step = 0
        while True:
            p = plugin(short_dir, kubeconfig, kernel.root).start()
            p.wait_ready()
            if phase == "unprepare" and not prepared(p, ref):
                assert prepare(p, ref) == ""
            count, fired = [0], [False]
            pid = p.proc.pid if p.proc else 0

            def hook(
                when: str,
                attr: str,
                driver: str,
                word: str,
                step: int = step,
                pid: int = pid,
                count: list[int] = count,
                fired: list[bool] = fired,
            ) -> None:
                if count[0] == step:
                    os.kill(pid, signal.SIGKILL)
                    fired[0] = True
                count[0] += 1

            kernel.on_write = hook
            with contextlib.suppress(Exception):  # the call dies with the agent
                (prepare if phase == "prepare" else unprepare)(p, ref)
            kernel.on_write = None
            died = fired[0]
            p.kill()
            # Restart: recovery runs before the sockets appear.
            p = plugin(short_dir, kubeconfig, kernel.root).start()
            p.wait_ready()
            on_vfio = kernel.driver_of(bdf) == "vfio-pci"
            assert on_vfio == prepared(p, ref), (phase, step, kernel.events[-4:])
            if not on_vfio:
                assert (kernel.device(bdf) / "driver_override").read_text().strip() == ""
            assert unprepare(p, ref) == ""  # the kubelet's retry always succeeds
            assert kernel.driver_of(bdf) == "nvidia"
            p.kill()
            if not died:
                break
            killed += 1
            step += 1
        assert step >= 4, phase  # unbind and bind, each before and after the kernel acts
    assert killed >= 8
